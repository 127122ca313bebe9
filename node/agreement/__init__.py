"""The agreement of each round: Tendermint over the run's CRDT (a room of its own, sans-IO).

* `tendermint`: one member's part in one round's agreement, a state machine with the paper's
  algorithm in its docstring, line for line;
* `log`: a round's messages (proposal, prevote, precommit ops) read out of a replica, counted as
  the machine's rules ask;
* `recovery`: when a member signs a `recover` (more than a third of the electorate gone at once),
  and what it carries.

It imports only `locomesh.crdt` and `locomesh.protocol`; node/rounds/ drives it beside training and
the exchange (tests/test_import_floors.py holds it).
"""
