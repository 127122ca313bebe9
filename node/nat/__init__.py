"""NAT traversal: reachability (our own dial-back check), circuit relay v2, hole punching (DCUtR), port mapping.

Modules, one job each:

* `reachability`: the sans-IO dial-back verdict (public / private / unknown) and a rate limiter;
* `reach_service`: `/locomesh/reach/1`, the dial-back protocol in its three roles;
* `relay_service`: a bounded circuit relay v2 for public nodes, relay reservations for private ones,
  relayed dials, and DCUtR hole punching over relayed connections;
* `relay_plan`: what a relay gives away (`RelayBounds`) and which relays to reserve on, pure;
* `hole_punch`: py-libp2p's DCUtR told our observed mappings, one initiator per pair, punches at once;
* `link_keeper`: which lost links to dial again, when (sans-IO backoff);
* `natpmp`: NAT-PMP (RFC 6886) messages, sans-IO, and a UDP client for the gateway;
* `upnp`: UPnP IGD (SSDP search, description XML, SOAP port mapping), sans-IO, and its client;
* `http_client`: the small HTTP/1.1 client UPnP needs (sans-IO response parser, capped);
* `mapping_errors`: `MappingError`, the one typed error of the three above;
* `port_mapping`: the service that maps our port while we are private, renews and removes it;
* `services`: the three services a daemon runs, built from its configuration.

Three pieces the host itself needs live in node's core: `node/addresses.py` (which addresses a
decision may use: plain TCP, at the IP a peer was seen at), `node/listen_port.py` (TCP dialling from the
listen port, never to our own listen endpoints) and `node/connections.py` (the facts of a
py-libp2p connection: direction, direct or relayed).

The network-namespace lab the NAT tests and benchmarks use is test plumbing: tests/netns_lab.py.
"""
