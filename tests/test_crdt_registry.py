"""The op registry (crdt/ops/): one typed definition per op type, each with every part the CRDT asks
of it, and nothing about ops defined anywhere else."""

from __future__ import annotations

import pytest

from locomesh.crdt import Replica
from locomesh.crdt.evidence import REASONS, conflict
from locomesh.crdt.facts import Facts
from locomesh.crdt.limits import RULES
from locomesh.crdt.ops import OP_KINDS, REGISTRY, decode_op, encode_op
from locomesh.crdt.ops.base import OpType, Row
from locomesh.protocol.kinds import KINDS, MAX_SEALED_OP
from locomesh.protocol.schema import Spec

from .test_crdt_support import genesis, keys

ALICE, BOB = keys(2)
H = b"\x11" * 32


def test_every_op_type_has_all_of_its_parts():
    for name, entry in REGISTRY.items():
        assert isinstance(entry, OpType) and entry.name == name
        assert entry.doc and entry.doc[0].islower(), f"{name}: says what it states, in a sentence"
        assert entry.fields and all(isinstance(spec, Spec) for spec in entry.fields.values()), name
        assert entry.kind.name == f"crdt.{name}" and KINDS[entry.kind.name] is entry.kind
        assert 0 < entry.max_size and entry.max_size + 1024 <= MAX_SEALED_OP
        assert name in RULES and RULES[name] is entry.rule  # its rule (None: genesis writers only)
        assert isinstance(entry.row_spec, Row) and entry.columns[-len(entry.fields):] == tuple(entry.fields) \
            or entry.custom_row is not None, f"{name}: a row of its fields, or its own"
        for field in entry.refs + entry.sorted_lists:
            assert field in entry.fields, f"{name}: {field} is no field"
        if entry.equivocation is not None:
            assert set(entry.equivocation.key + entry.equivocation.statement) <= set(entry.fields), name
            assert f"double-{name}" in REASONS
        if entry.rule is not None:
            assert set(entry.rule.key) <= set(entry.fields), f"{name}: its rule counts by its own fields"


def test_the_registered_op_kinds_are_exactly_the_registry():
    assert {kind for kind in KINDS if kind.startswith("crdt.") and kind not in ("crdt.heads", "crdt.want", "crdt.ops")} \
        == OP_KINDS == {f"crdt.{name}" for name in REGISTRY}


@pytest.mark.parametrize("name", sorted(n for n, e in REGISTRY.items() if e.equivocation is not None))
def test_two_different_statements_at_one_place_are_evidence_and_the_same_one_twice_is_not(name):
    """Each type's equivocation key: one author, two ops of the type at one place that state
    different things convict it; the same statement under two seals convicts nobody."""
    entry = REGISTRY[name]
    run = genesis(ALICE).run_id
    fields = {field: _sample(spec) for field, spec in entry.fields.items()}
    other = dict(fields)
    changed = entry.equivocation.statement[0]
    other[changed] = _other(entry.fields[changed], fields[changed])
    a = decode_op(encode_op(ALICE, run, f"crdt.{name}", [], 1, **fields), run)
    b = decode_op(encode_op(ALICE, run, f"crdt.{name}", [], 2, **other), run)
    same = decode_op(encode_op(ALICE, run, f"crdt.{name}", [], 3, **fields), run)
    assert conflict(f"double-{name}", a, b)
    assert not conflict(f"double-{name}", a, same)


def test_facts_of_every_type_round_trip_through_a_snapshot_encoding():
    replica = Replica(genesis(ALICE))
    replica.create(ALICE, "join", round=1)
    replica.create(ALICE, "commit", round=1, hash=H, size=10)
    replica.create(ALICE, "prevote", round=1, epoch=0, attempt=0, value=H)
    replica.create(ALICE, "precommit", round=1, epoch=0, attempt=0, value=H, state=H)
    replica.create(ALICE, "recover", round=0, epoch=0, state=b"", lock=0, value=b"")
    replica.create(ALICE, "checkpoint", round=1, id=H, size=10)
    replica.create(ALICE, "admit", key=BOB.public_key)
    encoded = replica.facts.encode()
    assert Facts.decode(encoded).encode() == encoded
    assert Facts.decode(encoded).rows == replica.facts.rows


def _sample(spec: Spec):
    from locomesh.protocol.schema import Bytes, Int, List, Map, Str

    if isinstance(spec, Int):
        return max(spec.min, 1)
    if isinstance(spec, Bytes):
        return b"\x01" * max(spec.min_len, min(32, spec.max_len))
    if isinstance(spec, List):
        return [_sample(spec.item)] * max(1, spec.min_len) if spec.max_len else []
    if isinstance(spec, Map):
        return {"x": 1}
    if isinstance(spec, Str):
        return "x"
    raise AssertionError(f"no sample for {spec}")


def _other(spec: Spec, value):
    if isinstance(value, int):
        return value + 1
    if isinstance(value, bytes):
        return b"\x02" * len(value) if value else b"\x02" * 32
    if isinstance(value, list):
        return [_other(spec.item, value[0])] + value[1:]
    raise AssertionError(f"cannot change {value!r}")
