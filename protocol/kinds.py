"""The registry of message kinds: each has a name, a body schema and a size cap.

A kind is the unit a decoder dispatches on. The size cap bounds the whole
encoded envelope, so a peer cannot make us parse a body larger than the kind
can ever legitimately be. `run_scoped` kinds carry the 32-byte run ID they
belong to; the others carry an empty `run`.

Each domain adds its kinds in its own section below, next to nothing else: the
registry is the one place that lists every message locomesh can receive.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import ProtocolError
from .schema import Bool, Bytes, Float, Int, List, Map, OneOf, Scalar, Str, Struct

KiB, MiB = 1024, 1024 * 1024
RUN_ID_SIZE = 32
HASH_SIZE = 32


@dataclass(frozen=True)
class MessageKind:
    name: str
    body: Struct
    max_size: int
    run_scoped: bool = True


KINDS: dict[str, MessageKind] = {}


def register(kind: MessageKind) -> MessageKind:
    """Add `kind` to the registry; a name is registered once."""
    if kind.name in KINDS:
        raise ValueError(f"message kind {kind.name!r} is registered twice")
    KINDS[kind.name] = kind
    return kind


def lookup(name: str) -> MessageKind:
    try:
        return KINDS[name]
    except KeyError:
        raise ProtocolError("unknown-kind", f"no message kind named {name[:64]!r}") from None


def max_envelope_size() -> int:
    return max(kind.max_size for kind in KINDS.values())


_hash = Bytes(HASH_SIZE, HASH_SIZE)
_public_key = Bytes(32, 32)

# --- node: liveness and peer records -------------------------------------------------------

PING = register(MessageKind("node.ping", Struct({"nonce": Bytes(8, 64)}), 512, run_scoped=False))

PEER_RECORD = register(
    MessageKind(
        "peer.record",
        Struct(
            {
                "addrs": List(Str(1, 512), max_len=64),
                "relay_addrs": List(Str(1, 512), max_len=16),
                "seq": Int(0, 2**63 - 1),
                "expires": Int(0, 2**63 - 1),
            }
        ),
        32 * KiB,
        run_scoped=False,
    )
)

# --- runs: the directory of public runs (a keeper's signed cards: dht/records.py) ----------

# One peer's record under /locomesh/cards/<peer id>: a card for each public run it keeps (a few
# members of each run do: node/runs/cards.py). Everything but the run ID is the keeper's claim;
# a browser checks the static fields against the run's manifest and takes medians over keepers.
MAX_CARDS = 16
RUN_CARD = Struct(
    {
        "run": Bytes(RUN_ID_SIZE, RUN_ID_SIZE),
        "task": Str(1, 128),
        "name": Str(0, 128),
        "dataset": Str(0, 128),  # the task config's dataset ID; "" for a task with built-in data
        "params": Int(0, 2**50),
        "memory": Int(0, 2**60),  # bytes a member needs (training/footprint.py)
        "upload": Int(0, 2**60),  # bytes a member sends a round (its payload)
        "download": Int(0, 2**60),  # bytes a member fetches a round (the others' payloads)
        "inner_steps": Int(1, 2**32),
        "round_deadline_s": Float(0.0, 1e7),
        "members": Int(0, 2**32),
        "rounds": Int(0, 2**40),
        "created": Int(0, 2**63 - 1),
    }
)
RUN_CARDS = register(
    MessageKind(
        "run.cards",
        Struct(
            {
                "cards": List(RUN_CARD, max_len=MAX_CARDS),
                "seq": Int(0, 2**63 - 1),
                "updated": Int(0, 2**63 - 1),
                "expires": Int(0, 2**63 - 1),
            }
        ),
        32 * KiB,  # MAX_CARDS cards with every string at its longest fit
        run_scoped=False,
    )
)

# --- runs: the signed genesis manifest (its hash is the run ID) ----------------------------

RUN_MANIFEST = register(
    MessageKind(
        "run.manifest",
        Struct(
            {
                "name": Str(0, 128),
                "task": Str(1, 128),
                "task_config": Map(Scalar(1024), max_len=64),
                "seed": Int(0, 2**63 - 1),
                "hparams": Map(Scalar(), max_len=64),
                "admission": OneOf(frozenset({"open", "allowlist"})),
                # "earned" (the default): a member weighs in quorums only once a round accepted
                # its contribution; "joined": from its join (crdt/electorate.py).
                "influence": OneOf(frozenset({"earned", "joined"})),
                "allowlist": List(_public_key, max_len=1024),
                "hparam_writers": List(_public_key, max_len=64),
                "public": Bool(),
                "created": Int(0, 2**63 - 1),
            },
            optional=frozenset({"influence"}),
        ),
        256 * KiB,
        run_scoped=False,
    )
)

# --- crdt: run-state ops and anti-entropy sync (added with the CRDT) ------------------------

# Every op is its own kind, so each op type has its own body schema and size cap. All op bodies
# share `parents` (the author's heads when it wrote the op; sorted, distinct) and `seq` (one more
# than the author's own newest op among the parents). An op is its content (an unsigned envelope:
# v, kind, run, author, body; the cap bounds it) plus a seal: one signature over the Merkle root of
# a batch of up to MAX_SEAL_OPS ops, and the op's path to it (crdt/seal.py), at most SEAL_OVERHEAD
# bytes more. The op ID is SHA-256 of the content.
MAX_PARENTS = 64
MAX_SEAL_OPS = 256
SEAL_OVERHEAD = 1 * KiB  # signature, index, count and 8 sibling hashes, with msgpack framing: < 400 bytes
MAX_OP_SIZE = 32 * KiB  # the largest op content that is not evidence; evidence carries two sealed ops
_parents = List(_hash, max_len=MAX_PARENTS)
_round = Int(0, 2**40)


def _op_kind(name: str, fields: dict, max_size: int, optional: frozenset[str] = frozenset()) -> MessageKind:
    body = Struct({"parents": _parents, "seq": Int(1, 2**40), **fields}, optional=optional)
    return register(MessageKind(f"crdt.{name}", body, max_size))


CRDT_JOIN = _op_kind("join", {"round": _round}, 4 * KiB)
CRDT_LEAVE = _op_kind("leave", {"round": _round}, 4 * KiB)
# A vote for the new state's hash in one attempt of a round; `proposer` names whose proposal the
# voter aggregated (the certificate's voters thereby say which contributions the round accepted:
# crdt/electorate.py). One vote per (round, attempt): a member whose vote died with a split
# attempt votes again in the next one. No `attempt`: attempt 0.
CRDT_VOTE = _op_kind(
    "vote", {"round": Int(1, 2**40), "hash": _hash, "proposer": _public_key, "attempt": Int(0, 63)}, 4 * KiB,
    optional=frozenset({"proposer", "attempt"}),
)
# A member's word that attempt `attempt` of round `round` passed the run's round deadline on its
# clock without a certificate (crdt/electorate.py: attempts). Attempts are few: MAX_ATTEMPTS.
CRDT_TIMEOUT = _op_kind("timeout", {"round": Int(1, 2**40), "attempt": Int(0, 63)}, 4 * KiB)
# An author's commitment to its encoded pseudo-gradient for a round: the payload's checkpoint ID (SHA-256
# of its manifest, training/checkpoint_manifest.py), which names every chunk's hash, and its length.
MAX_PAYLOAD_SIZE = 2**31
CRDT_COMMIT = _op_kind("commit", {"round": Int(1, 2**40), "hash": _hash, "size": Int(1, MAX_PAYLOAD_SIZE)}, 4 * KiB)
# The round's proposer names the commitments everyone aggregates (node/rounds/machine.py).
MAX_PROPOSAL = 512
CRDT_PROPOSE = _op_kind(
    "propose", {"round": Int(1, 2**40), "authors": List(_public_key, max_len=MAX_PROPOSAL, min_len=1)}, MAX_OP_SIZE
)
# A scoring committee member's measurement of round `round`'s accepted contributions
# (crdt/scores.py): `authors` sorted and distinct, `scores[i]` the score of `authors[i]` in
# SCORE_UNIT units (fixed point: one encoding per value, and bounded), at most a round's set.
SCORE_UNIT = 1_000_000  # one unit = 1e-6 of a loss (nats)
MAX_SCORE = 1_000_000_000  # |score| <= 1000: a loss change beyond that is clipped by the measurer
CRDT_SCORE = _op_kind(
    "score",
    {
        "round": Int(1, 2**40),
        "authors": List(_public_key, max_len=MAX_PROPOSAL, min_len=1),
        "scores": List(Int(-MAX_SCORE, MAX_SCORE), max_len=MAX_PROPOSAL, min_len=1),
    },
    MAX_OP_SIZE,
)
# Sharded exchange (node/exchange/sharded_machine.py): a shard committee member's signed hash of
# its (bit-exact) aggregate of shard `shard` of round `round` over the contributor set `set`; and
# a member's word that its own exact recomputation of that shard differs from `hash`, which
# `member` signed as its result (crdt/view.py: disputes from more than a third of the round's
# electorate ban the signer). `set` names the contributor set (node/exchange/sharded.py:
# `set_id`): one round may aggregate several (a new attempt, a proposal given up for another), and
# an honest member signs one result per set, so a result is one statement only within its set.
MAX_SHARDS = 4096
_shard = Int(0, MAX_SHARDS - 1)
CRDT_SHARD_RESULT = _op_kind(
    "shard_result", {"round": Int(1, 2**40), "set": _hash, "shard": _shard, "hash": _hash}, 4 * KiB
)
CRDT_DISPUTE = _op_kind(
    "dispute", {"round": Int(1, 2**40), "set": _hash, "shard": _shard, "member": _public_key, "hash": _hash}, 4 * KiB
)
_checkpoint = {"id": _hash, "round": _round, "size": Int(0, 2**50)}
CRDT_CHECKPOINT = _op_kind("checkpoint", _checkpoint, 4 * KiB)
CRDT_ATTEST = _op_kind("attest", _checkpoint, 4 * KiB)
CRDT_HPARAMS = _op_kind("hparams", {"round": _round, "changes": Map(Scalar(), max_len=64)}, MAX_OP_SIZE)
CRDT_SNAPSHOT = _op_kind(
    "snapshot", {"state": _hash, "frontier": List(_hash, max_len=MAX_PARENTS, min_len=1), "ops": Int(1, 2**40)}, 8 * KiB
)
CRDT_EVIDENCE = _op_kind(
    "evidence",
    {
        "reason": OneOf(frozenset({"fork", "double-vote", "double-commit", "double-propose", "double-score",
                                   "double-result"})),
        "a": Bytes(1, MAX_OP_SIZE + SEAL_OVERHEAD),
        "b": Bytes(1, MAX_OP_SIZE + SEAL_OVERHEAD),
    },
    2 * (MAX_OP_SIZE + SEAL_OVERHEAD) + 4 * KiB,
)
_op_kinds = (CRDT_JOIN, CRDT_LEAVE, CRDT_VOTE, CRDT_TIMEOUT, CRDT_COMMIT, CRDT_PROPOSE, CRDT_CHECKPOINT, CRDT_ATTEST,
             CRDT_HPARAMS, CRDT_SNAPSHOT, CRDT_EVIDENCE, CRDT_SCORE, CRDT_SHARD_RESULT, CRDT_DISPUTE)
CRDT_OP_KINDS = frozenset(kind.name for kind in _op_kinds)
MAX_SEALED_OP = CRDT_EVIDENCE.max_size + SEAL_OVERHEAD  # the largest op on the wire

# Anti-entropy: exchange heads, ask for what is missing, answer with ops in bounded batches.
MAX_WANT = 256
MAX_BATCH_OPS = 256
CRDT_HEADS = register(MessageKind("crdt.heads", Struct({"heads": _parents, "reply": Bool()}), 4 * KiB))
CRDT_WANT = register(
    MessageKind("crdt.want", Struct({"ids": List(_hash, max_len=MAX_WANT, min_len=1), "have": _parents}), 16 * KiB)
)
CRDT_OPS = register(
    MessageKind(
        "crdt.ops",
        Struct({"ops": List(Bytes(1, MAX_SEALED_OP), max_len=MAX_BATCH_OPS), "more": Bool()}),
        4 * MiB,
    )
)

# --- rounds: commitments and pseudo-gradient payloads (added with round exchange) -----------

# --- checkpoints: manifests and chunk transfer (added with checkpoint serving) ---------------

# A stream of `/locomesh/ckpt/1` carries requests answered in order. A request names a checkpoint
# (its ID) and, for a chunk, its index; the answer says ok / busy / not-found and how many raw bytes
# follow in the next frame (the manifest or the chunk, checked by the asker against its hash).
MAX_CKPT_CHUNKS = 65536  # = checkpoint_manifest.MAX_CHUNKS
MAX_CKPT_PAYLOAD = 128 * MiB  # a compressed chunk (<= 2 x 64 MiB) or a manifest (<= 8 MiB)
CKPT_GET_MANIFEST = register(MessageKind("ckpt.get-manifest", Struct({"id": _hash}), 512, run_scoped=False))
CKPT_GET_CHUNK = register(
    MessageKind("ckpt.get-chunk", Struct({"id": _hash, "index": Int(0, MAX_CKPT_CHUNKS - 1)}), 512, run_scoped=False)
)
CKPT_REPLY = register(
    MessageKind(
        "ckpt.reply",
        Struct({"status": OneOf(frozenset({"ok", "busy", "not-found"})), "size": Int(0, MAX_CKPT_PAYLOAD)}),
        512,
        run_scoped=False,
    )
)
CKPT_REQUEST_KINDS = frozenset({CKPT_GET_MANIFEST.name, CKPT_GET_CHUNK.name})
# The data plane handshake (inside a Noise-secured libp2p stream): each side's ephemeral X25519 key;
# the provider adds the TCP port of its data plane (0: it has none).
CKPT_DATAPLANE_HELLO = register(
    MessageKind("ckpt.dataplane-hello", Struct({"key": _public_key}), 512, run_scoped=False)
)
CKPT_DATAPLANE_OFFER = register(
    MessageKind("ckpt.dataplane-offer", Struct({"key": _public_key, "port": Int(0, 65535)}), 512, run_scoped=False)
)

# --- reach: our own dial-back reachability check (added with NAT traversal) ----------------

# `/locomesh/reach/1`: A asks a connected helper B to have its addresses dialled back (request);
# B names A to a peer C of its own that may not be connected to A (delegate); C dials A on a fresh
# connection and proves it with A's nonce (dialback); C tells B and B tells A how it went (result).
REACH_MAX_ADDRS = 8
_reach_nonce = Bytes(16, 16)
_reach_addrs = List(Str(1, 512), max_len=REACH_MAX_ADDRS)
REACH_OUTCOMES = frozenset({"dialed", "unreachable", "no-address", "no-dialer", "busy"})
REACH_REQUEST = register(
    MessageKind("reach.request", Struct({"nonce": _reach_nonce, "addrs": _reach_addrs}), 8 * KiB, run_scoped=False)
)
REACH_DELEGATE = register(
    MessageKind(
        "reach.delegate",
        Struct({"nonce": _reach_nonce, "target": Str(1, 128), "addrs": _reach_addrs}),
        8 * KiB,
        run_scoped=False,
    )
)
REACH_DIALBACK = register(
    MessageKind("reach.dialback", Struct({"nonce": _reach_nonce, "addr": Str(1, 512)}), 2 * KiB, run_scoped=False)
)
REACH_RESULT = register(
    MessageKind(
        "reach.result",
        Struct({"nonce": _reach_nonce, "outcome": OneOf(REACH_OUTCOMES), "addr": Str(0, 512), "dialer": Str(0, 128)}),
        2 * KiB,
        run_scoped=False,
    )
)
