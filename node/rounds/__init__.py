"""Training together: the round protocol of a run, and the service that takes part in runs.

Modules, one job each:

* `events`: the round machine's vocabulary (phases, the events fed in, the actions returned);
* `machine`: one peer's round protocol, a sans-IO state machine (the theory of operation is there);
  `replay` holds its handlers for replaying a round certified without us, `state` what it records,
  `orders` who proposes and stewards;
* `work`: what a peer keeps about the round it works on and the rounds it finished;
* `history`: the finished rounds kept in the data dir (they outlive `run leave` and a restart);
* `outcome`: what became of this node's part in a finished round (counted, not counted and why,
  sat out, synced only);
* `status`: what the round under way waits for and on whom, and the members by peer ID;
* `participation`: the trio layer that carries out the machine's actions for one run;
* `service`: `run.join` / `run.leave` / `run.status`, one participation per joined run;
  `meeting` finds and connects a run's participants as a node joins, `pauses` remembers
  `run pause` (a paused participation sits rounds out and keeps its state current);
* `audit`: `locomesh run audit`: replay certified rounds from the record and check each certificate.
"""
