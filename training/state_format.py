"""The serialized state of a checkpoint (the "blob"): named tensors as raw bytes behind a msgpack header.

    b"LMCK" | header length (u32, little-endian) | header | zero padding | tensor bytes

The header is canonical msgpack, ``{"tensors": [{name, dtype, shape, offset,
length}, ...]}``, listed by offset. Offsets count from the start of the tensor
bytes, which begins at the next multiple of 64 after the header; every tensor
starts on a multiple of 64 too, so a loaded tensor can be a view into one
buffer without an unaligned element. Tensors are laid out sorted by name, so
the same state always gives the same blob. Values are raw little-endian bytes
of a fixed allow-list of dtypes: no pickle, no torch.save, nothing that can run
code when read.

Pure: tensors to bytes (`state_pieces`), bytes to tensors (`parse_header`,
`views`), and the checks a header from a peer must pass, against the format's
rules and against the layout a caller expects (`check_layout`). Chunks and
manifests are `state_chunks`' and `checkpoint_manifest`'s; files are the node's store's.

Tensors are torch tensors or numpy arrays. torch is imported only where a tensor is made
(`views`): the daemon imports this module through its store, and loads torch only once it
trains (`node.debug` shows it).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Mapping

import numpy as np

from locomesh.protocol import ProtocolError, pack, unpack
from locomesh.protocol.schema import Int, List, OneOf, Str, Struct

from .checkpoint_manifest import CheckpointError, LimitError, TensorSpec

if TYPE_CHECKING:
    import torch

MAGIC = b"LMCK"
ALIGN = 64
PREFIX_SIZE = len(MAGIC) + 4
MAX_HEADER_SIZE = 16 * 1024 * 1024
MAX_TENSORS = 65536
MAX_NDIM = 16


@dataclass(frozen=True)
class DType:
    name: str  # as numpy and torch name it (`torch.<name>`), but for bfloat16, which numpy lacks
    numpy: np.dtype  # little-endian; bfloat16 travels as its 16 bits, uint16


DTYPES = {
    d.name: d
    for d in (
        DType("float32", np.dtype("<f4")),
        DType("float16", np.dtype("<f2")),
        DType("bfloat16", np.dtype("<u2")),
        DType("int64", np.dtype("<i8")),
        DType("int32", np.dtype("<i4")),
        DType("int8", np.dtype("i1")),
        DType("uint8", np.dtype("u1")),
        DType("bool", np.dtype("?")),
    )
}
_BY_NUMPY = {d.numpy: d for d in DTYPES.values() if d.name != "bfloat16"}

_HEADER_SCHEMA = Struct(
    {
        "tensors": List(
            Struct(
                {
                    "name": Str(1, 256),
                    "dtype": OneOf(frozenset(DTYPES)),
                    "shape": List(Int(0, 2**48), max_len=MAX_NDIM),
                    "offset": Int(0, 2**63 - 1),
                    "length": Int(0, 2**63 - 1),
                }
            ),
            max_len=MAX_TENSORS,
        )
    }
)


@dataclass(frozen=True)
class Entry:
    """One tensor's place in the blob."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    offset: int
    length: int

    def header(self) -> dict[str, Any]:
        return {
            "name": self.name, "dtype": self.dtype.name, "shape": list(self.shape),
            "offset": self.offset, "length": self.length,
        }


def state_pieces(tensors: Mapping[str, torch.Tensor | np.ndarray]) -> Iterator[memoryview | bytes]:
    """The serialized state of `tensors`, piece by piece (`_blob_pieces`); `CheckpointError` for one
    the format cannot hold."""
    arrays = {name: _as_bytes_array(name, value) for name, value in tensors.items()}
    return _blob_pieces(_layout({name: (dtype, shape, data.nbytes) for name, (dtype, shape, data) in arrays.items()}), arrays)


def layout_raw_size(tensors: Mapping[str, TensorSpec]) -> int:
    """The exact size of the serialized state that holds every tensor of `tensors` (the ones that
    are not `required` included) with those dtypes and shapes; `CheckpointError` for a layout the
    format cannot hold."""
    sizes = {}
    for name, spec in tensors.items():
        dtype = DTYPES.get(spec.dtype)
        if dtype is None:
            raise CheckpointError("bad-state", f"{name}: dtype {spec.dtype!r} is not one a checkpoint can hold")
        shape = tuple(int(n) for n in spec.shape)
        sizes[name] = (dtype, shape, math.prod(shape) * dtype.numpy.itemsize)
    entries = _layout(sizes)
    return len(_prefix(entries)) + (entries[-1].offset + entries[-1].length if entries else 0)


