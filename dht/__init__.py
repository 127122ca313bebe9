"""Discovery over libp2p Kademlia: public runs by ID, signed peer records, providers of runs and checkpoints,
and the directory of public runs (signed run cards under well-known provider keys).

    records      what is stored under which key, and when a value is valid (pure: no I/O, no clock)
    validator    those rules behind py-libp2p's `Validator` interface (registered on every node)
    kad_client   Kademlia requests over kept-open streams
    kademlia     `LocomeshKadDHT`: py-libp2p's `KadDHT` with early-stopping, hedged lookups
    discovery    `Discovery`: the API the node uses, plus bootstrap, refresh and republishing
"""
