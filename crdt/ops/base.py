"""What an op type says about itself: one `OpType` per file of this package, in `REGISTRY`.

An entry holds everything the rest of the CRDT needs to know of one kind of op, each written once:

- `fields`: its body fields beyond `parents` and `seq`, each with its bound (protocol/schema.py);
  the kind `crdt.<name>` is registered with protocol/kinds.py from them, with `max_size`;
- `rule`: what one author may write of it (crdt/limits.py: members only, caps per key, bounds);
- how it folds into the facts (crdt/facts.py): its *row*, by default `(author, *fields)` in the
  order `fields` lists them (lists frozen to tuples), led by the op ID for a `referable` type
  (a type whose ops a round's value names by ID: crdt/value.py);
- `equivocation`: which row fields name the place of one statement (`key`) and which say what
  it states (`statement`): two rows by one author with the same key and different statements
  are an equivocation, a ban, and the pair is self-verifying evidence (crdt/evidence.py);
- `refs`: body fields listing op IDs that must be applied before the op is (its dependencies
  beyond its parents); `sorted_lists` and `paired`: what a schema cannot say about lists.

`tests/test_crdt_ops.py` checks that every entry has all of these parts and that the registered
kinds are exactly the registry's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from locomesh.protocol import ProtocolError
from locomesh.protocol.kinds import HASH_SIZE, MessageKind, register
from locomesh.protocol.schema import Bytes, Int, List, Spec, Struct

KiB = 1024
MAX_PARENTS = 64
MAX_OP_SIZE = 32 * KiB  # the largest op content but a proposal's and evidence's
MAX_ROUND = 2**40
MAX_EPOCH = 2**20
MAX_ATTEMPT = 4096  # attempts of one round in one epoch (timeouts grow with each: a few in practice)
MAX_SET = 512  # commits one round's value names (and payloads an aggregate takes)
MAX_LAST = 512  # precommits of the round before that a value names
MAX_CHANGES = 64  # joins, leaves, admissions and bans one value names

HASH = Bytes(HASH_SIZE, HASH_SIZE)
KEY = Bytes(32, 32)
ROUND = Int(0, MAX_ROUND)
LIVE_ROUND = Int(1, MAX_ROUND)  # a round that trains: 0 is the genesis state
EPOCH = Int(0, MAX_EPOCH)
ATTEMPT = Int(0, MAX_ATTEMPT)
NIL_OR_HASH = Bytes(0, HASH_SIZE)  # b"" for nil (a vote for no value), else a 32-byte ID or hash
PARENTS = List(HASH, max_len=MAX_PARENTS)


@dataclass(frozen=True)
class Rule:
    """What one author may write of one op type (crdt/limits.py, rule 2)."""

    cap: int  # ops of this type per author per key, along its own chain
    key: tuple[str, ...] = ("round",)  # body fields counted apart; () counts by the chain's newest round
    members_only: bool = True
    bounds: tuple[tuple[str, int], ...] = ()  # (body field, largest value allowed)
    not_author: str | None = None  # a body field that may not name the op's author


@dataclass(frozen=True)
class Equivocation:
    """Where one statement of an author sits (`key`: row fields) and what it states (`statement`)."""

    key: tuple[str, ...]
    statement: tuple[str, ...]


@dataclass(frozen=True)
class OpType:
    name: str
    doc: str  # what an op of this type says, in a sentence
    fields: dict[str, Spec]
    max_size: int
    rule: Rule | None  # None: written by the keys named at genesis only, and exempt from the limits
    equivocation: Equivocation | None = None
    referable: bool = False
    refs: tuple[str, ...] = ()
    sorted_lists: tuple[str, ...] = ()
    paired: tuple[tuple[str, str], ...] = ()
    # A row of another shape than the default (hparams, evidence): the row of an op (given the
    # author its evidence convicts, for evidence), and the spec a snapshot's rows are checked with.
    custom_row: Callable[[Any, bytes | None], tuple] | None = None
    custom_row_spec: Spec | None = None
    kind: MessageKind = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        body = Struct({"parents": PARENTS, "seq": Int(1, MAX_ROUND), **self.fields})
        object.__setattr__(self, "kind", register(MessageKind(f"crdt.{self.name}", body, self.max_size)))

    # --- rows ------------------------------------------------------------------------------------

    @property
    def columns(self) -> tuple[str, ...]:
        """The names of a default row's columns."""
        return (("id",) if self.referable else ()) + ("author", *self.fields)

    def row(self, op: Any, convicts: bytes | None = None) -> tuple:
        """The facts row of `op` (an `Op` of this type)."""
        if self.custom_row is not None:
            return self.custom_row(op, convicts)
        lead = (op.id, op.author) if self.referable else (op.author,)
        return lead + tuple(freeze(op.body[name]) for name in self.fields)

    @property
    def row_spec(self) -> Spec:
        if self.custom_row_spec is not None:
            return self.custom_row_spec
        lead = (HASH, KEY) if self.referable else (KEY,)
        return Row(lead + tuple(self.fields.values()))

    def place(self, row: tuple) -> tuple | None:
        """(type, author, key values) of the statement `row` makes; None for a type that makes none."""
        if self.equivocation is None:
            return None
        at = self._positions()
        return (self.name, row[at["author"]], *(row[at[name]] for name in self.equivocation.key))

    def statement(self, row: tuple) -> tuple:
        at = self._positions()
        return tuple(row[at[name]] for name in self.equivocation.statement)

    def column(self, row: tuple, name: str) -> Any:
        return row[self._positions()[name]]

    def _positions(self) -> dict[str, int]:
        return {name: index for index, name in enumerate(self.columns)}

    # --- checks beyond the schema ------------------------------------------------------------------

    def check_body(self, body: dict[str, Any]) -> None:
        """What the schema cannot say: ID lists sorted and distinct (one op, one encoding), paired
        lists of one length."""
        for name in self.sorted_lists:
            require_sorted(tuple(body[name]), name)
        for first, second in self.paired:
            if len(body[first]) != len(body[second]):
                raise ProtocolError("bad-op", f"a {self.name} op has as many {second} as {first}")

    def dependencies(self, body: dict[str, Any]) -> tuple[bytes, ...]:
        """The op IDs its body names that must be applied before it (beyond its parents)."""
        named: set[bytes] = set()
        for name in self.refs:
            named.update(body[name])
        return tuple(sorted(named))


@dataclass(frozen=True)
class Row(Spec):
    """A list of fixed length whose items each have their own spec (a facts row in a snapshot)."""

    columns: tuple[Spec, ...]

    def check(self, value: Any, path: str = "") -> None:
        if not isinstance(value, list) or len(value) != len(self.columns):
            raise ProtocolError("bad-field", f"{path}: expected a row of {len(self.columns)}")
        for index, (item, spec) in enumerate(zip(value, self.columns)):
            spec.check(item, f"{path}[{index}]")


def freeze(value: Any) -> Any:
    """A body value as a row holds it: lists as tuples (hashable)."""
    return tuple(value) if isinstance(value, list) else value


def thaw(value: Any) -> Any:
    """A row value as msgpack writes it: tuples as lists."""
    return list(value) if isinstance(value, tuple) else value


def require_sorted(ids: tuple[bytes, ...], name: str) -> None:
    # One op, one encoding: a list that could be reordered would give the same op two IDs.
    if ids != tuple(sorted(set(ids))):
        raise ProtocolError("bad-op", f"{name} must be sorted and distinct")