def _as_bytes_array(name: str, value: torch.Tensor | np.ndarray) -> tuple[DType, tuple[int, ...], np.ndarray]:
    """(dtype, shape, the values as flat little-endian bytes), sharing memory where the layout allows."""
    if not isinstance(name, str) or not 1 <= len(name) <= 256:
        raise CheckpointError("bad-state", f"tensor name {name!r:.80} must be a string of 1 to 256 characters")
    if _is_torch_tensor(value):
        dtype = DTYPES.get(str(value.dtype).removeprefix("torch."))
        if dtype is None:
            raise CheckpointError("bad-state", f"{name}: dtype {value.dtype} is not one a checkpoint can hold")
        flat = value.detach().cpu().contiguous()
        if dtype.name == "bfloat16":
            flat = flat.view(sys.modules["torch"].int16)  # torch is loaded: `value` is one of its tensors
        array = flat.numpy()
    elif isinstance(value, np.ndarray):
        dtype = _BY_NUMPY.get(value.dtype.newbyteorder("<") if value.dtype.byteorder == ">" else value.dtype)
        if dtype is None:
            raise CheckpointError("bad-state", f"{name}: dtype {value.dtype} is not one a checkpoint can hold")
        array = value
    else:
        raise CheckpointError("bad-state", f"{name}: a {type(value).__name__} is not a tensor or an array")
    shape = tuple(int(n) for n in array.shape)  # before ascontiguousarray, which makes a 0-d array 1-d
    array = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
    return dtype, shape, array.reshape(-1).view(np.uint8)


def _is_torch_tensor(value: Any) -> bool:
    """Whether `value` is a torch tensor (none can exist while torch is not imported)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _layout(sizes: dict[str, tuple[DType, tuple[int, ...], int]]) -> list[Entry]:
    """Where each tensor (name -> dtype, shape, byte length) goes: sorted by name, each aligned."""
    entries, offset = [], 0
    for name in sorted(sizes):
        dtype, shape, length = sizes[name]
        entries.append(Entry(name, dtype, shape, offset, length))
        offset = align(offset + length)
    return entries


def _prefix(entries: list[Entry]) -> bytes:
    """The blob up to its tensor bytes: magic, header length, header, zero padding."""
    header = pack({"tensors": [entry.header() for entry in entries]})
    if len(header) > MAX_HEADER_SIZE:
        raise CheckpointError("bad-state", f"a header of {len(header)} bytes is over {MAX_HEADER_SIZE}: too many tensors")
    prefix = MAGIC + len(header).to_bytes(4, "little") + header
    return prefix + bytes(align(len(prefix)) - len(prefix))


def _blob_pieces(entries: list[Entry], arrays: dict[str, Any]) -> Iterator[memoryview | bytes]:
    """The blob, piece by piece, without ever joining the tensors into one buffer."""
    yield _prefix(entries)
    position = 0
    for entry in entries:
        yield bytes(entry.offset - position)
        yield memoryview(arrays[entry.name][2])
        position = entry.offset + entry.length


def tensors_from_blob(blob: np.ndarray) -> dict[str, torch.Tensor]:
    """Validate the blob's header and return its tensors as views into `blob`."""
    return views(blob, *parse_header(blob[: PREFIX_SIZE + MAX_HEADER_SIZE].tobytes(), len(blob)))


def arrays(blob: np.ndarray, data_start: int, entries: list[Entry]) -> dict[str, np.ndarray]:
    """The tensors of the blob whose (validated) header gave `data_start` and `entries`, as numpy
    views into `blob` (a bfloat16 tensor as its 16 bits, uint16)."""
    found = {}
    for entry in entries:
        start = data_start + entry.offset
        raw = blob[start : start + entry.length]
        if entry.dtype.name == "bool" and entry.length and raw.max() > 1:
            raise CheckpointError("bad-header", f"{entry.name}: a bool tensor holds bytes other than 0 and 1")
        found[entry.name] = raw.view(entry.dtype.numpy).reshape(entry.shape)
    return found


