"""NAT traversal: reachability (our own dial-back check), circuit relay v2, hole punching (DCUtR).

Modules, one job each:

* `addresses`: which addresses a decision may use (plain TCP, at the IP a peer was seen at);
* `connections`: the facts of a py-libp2p connection (direction, direct or relayed) as plain data;
* `reachability`: the sans-IO dial-back verdict (public / private / unknown) and a rate limiter;
* `reach_service`: `/locomesh/reach/1`, the dial-back protocol in its three roles;
* `relay_service`: a bounded circuit relay v2 for public nodes, relay reservations for private ones,
  relayed dials, and DCUtR hole punching over relayed connections;
* `services`: the two services a daemon runs, built from its configuration;
* `netns_lab`: a small internet of Linux network namespaces behind nftables NATs (tests, benchmarks).
"""
