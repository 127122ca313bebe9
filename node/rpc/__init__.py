"""The local RPC: JSON-RPC 2.0 over HTTP/1.1 on 127.0.0.1, cookie auth, `/metrics`.

Modules, one job each:

* `dispatch`: method registry, parameters, errors (`RpcError`) and the JSON-RPC envelope;
* `http11`: a sans-IO HTTP/1.1 request parser and response writer, capped;
* `server`: the trio server: connections, the Host check, the cookie, `/metrics`.
"""
