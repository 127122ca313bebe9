"""The local HTTP side: JSON-RPC 2.0 on 127.0.0.1, cookie auth, `/metrics`, and room for the dashboard.

Modules, one job each:

* `dispatch`: method registry, parameters, errors (`RpcError`) and the JSON-RPC envelope (no I/O);
* `app`: the Starlette app: the Host check, the cookie, body caps, the RPC and `/metrics` routes;
* `server`: Hypercorn's trio worker serving that app on a socket bound to 127.0.0.1.
"""
