"""Where a node's inner steps run: device specs, what they resolve to here, and mixed precision.

A node names its device with a spec (config key ``device``, ``node start --device``):

    auto     the first CUDA GPU if there is one, else Apple's MPS if there is, else the CPU
    cpu      the CPU
    cuda     the first CUDA GPU (cuda:0)
    cuda:N   CUDA GPU number N
    mps      Apple's Metal GPU

`check_spec` checks a spec's syntax alone (node/config.py calls it without loading torch);
`resolve_device` and `local_devices` ask torch what this machine has, which the daemon does on
its first join. `local_devices` is the node's data-parallel group: one device per process, all
the GPUs for "auto" and "cuda" on a machine with several (training/distributed/).

Only the inner steps move: the outer step, the codec and the state hash stay on the CPU in
their bit-exact arithmetic, so peers on different hardware still agree on every bit of θ.
Inner steps run under `autocast`: bf16 on a GPU that has it, plain float32 elsewhere.

This module imports torch inside its functions only: node/config.py imports it at start.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import TYPE_CHECKING, ContextManager

if TYPE_CHECKING:
    import torch

SPECS = ("auto", "cpu", "cuda", "cuda:N", "mps")
_SPEC = re.compile(r"auto|cpu|cuda|mps|cuda:(0|[1-9][0-9]{0,3})")


class DeviceError(ValueError):
    """A device spec that is malformed or names a device this machine does not have; the message
    says which and what there is."""


class DataParallelError(RuntimeError):
    """A process of the node's data-parallel group (training/distributed/) failed, died or stopped
    answering: the message says which, and what it was doing. Here, not there, so that the node
    can catch it without loading torch."""


def check_spec(spec: str) -> str:
    """`spec` if it is a well-formed device spec (one of `SPECS`), else `DeviceError`. Syntax only."""
    if not isinstance(spec, str) or not _SPEC.fullmatch(spec):
        raise DeviceError(f"{str(spec)[:40]!r} is not a device (one of {', '.join(SPECS)})")
    return spec


def resolve_device(spec: str) -> torch.device:
    """The device `spec` names on this machine; `DeviceError` if it is malformed or not here."""
    import torch

    check_spec(spec)
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", 0)
        return torch.device("mps") if _mps_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec == "mps":
        if not _mps_available():
            raise DeviceError("mps asked for, and this machine has no usable MPS device (Apple GPU)")
        return torch.device("mps")
    index = int(spec.partition(":")[2] or 0)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= count:
        raise DeviceError(f"{spec} asked for, this machine has {_cuda_devices(count)}")
    return torch.device("cuda", index)


def local_devices(spec: str, workers: int = 0) -> list[torch.device]:
    """The devices of this node's data-parallel group, one process each. `workers` 0 means "as
    many as make sense": every GPU for "auto" and "cuda", else one. A positive `workers` asks
    for that many: the first `workers` GPUs for "auto"/"cuda" on a CUDA machine, or that many CPU
    processes for "cpu" (for tests, and machines with several CPU sockets); a single device
    ("cuda:N", "mps") takes 1 only. `DeviceError` for what this machine cannot give."""
    import torch

    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise DeviceError(f"local workers is a count (0: one per GPU), got {workers!r}")
    device = resolve_device(spec)
    if device.type == "cuda" and spec in ("auto", "cuda"):
        count = torch.cuda.device_count()
        if workers > count:
            raise DeviceError(f"{workers} local workers asked for on {spec}, this machine has {_cuda_devices(count)}")
        return [torch.device("cuda", index) for index in range(workers or count)]
    if device.type == "cpu":
        return [device] * max(1, workers)
    if workers > 1:
        raise DeviceError(f"{workers} local workers asked for on {device}, which is one device")
    return [device]


def describe(devices: list[torch.device]) -> str:
    """How a node's training devices read in its status: "cuda:0", or "cuda:0,cuda:1 (data parallel)"."""
    names = ",".join(str(device) for device in devices)
    return names if len(devices) == 1 else f"{names} (data parallel)"


def autocast(device: torch.device) -> ContextManager:
    """The mixed precision of inner steps on `device`: bf16 autocast on a CUDA GPU with native
    bf16 (Ampere and later, or ROCm), and on MPS where this torch and macOS support it; nothing (float32) on the CPU, where bf16
    autocast is slower than float32 on most processors (without AMX or AVX512-BF16 every bf16 matmul
    is converted back and forth) and would change the CPU's results, which tests pin bit for bit."""
    import torch

    if device.type == "cuda" and _cuda_bf16(device.index or 0):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    if device.type == "mps" and _mps_bf16():
        return torch.autocast("mps", dtype=torch.bfloat16)
    return contextlib.nullcontext()


def _cuda_devices(count: int) -> str:
    return "no CUDA device" if count == 0 else f"{count} CUDA device{'s' if count > 1 else ''}"


@functools.cache
def _cuda_bf16(index: int) -> bool:
    """Does CUDA GPU `index` do bf16 natively? (`torch.cuda.is_bf16_supported` asks about the
    current device, and counts the emulation of older GPUs, slower than float32.)"""
    import torch

    return bool(torch.version.hip) or torch.cuda.get_device_capability(index)[0] >= 8


def _mps_available() -> bool:
    import torch

    return torch.backends.mps.is_available()


@functools.cache
def _mps_bf16() -> bool:
    """Can this torch autocast to bf16 on MPS (bf16 needs macOS 14)? Tried once."""
    import torch

    if not torch.amp.is_autocast_available("mps"):
        return False
    try:
        with torch.autocast("mps", dtype=torch.bfloat16):
            torch.ones(2, 2, device="mps") @ torch.ones(2, 2, device="mps")
    except (RuntimeError, TypeError):
        return False
    return True
