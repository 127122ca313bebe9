"""The glossaries of the scenarios' reports: every term a report uses that a newcomer would not know.

Each scenario passes its own to `netsim.report.glossary`, which adds the terms all reports share.
"""

CONNECTIVITY = {
    "NAT types": "how a home router (NAT box) treats connections from outside. public: no NAT; full-cone: anyone "
                 "may connect to an address the box opened; restricted: only hosts the node contacted first; "
                 "port-restricted: only the same host and port it contacted; symmetric: a new outside port for "
                 "every destination, so an address seen by one peer is useless to another",
    "NAT box": "a simulated home router that translates addresses ('nat boxes': how many there are; up to 3 nodes "
               "share one, as machines of one home do)",
    "observed address": "the public address and port a node's NAT gave it, as the bootstrap node saw it: "
                        "what others dial",
    "bootstrap node": "a public node every newcomer contacts first; here it tells the newcomer its outside "
                      "address and the addresses of earlier joiners (peer exchange)",
    "flood": "the simplest broadcast: every node forwards each new message to all its neighbours",
    "flood degree": "a node's number of flood neighbours: the nodes it has a connection to and exchanges messages "
                    "with; 'flood degree mean' is the average over the nodes",
    "nodes without flood neighbours": "nodes left with no connection at all, so no message reaches them",
    "flood mesh components": "groups of nodes connected to each other through neighbours, directly or via others; "
                             "1 means the whole network is one mesh (a node with no neighbours is a group of one)",
    "connection attempts (all, incl. libp2p's own)": "every dial in the simulation: the scenario's own, to bootstrap "
                                                     "nodes, and the networking library's",
    "delivery ratio": "deliveries made over messages x live nodes: 1.0 means every node got every message",
    "hops": "how many forwards a message took to reach a node",
    "duplicates": "copies of a message a node received after the first (the cost of flooding)",
    "queue drops": "messages dropped because a neighbour's send queue was full",
}

DHT = {
    "DHT": "distributed hash table: a directory spread over all nodes, with no server; each entry is kept by "
           "the few nodes whose IDs are closest to its key (Kademlia)",
    "seed nodes": "the nodes every newcomer contacts first to find its place in the DHT",
    "churn": "nodes coming and going; 'churning nodes' crash now and then and come back with an empty memory, "
             "or join only during the lookups",
    "run published": "a training run's signed description (its manifest) stored in the DHT under the run's key, "
                     "with a provider record naming the publisher",
    "value lookup": "a search for a stored entry (here: a run's manifest, checked against its signature and ID)",
    "provider lookup": "a search for the nodes that announced they hold something (here: the run's publisher)",
    "bootstrap failures": "nodes that could reach no seed node to join the DHT",
    "crashed nodes that never stopped": "crashed nodes whose networking did not shut down in time; they stay down",
    "lookups skipped": "planned lookups for which no node was online, joined and idle at that moment",
    "looker: stable, churner": "the node that made the lookup: one that stays online, or one that comes and goes",
    "success rate": "lookups that found what they looked for, over the lookups made",
    "latency": "virtual seconds from a lookup's start to its answer (successful lookups only); 0 when the node "
               "already held the answer",
    "requests": "DHT requests the looking node sent to other nodes during one lookup",
    "routing table": "the peers a node knows and keeps in its DHT table",
    "not found, timeout": "why a lookup failed: the search ended without the entry, or no answer came within 20 s",
}

CHECKPOINT = {
    "checkpoint": "a saved model (its weights), cut into chunks and named by the hash of its manifest, so a "
                  "download can check every chunk it receives",
    "seeder": "the first node holding the checkpoint",
    "joiner": "a node that starts later and needs the checkpoint; once it has it, it serves it to others",
    "provider": "a node that announced in the DHT that it holds the checkpoint and serves it",
    "DHT": "distributed hash table: the directory, spread over the nodes, where joiners find providers",
    "uplink": "a node's upload capacity; a provider's uplink limits how fast others fetch from it",
    "chunks from seeder": "how many chunks joiners fetched from the seeder rather than from other joiners: the "
                          "lower, the more the swarm spread the load",
    "k providers": "part 2 downloads the same checkpoint from 1, 2, ... k providers at once, to see what each "
                   "added provider is worth",
    "speedup": "the download rate from k providers over the rate from one; 'speedup / k' is the share of the "
               "ideal (k times one provider's rate) reached. bench/netsim_checkpoint.py holds a target of "
               "speedup / k >= 0.8 (there: 64 MiB in 1 MiB chunks); the verdict here asks only that each added "
               "provider made the download faster",
    "MB/s": "megabytes (10^6 bytes) per virtual second",
}

TRAIN = {
    "round": "one cycle of DiLoCo training: every node trains on its own for a while, then all exchange their "
             "updates (payloads) and combine them into the next shared model",
    "inner steps": "the training steps a node takes on its own in a round; here modelled as time, not computed",
    "payload": "a node's update for a round, committed to by its hash before anyone reveals theirs",
    "certified": "a round is certified when a quorum of members signed the same hash of the new shared model; "
                 "only then does a node adopt it",
    "certified set": "the payloads the round agreed to combine; invalid ones (junk) are then left out",
    "contributors": "how many payloads the nodes that computed the round themselves combined",
    "splits (synced)": "nodes that did not compute a round's model themselves but downloaded the certified one "
                       "from peers (a sync): they joined late, restarted, or had combined a different set of "
                       "payloads than the one certified",
    "synced": "per node: rounds it caught up on by downloading the certified model (see splits)",
    "compute share": "the share of a node's time spent training, from its first training to the last round; "
                     "the rest is waiting on the exchange. The summary's target (0.9, 0.95 with delayed updates) "
                     "is the benchmark's (bench/netsim_train.py) and not part of the verdict",
    "compute s": "all modelled training time of a node, rounds thrown away included",
    "held KiB": "what a node keeps of the run that peers sent or made it keep: shared-state operations, "
                "checkpoint files, payloads in memory (bounded, so hostile peers cannot fill a node)",
    "kind": "honest; slow (trains slower); joiner (came in during churn); restarter (killed and restarted); "
            "hostile: byzantine (junk updates), withholding (commits, never serves); extra hostile keys: sybil, "
            "bomber, spammer (see `sim --help`)",
    "stands for": "what the modelled sizes and times correspond to in a real run",
    "live nodes": "nodes running at the end (crashed ones excluded)",
}
