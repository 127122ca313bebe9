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

ADMISSIONS = ("open", "creator", "electorate")

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
                # Who may join (crdt/membership.py): "open" anyone, "creator" keys the creator
                # admitted, "electorate" keys more than two thirds of the electorate admitted.
                "admission": OneOf(frozenset(ADMISSIONS)),
                "admitted": List(_public_key, max_len=1024),  # admitted at genesis: a say from their join
                "earn_rounds": Int(1, 1000),  # counted rounds a fresh key needs for a say (open runs)
                "absent_rounds": Int(1, 1000),  # certified rounds without a member before it leaves the electorate
                "hparam_writers": List(_public_key, max_len=64),
                "public": Bool(),
                "created": Int(0, 2**63 - 1),
            },
        ),
        256 * KiB,
        run_scoped=False,
    )
)

# --- crdt: run-state ops and anti-entropy sync (added with the CRDT) ------------------------

# Every op is its own kind, `crdt.<type>`, registered by the op registry (crdt/ops/: a file per
# op type, its fields and their bounds). An op is its content (an unsigned envelope: v, kind, run,
# author, body) plus a seal: one signature over the Merkle root of a batch of up to MAX_SEAL_OPS
# ops, and the op's path to it (crdt/seal.py). The largest op on the wire is evidence, which
# carries two of the largest other ops; crdt/ops/ checks that it fits MAX_SEALED_OP.
MAX_PARENTS = 64
MAX_SEAL_OPS = 256
MAX_SEALED_OP = 128 * KiB
_parents = List(_hash, max_len=MAX_PARENTS)

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
