"""locomesh.netsim: the real node code over a simulated network, in virtual time.

Modules, from the bottom up:

* `links`: when bytes arrive (latency, jitter, loss as retransmission delay,
  link bandwidth, per-node upload/download capacity); pure arithmetic.
* `pipe`: a connection's two bounded one-way pipes (back-pressure, EOF,
  reset) and `SimStream`, the socket py-libp2p sees.
* `nat`: NAT boxes as tables (mapping x filtering x port allocation), sans-IO.
* `addressing`: address realms (the internet, each box's inside; boxes
  behind boxes: a CGNAT) and the routing rule through them, sans-IO.
* `nat_model`: the pair questions (`reachable`, `hole_punch_succeeds`,
  `best_path`), replayed on fresh boxes for any chain of boxes.
* `network`: the nodes, boxes and address plan, liveness, partitions,
  crashes, TCP simultaneous open, and the log of every dial.
* `transport`: `SimTransport`, py-libp2p's `ITransport` over the network.
* `node`: `SimNode`, a host built by `locomesh.node.host.build_host` with a
  `SimTransport`; services, Byzantine hooks, crash.
* `simulation`: `Simulation` and `run_simulation` (MockClock, seeded,
  deterministic scheduling); `libp2p_time` points py-libp2p's clock reads
  at virtual time, `libp2p_chores` spaces out its periodic pings; `clock`
  is the clock locomesh code reads; `collector` keeps garbage collection
  from walking a large run's heap over and over; `offload`: `run_inline`, how
  a simulated node runs its blocking store work (inline, not in a thread).
* `faults`: timed actions, churn, slow nodes.
* `pex`, `flood`: the small protocols the scenarios use (peer exchange off
  bootstrap nodes; flooding broadcast); `wire`: their frame checks.
* `report`: JSON and markdown; `scenarios`: the scenarios (`locomesh sim`).
"""
