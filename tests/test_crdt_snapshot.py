"""Compaction: a quorum-certified snapshot plus the later ops is the same state as a full replay."""

from __future__ import annotations

import pytest

from locomesh.crdt import Facts, Replica, load_snapshot, op_id, snapshot_fields
from locomesh.protocol import ProtocolError, pack, unpack

from .test_crdt_support import CKPT, H2, certify, in_causal_order, joined_replica, keys

MEMBERS = keys(4)


def _history() -> tuple[Replica, bytes, list[bytes]]:
    """A run with a round, a checkpoint and 3 of 4 members signing one snapshot; more ops after."""
    replica = joined_replica(MEMBERS)
    certify(replica, MEMBERS)
    replica.create(MEMBERS[0], "checkpoint", round=1, id=CKPT, size=10)
    fields, facts_bytes = snapshot_fields(replica)
    certificate = [replica.create(member, "snapshot", **fields) for member in MEMBERS[:3]]
    assert replica.state.snapshot.ops == fields["ops"]
    certify(replica, MEMBERS, H2)
    replica.create(MEMBERS[1], "leave", round=2)
    return replica, facts_bytes, certificate


def test_snapshot_plus_later_ops_equals_full_replay():
    full, facts_bytes, certificate = _history()
    newcomer = load_snapshot(full.genesis, facts_bytes, certificate)
    covered = full.ancestry(list(newcomer.heads))
    later = [data for data in in_causal_order(full) if op_id(data) not in covered]
    for data in reversed(later):  # any order: the pending buffer sorts it out
        newcomer.add(data)
    assert newcomer.facts.encode() == full.facts.encode()
    assert newcomer.state == full.state and newcomer.state.round == 2
    assert newcomer.heads == full.heads


def test_a_snapshot_without_a_quorum_or_with_other_facts_is_refused():
    full, facts_bytes, certificate = _history()
    with pytest.raises(ProtocolError, match="not a quorum"):
        load_snapshot(full.genesis, facts_bytes, certificate[:2])
    with pytest.raises(ProtocolError, match="bad-snapshot"):
        load_snapshot(full.genesis, facts_bytes, certificate + certificate[:1])  # one signer twice
    tampered = joined_replica(MEMBERS)  # facts of another history under the same certificate
    with pytest.raises(ProtocolError, match="do not match"):
        load_snapshot(full.genesis, tampered.facts.encode(), certificate)
    with pytest.raises(ProtocolError):
        load_snapshot(full.genesis, facts_bytes[:-1], certificate)


def test_snapshot_facts_must_be_canonical_and_well_formed():
    full, facts_bytes, _certificate = _history()
    raw = unpack(facts_bytes, max_size=len(facts_bytes))
    assert Facts.decode(facts_bytes).encode() == facts_bytes
    raw["ops"] = list(reversed(raw["ops"]))  # same facts, another order: a second byte form
    with pytest.raises(ProtocolError, match="non-canonical"):
        Facts.decode(pack(raw))
    raw["ops"] = [["not", "a", "row"]]
    with pytest.raises(ProtocolError, match="bad-field"):
        Facts.decode(pack(raw))
