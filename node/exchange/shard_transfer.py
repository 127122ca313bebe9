"""Sharded exchange on the wire: serving and fetching a round's shards and shard results.

`/locomesh/shard/1` carries one request per stream, in the frames of `locomesh.node.streams`
(a 4-byte length, then that many bytes; every read bounded and timed)::

    asker                                                          holder
      | -- frame: {what: "input", run, round, author, index}  or             |
      |           {what: "result", run, round, index}  or                     |
      |           {what: "held", run, round, index, authors}  (canonical msgpack) -> |
      | <-- frame: {status, size, proof}  (canonical msgpack) -------------- |
      | <-- frame: `size` raw bytes (only when status is "ok") ------------- |

Answers: ``ok`` (the bytes follow; for an input, `proof` is the shard's audit path), ``missing``
(nothing held for it here), ``busy`` (no upload slot free: ask again later or elsewhere) and
``refused`` (a request that is not one: malformed, a field out of bounds, an index past the
payload's shard count). A ``held`` request asks which of `authors` (at most `MAX_HELD_AUTHORS`)
have shard `index` held here; its ``ok`` bytes are a bitmap, bit i (of byte i // 8, lowest bit
first) for authors[i]: the asker learns that a payload would outlive its author
(`availability.py`) without fetching it. Nothing is signed: the stream is Noise-authenticated, and what is served
is checked by the asker against what its author committed to (the Merkle root of the payload, the
signed hash of a result), which no server's signature could strengthen.

The holder (`ShardService`) reads at most `MAX_REQUEST_SIZE` bytes, refuses a bad request before
any work and charges it to the asker (`Node.scores`, the node's protocol error count), and writes an
``ok`` answer holding one of the node's upload slots (`UploadSlots`), within `write_deadline` of its
size, or resets the stream. The asker (`fetch_input`, `fetch_result`) checks the announced size
against what it can accept before it reads the bytes, and an input shard against the root before it
returns it; a holder that breaks the protocol is struck in `Node.scores`.

What a node serves is in `ShardHoldings`: its own payloads, the shards it fetched (with their audit
paths) and the shard results it computed or fetched, for the rounds under way, until
`release_before` lets them go.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from libp2p.io.exceptions import IOException

from locomesh.node.runtime import DialError
from locomesh.node.streams import close_quietly, read_frame, reset_quietly, write_frame
from locomesh.node.transfer.slots import UploadSlots, write_deadline
from locomesh.node.transfer.wire import remote_peer
from locomesh.protocol import ProtocolError, pack, unpack
from locomesh.protocol import merkle
from locomesh.protocol.schema import Bytes, Int, List, OneOf, Struct
from locomesh.training.shards import ShardedPayload

logger = logging.getLogger(__name__)

SHARD_PROTOCOL = "/locomesh/shard/1"
OK, MISSING, BUSY, REFUSED = "ok", "missing", "busy", "refused"
INPUT, RESULT, HELD = "input", "result", "held"

KEY_SIZE = 32  # a run ID and an author's public key
MAX_ROUND = 2**40
MAX_SHARD_SIZE = 2**31  # bytes of one shard or one result at most (the commit op's payload cap)
MAX_HELD_AUTHORS = 256  # authors named in one held request (ask more in several)
MAX_REQUEST_SIZE = 2 * (128 + MAX_HELD_AUTHORS * (KEY_SIZE + 2))  # twice the largest (a full held request's)
MAX_HEADER_SIZE = 2048  # an answer's header, a full audit path (MAX_PATH hashes) included, with room
REQUEST_TIMEOUT = 10.0  # the asker must send its request within this, once the stream is open
HEADER_TIMEOUT = 10.0  # a header without bytes (busy, missing, refused) must be written within this
FETCH_TIMEOUT = 60.0

_hash = Bytes(merkle.HASH_SIZE, merkle.HASH_SIZE)
_key = Bytes(KEY_SIZE, KEY_SIZE)
_common = {"what": OneOf(frozenset({INPUT, RESULT, HELD})), "run": _key, "round": Int(0, MAX_ROUND),
           "index": Int(0, merkle.MAX_LEAVES - 1)}
INPUT_REQUEST = Struct({**_common, "author": _key})
RESULT_REQUEST = Struct(_common)
HELD_REQUEST = Struct({**_common, "authors": List(_key, max_len=MAX_HELD_AUTHORS)})
_REQUESTS = {INPUT: INPUT_REQUEST, RESULT: RESULT_REQUEST, HELD: HELD_REQUEST}
ANSWER = Struct({"status": OneOf(frozenset({OK, MISSING, BUSY, REFUSED})), "size": Int(0, MAX_SHARD_SIZE),
                 "proof": List(_hash, max_len=merkle.MAX_PATH)})

# Failures of the stream itself (the peer reset it, the connection dropped), as node.streams counts them.
_STREAM_FAILURES = (IOException, EOFError, trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)


# --- what a node serves ----------------------------------------------------------------------


@dataclass
class _Round:
    """What is held for one (run, round)."""

    payloads: dict[bytes, ShardedPayload] = field(default_factory=dict)  # by author: whole payloads
    shards: dict[tuple[bytes, int], tuple[bytes, list[bytes]]] = field(default_factory=dict)  # (author, index)
    proofs: dict[tuple[bytes, int], list[bytes]] = field(default_factory=dict)  # of `payloads`, made when asked
    results: dict[int, bytes] = field(default_factory=dict)  # by shard index

    def nbytes(self) -> int:
        return (sum(payload.nbytes for payload in self.payloads.values())
                + sum(len(shard) for shard, _ in self.shards.values())
                + sum(len(values) for values in self.results.values()))


class ShardHoldings:
    """What this node serves: shards of payloads (its own and those it fetched, each with its audit
    path) and shard results it computed or fetched, per (run, round); released by round.

    Holds only what it is given (the round's own work bounds it); nothing here checks a shard
    against its root: what is held was made here or checked when it was fetched."""

    def __init__(self) -> None:
        self._rounds: dict[tuple[bytes, int], _Round] = {}

    def hold_payload(self, run: bytes, round_: int, author: bytes, payload: ShardedPayload) -> None:
        """Serve every shard of `author`'s `payload` (its audit paths are made when first asked for)."""
        held = self._round(run, round_)
        held.payloads[_key_of(author)] = payload
        held.proofs = {key: proof for key, proof in held.proofs.items() if key[0] != author}

    def hold_shard(self, run: bytes, round_: int, author: bytes, index: int, shard: bytes, proof: list[bytes]) -> None:
        """Serve shard `index` of `author`'s payload, with its audit path `proof`."""
        _check_index(index)
        self._round(run, round_).shards[(_key_of(author), index)] = (bytes(shard), list(proof))

    def hold_result(self, run: bytes, round_: int, index: int, values: bytes) -> None:
        """Serve `values` as shard `index`'s result."""
        _check_index(index)
        self._round(run, round_).results[index] = bytes(values)

    def input(self, run: bytes, round_: int, author: bytes, index: int) -> tuple[bytes, list[bytes]] | None:
        """Shard `index` of `author`'s payload and its audit path, or None when it is not held."""
        held = self._rounds.get((run, round_))
        if held is None:
            return None
        payload = held.payloads.get(author)
        if payload is not None and 0 <= index < len(payload.shards):
            proof = held.proofs.get((author, index))
            if proof is None:
                proof = held.proofs[(author, index)] = payload.proof(index)
            return payload.shards[index], proof
        return held.shards.get((author, index))

    def result(self, run: bytes, round_: int, index: int) -> bytes | None:
        """The values held for shard `index`'s result, or None."""
        held = self._rounds.get((run, round_))
        return None if held is None else held.results.get(index)

    def shard_count(self, run: bytes, round_: int, author: bytes) -> int | None:
        """How many shards `author`'s payload has, when its whole payload is held here; else None."""
        held = self._rounds.get((run, round_))
        payload = None if held is None else held.payloads.get(author)
        return None if payload is None else len(payload.shards)

    def release_before(self, run: bytes, round_: int | None) -> None:
        """Let go of what is held for `run`'s rounds before `round_` (None: all of the run's)."""
        for key in [key for key in self._rounds if key[0] == run and (round_ is None or key[1] < round_)]:
            del self._rounds[key]

    def rounds(self) -> list[tuple[bytes, int]]:
        """The (run, round) pairs something is held for."""
        return sorted(self._rounds)

    @property
    def bytes_held(self) -> int:
        return sum(held.nbytes() for held in self._rounds.values())

    def _round(self, run: bytes, round_: int) -> _Round:
        if not isinstance(run, bytes) or len(run) != KEY_SIZE or not 0 <= round_ <= MAX_ROUND:
            raise ValueError(f"a run ID has {KEY_SIZE} bytes and a round is in [0, {MAX_ROUND}]")
        return self._rounds.setdefault((run, round_), _Round())


def _key_of(author: bytes) -> bytes:
    if not isinstance(author, bytes) or len(author) != KEY_SIZE:
        raise ValueError(f"an author is a {KEY_SIZE}-byte public key")
    return author


def _check_index(index: int) -> None:
    if not 0 <= index < merkle.MAX_LEAVES:
        raise ValueError(f"a shard index is in [0, {merkle.MAX_LEAVES})")


# --- the wire ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardRequest:
    what: str
    run: bytes
    round: int
    index: int
    author: bytes | None = None  # inputs only
    authors: tuple[bytes, ...] | None = None  # held requests only

    def encode(self) -> bytes:
        """The request's frame; `ValueError` for fields no request can carry (we never send junk)."""
        body: dict[str, Any] = {"what": self.what, "run": self.run, "round": self.round, "index": self.index}
        if self.author is not None:
            body["author"] = self.author
        if self.authors is not None:
            body["authors"] = list(self.authors)
        try:
            _REQUESTS.get(self.what, RESULT_REQUEST).check(body)
        except ProtocolError as error:
            raise ValueError(f"not a shard request: {error.reason}") from None
        return pack(body)


def decode_request(frame: bytes) -> ShardRequest:
    """A request from its frame (at most `MAX_REQUEST_SIZE` bytes), or `ProtocolError`."""
    body = unpack(frame, max_size=MAX_REQUEST_SIZE)
    if not isinstance(body, dict):
        raise ProtocolError("bad-request", "a shard request is a map")
    _REQUESTS.get(body.get("what"), RESULT_REQUEST).check(body)
    authors = body.get("authors")
    return ShardRequest(body["what"], body["run"], body["round"], body["index"], body.get("author"),
                        None if authors is None else tuple(authors))


def decode_answer(frame: bytes) -> tuple[str, int, list[bytes]]:
    """(status, size, proof) from an answer's header frame, or `ProtocolError`."""
    body = unpack(frame, max_size=MAX_HEADER_SIZE)
    ANSWER.check(body)
    status, size, proof = body["status"], body["size"], body["proof"]
    if status != OK and (size or proof):
        raise ProtocolError("bad-answer", f"a {status!r} answer announces bytes")
    return status, size, proof


def _header(status: str, size: int = 0, proof: list[bytes] = ()) -> bytes:
    return pack({"status": status, "size": size, "proof": list(proof)})


# --- serving -----------------------------------------------------------------------------------


class ShardService:
    """Answers SHARD_PROTOCOL requests from `holdings` (registered on the node's host).

    `slots`: the upload slots an ``ok`` answer holds while it is written (share the checkpoint
    service's to bound the node's uploads together; default: a set of its own). `scores`: where a
    peer's bad requests are charged (default: the node's)."""

    def __init__(self, node: Any, holdings: ShardHoldings, *, slots: UploadSlots | None = None,
                 scores: Any = None) -> None:
        self.node = node
        self.holdings = holdings
        self.slots = slots if slots is not None else UploadSlots()
        self.scores = scores if scores is not None else getattr(node, "scores", None)
        self.bytes_served = 0
        self._served: Any = None

    def register(self) -> None:
        """Serve SHARD_PROTOCOL on the node's host (once). Each step of a stream has its own bound,
        so the handler has no overall deadline (a large answer may take longer than any fixed one)."""
        if self._served is None:
            self._served = self.node.metrics.counter(
                "locomesh_shard_served_total", "Shard and shard result requests answered, by answer.",
                labels=("answer",))
        self.node.set_stream_handler(SHARD_PROTOCOL, self._serve, timeout=None)

    async def _serve(self, stream: Any) -> None:
        """Answer the one request on `stream`. A bad request is answered refused and charged to its
        sender; an ``ok`` answer not written in time resets the stream (`ProtocolError("timeout")`,
        which the node's guard counts)."""
        peer = remote_peer(stream)
        try:
            request = decode_request(await read_frame(stream, max_size=MAX_REQUEST_SIZE, timeout=REQUEST_TIMEOUT))
            self._check_in_range(request)
        except ProtocolError as error:
            if error.code in ("closed", "timeout", "truncated"):
                raise  # nothing to answer on: the guard counts it (a closed stream is no fault)
            await self._refuse(stream, peer, error)
            return
        if request.what == HELD:  # a few bytes: no upload slot
            await self._answer_in_time(stream, peer, self._held(request), [])
            return
        data, proof = self._lookup(request)
        if data is None:
            await self._answer_header(stream, MISSING)
            return
        slot = self.slots.take(peer)
        if slot is None:
            await self._answer_header(stream, BUSY)
            return
        try:
            await self._answer_in_time(stream, peer, data, proof)
        finally:
            slot.release()

    def _check_in_range(self, request: ShardRequest) -> None:
        """`ProtocolError` for an input index past the payload's shard count, where it is known here."""
        if request.what == INPUT:
            count = self.holdings.shard_count(request.run, request.round, request.author)
            if count is not None and request.index >= count:
                raise ProtocolError("bad-index", f"shard {request.index} of a payload of {count}")

    def _held(self, request: ShardRequest) -> bytes:
        """The bitmap of `request.authors` whose shard `request.index` is held here."""
        bitmap = bytearray(held_bitmap_size(len(request.authors)))
        for i, author in enumerate(request.authors):
            if self.holdings.input(request.run, request.round, author, request.index) is not None:
                bitmap[i // 8] |= 1 << (i % 8)
        return bytes(bitmap)

    def _lookup(self, request: ShardRequest) -> tuple[bytes | None, list[bytes]]:
        if request.what == INPUT:
            held = self.holdings.input(request.run, request.round, request.author, request.index)
            return (None, []) if held is None else held
        return self.holdings.result(request.run, request.round, request.index), []

    async def _refuse(self, stream: Any, peer: str, error: ProtocolError) -> None:
        """Charge a bad request to `peer` (its score, the node's protocol error count) and answer refused."""
        logger.info("%s: refused a request from %s: %s", SHARD_PROTOCOL, peer, error)
        self.node.count_protocol_error(error.code)
        if self.scores is not None and peer != self.node.peer_id:
            self.scores.strike(peer, f"shard request: {error.code}")
        await self._answer_header(stream, REFUSED)

    async def _answer_header(self, stream: Any, status: str) -> None:
        """A header without bytes; a stream that cannot take it in time is reset (nothing to count:
        the request was answered as far as this side goes)."""
        self._count(status)
        with trio.move_on_after(HEADER_TIMEOUT):
            try:
                await write_frame(stream, _header(status), timeout=HEADER_TIMEOUT)
                return
            except (ProtocolError, *_STREAM_FAILURES) as error:
                logger.debug("%s: a %s answer was not delivered: %s", SHARD_PROTOCOL, status, error)
        await reset_quietly(stream)

    async def _answer_in_time(self, stream: Any, peer: str, data: bytes, proof: list[bytes]) -> None:
        """Header and bytes within `write_deadline` of their size, or reset `stream` and raise
        `ProtocolError("timeout")`: the slot is not left to a reader that does not read."""
        meter = getattr(self.node, "meter", None)
        upload_cap = meter.bandwidth.upload.rate if meter is not None else 0.0
        deadline = write_deadline(len(data), upload_cap=upload_cap, slots=self.slots.total)
        with trio.move_on_after(deadline):
            await write_frame(stream, _header(OK, len(data), proof), timeout=deadline)
            await write_frame(stream, data, timeout=deadline)
            self._count(OK)
            self.bytes_served += len(data)
            return
        # Part of a frame may be out: nothing can follow it on this stream (the connection stays whole).
        self._count("too-slow")
        await reset_quietly(stream)
        raise ProtocolError("timeout", f"{peer} did not read {len(data)} bytes within {deadline:.1f} s")

    def _count(self, answer: str) -> None:
        if self._served is not None:
            self._served.inc(answer=answer)


# --- fetching ----------------------------------------------------------------------------------


class ShardFetchError(Exception):
    """A shard or result that could not be had from one peer; `reason` says why in a word:
    ``unreachable``, ``timeout``, ``busy``, ``missing``, ``refused``, ``too-large``, ``wrong-size``,
    ``bad-proof``, ``bad-answer`` or ``stream-failed``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


# Reasons that mean the holder broke the protocol (it is struck for them); the others are no fault.
FAULTS = frozenset({"too-large", "wrong-size", "bad-proof", "bad-answer"})


async def fetch_input(node: Any, peer_id: str, run: bytes, round_: int, author: bytes, index: int, *,
                      root: bytes, count: int, limit: int, timeout: float = FETCH_TIMEOUT) -> tuple[bytes, list[bytes]]:
    """Shard `index` (of `count`) of the payload `author` committed to with Merkle `root`, from `peer_id`,
    with its audit path; the answer's size is checked against `limit` before it is read whole, and the
    shard against the root (merkle.verify) before it is returned. Raises ShardFetchError (`ValueError`
    for arguments no request can carry)."""
    if not 0 <= index < count <= merkle.MAX_LEAVES or not 0 <= limit <= MAX_SHARD_SIZE:
        raise ValueError(f"shard {index} of {count}, limit {limit}: out of bounds")
    request = ShardRequest(INPUT, run, round_, index, author).encode()
    with _fetching(node, peer_id):
        shard, proof = await _exchange(node, peer_id, request, max_size=limit, timeout=timeout)
        try:
            merkle.verify(merkle.leaf_hash(shard), index, count, proof, root)
        except merkle.MerkleError as error:
            raise ShardFetchError("bad-proof", error.reason) from None
    return shard, proof


async def fetch_result(node: Any, peer_id: str, run: bytes, round_: int, index: int, *, size: int,
                       timeout: float = FETCH_TIMEOUT) -> bytes:
    """The values of shard `index`'s result that `peer_id` holds: exactly `size` bytes or ShardFetchError
    (the caller checks them against the signed hash)."""
    if not 0 <= size <= MAX_SHARD_SIZE:
        raise ValueError(f"a result of {size} bytes is out of bounds")
    request = ShardRequest(RESULT, run, round_, index).encode()
    with _fetching(node, peer_id):
        values, proof = await _exchange(node, peer_id, request, max_size=size, timeout=timeout, exact=True)
        if proof:
            raise ShardFetchError("bad-answer", "a result answer carries an audit path")
    return values


async def fetch_held(node: Any, peer_id: str, run: bytes, round_: int, index: int, authors: list[bytes], *,
                     timeout: float = FETCH_TIMEOUT) -> set[bytes]:
    """Which of `authors` (at most MAX_HELD_AUTHORS) have shard `index` of their round `round_`
    payload held by `peer_id`, as it says (unverified: a liar can only delay a round, `availability.py`).
    Raises ShardFetchError."""
    if not authors or len(authors) > MAX_HELD_AUTHORS:
        raise ValueError(f"a held request names 1 to {MAX_HELD_AUTHORS} authors")
    request = ShardRequest(HELD, run, round_, index, authors=tuple(authors)).encode()
    size = held_bitmap_size(len(authors))
    with _fetching(node, peer_id):
        bitmap, proof = await _exchange(node, peer_id, request, max_size=size, timeout=timeout, exact=True)
        if proof:
            raise ShardFetchError("bad-answer", "a held answer carries an audit path")
    return {author for i, author in enumerate(authors) if bitmap[i // 8] >> (i % 8) & 1}


def held_bitmap_size(authors: int) -> int:
    return (authors + 7) // 8


@contextmanager
def _fetching(node: Any, peer_id: str) -> Iterator[None]:
    """Strike `peer_id` in the node's scores when the fetch in the block ends in one of `FAULTS`."""
    try:
        yield
    except ShardFetchError as error:
        scores = getattr(node, "scores", None)
        if error.reason in FAULTS and scores is not None:
            scores.strike(peer_id, f"shard fetch: {error}")
        raise


async def _exchange(node: Any, peer_id: str, request: bytes, *, max_size: int, timeout: float,
                    exact: bool = False) -> tuple[bytes, list[bytes]]:
    """Send `request` (an encoded `ShardRequest`) to `peer_id` on a stream of its own and read the
    answer: (bytes, proof) for ``ok``, whose size is at most `max_size` (exactly, with `exact`),
    checked before the bytes are read; `ShardFetchError` for anything else, within `timeout` s in
    all. The stream is closed after a whole answer and reset otherwise (the holder stops writing
    what is not read)."""
    stream = None
    whole = False
    try:
        with trio.fail_after(timeout):
            stream = await node.open_stream(peer_id, [SHARD_PROTOCOL], timeout=timeout)
            await write_frame(stream, request, timeout=timeout)
            status, size, proof = decode_answer(await read_frame(stream, max_size=MAX_HEADER_SIZE, timeout=timeout))
            if status != OK:
                raise ShardFetchError(status)
            if exact and size != max_size:
                raise ShardFetchError("wrong-size", f"{size} bytes offered, {max_size} expected")
            if size > max_size:
                raise ShardFetchError("too-large", f"{size} bytes offered where at most {max_size} fit")
            data = await read_frame(stream, max_size=size, timeout=timeout)
            if len(data) != size:
                raise ShardFetchError("wrong-size", f"{size} bytes announced, {len(data)} sent")
            whole = True
            return data, proof
    except trio.TooSlowError:
        raise ShardFetchError("timeout", f"no answer from {peer_id} within {timeout:g} s") from None
    except DialError as error:
        raise ShardFetchError("unreachable", str(error)) from None
    except ProtocolError as error:
        raise ShardFetchError(_reason(error.code), error.reason) from None
    except _STREAM_FAILURES as error:
        raise ShardFetchError("stream-failed", str(error) or type(error).__name__) from None
    finally:
        if stream is not None:
            await (close_quietly(stream) if whole else reset_quietly(stream))


def _reason(code: str) -> str:
    """A `ShardFetchError` reason for a `ProtocolError` code met while reading an answer."""
    if code in ("timeout", "too-large"):
        return code
    if code in ("closed", "truncated"):
        return "stream-failed"
    return "bad-answer"