def views(blob: np.ndarray, data_start: int, entries: list[Entry]) -> dict[str, torch.Tensor]:
    """`arrays`, as torch tensors (views into `blob`)."""
    import torch  # here, not at the top: see the module docstring

    kinds = {entry.name: entry.dtype.name for entry in entries}
    tensors = {name: torch.from_numpy(array) for name, array in arrays(blob, data_start, entries).items()}
    return {name: t.view(torch.bfloat16) if kinds[name] == "bfloat16" else t for name, t in tensors.items()}


def parse_header(head: bytes, state_size: int) -> tuple[int, list[Entry]]:
    """(where tensor bytes start, the entries) of a state of `state_size` bytes that begins with
    `head` (at least its prefix and header), every rule checked against that size."""
    if len(head) < PREFIX_SIZE or head[: len(MAGIC)] != MAGIC:
        raise CheckpointError("bad-header", "the state does not start with the checkpoint magic")
    header_size = int.from_bytes(head[len(MAGIC) : PREFIX_SIZE], "little")
    if header_size > MAX_HEADER_SIZE or PREFIX_SIZE + header_size > min(state_size, len(head)):
        raise CheckpointError("bad-header", f"header of {header_size} bytes does not fit the state")
    try:
        header = unpack(head[PREFIX_SIZE : PREFIX_SIZE + header_size], max_size=MAX_HEADER_SIZE)
        _HEADER_SCHEMA.check(header)
    except ProtocolError as exc:
        raise CheckpointError("bad-header", f"{exc.code}: {exc.reason}") from None
    data_start = align(PREFIX_SIZE + header_size)
    entries = [Entry(t["name"], DTYPES[t["dtype"]], tuple(t["shape"]), t["offset"], t["length"]) for t in header["tensors"]]
    _check_entries(entries, state_size - data_start)
    return data_start, entries


def check_layout(entries: list[Entry], tensors: Mapping[str, TensorSpec]) -> None:
    """Every tensor in the header is one of `tensors`, with its dtype and shape, and every
    required one is there; else `LimitError` (limit ``tensors``)."""
    held = {entry.name for entry in entries}
    missing = sorted(name for name, spec in tensors.items() if spec.required and name not in held)
    if missing:
        raise LimitError("tensors", f"the state lacks {missing}")
    for entry in entries:
        spec = tensors.get(entry.name)
        if spec is None:
            raise LimitError("tensors", f"{entry.name!r:.80} is not one of {sorted(tensors)}")
        if entry.dtype.name != spec.dtype or entry.shape != tuple(spec.shape):
            got, expected = f"{entry.dtype.name}{list(entry.shape)}", f"{spec.dtype}{list(spec.shape)}"
            raise LimitError("tensors", f"{entry.name!r} is {got:.80}, expected {expected:.80}")


def _check_entries(entries: list[Entry], data_size: int) -> None:
    """Names unique; each tensor aligned, sized by its shape, after the previous one; the last ends the state."""
    names, end = set(), 0
    for entry in entries:
        problem = _entry_problem(entry, names, end, data_size)
        if problem:
            raise CheckpointError("bad-header", f"{entry.name!r}: {problem}")
        names.add(entry.name)
        end = entry.offset + entry.length
    if end != data_size:
        raise CheckpointError("bad-header", f"the state has {data_size - end} bytes after its last tensor")


def _entry_problem(entry: Entry, names: set[str], previous_end: int, data_size: int) -> str | None:
    if entry.name in names:
        return "listed twice"
    if entry.offset % ALIGN:
        return f"offset {entry.offset} is not a multiple of {ALIGN}"
    if entry.offset < previous_end:
        return f"offset {entry.offset} overlaps the tensor before it (it ends at {previous_end})"
    if math.prod(entry.shape) * entry.dtype.numpy.itemsize != entry.length:
        return f"shape {list(entry.shape)} of {entry.dtype.name} is not {entry.length} bytes"
    if entry.offset + entry.length > data_size:
        return f"bytes [{entry.offset}, {entry.offset + entry.length}) run past the state's {data_size}"
    return None


def align(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN
