"""Fuzz the wire decoders: every input must be accepted (and round-trip) or raise `ProtocolError`.

    .venv/bin/python bench/protocol_fuzz.py [--count 100000] [--seed 1] [--time-cap 1.0]
    .venv/bin/python bench/protocol_fuzz.py --replay 4711      # one input, its bytes and outcome

Inputs (see `_fuzz_inputs.py`: random bytes, byte-level and structural
mutations of valid envelopes of every registered kind, non-canonical and
hostile encodings, zstd bombs and broken frames) go to the three entry points
that take bytes from peers: `decode` (a signed envelope), `unpack` (canonical
msgpack) and `decompress` (one zstd frame, under a cap).

An accepted input must re-encode to the same bytes (and an envelope must still
verify, with version exactly the integer 1). Any other exception, or an
accepted input that breaks those rules, is a failure: it is counted, the first
few distinct ones are printed with traceback and bytes in hex, and the exit
status is 1. So is an input slower than `--time-cap`; the slowest input's time
is reported. A watchdog ends the process with a traceback dump if one input
runs longer than `--hang-limit` seconds; the index of the input in flight is
kept in a file named on stderr, so the hang can be replayed with `--replay`.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import zstandard

from _fuzz_inputs import Case, Corpus, make_case  # bench/ is on sys.path when this file runs as a script
from _report import machine, report

from locomesh.protocol import KINDS, ProtocolError, decode, decompress, pack, unpack, verify
from locomesh.protocol.envelope import signing_bytes

DECOMPRESS_CAP = 1 << 20
UNPACK_CAP = 1 << 16
MAX_FAILURE_SAMPLES = 8
MAX_HEX = 4096  # characters of an input's hex kept in the report


# --- running one input -------------------------------------------------------------------------------------


def run_case(case: Case) -> str:
    """The outcome: "accepted" or the ProtocolError code. Anything else propagates (a failure)."""
    try:
        if case.target == "decode":
            check_envelope(case.data, decode(case.data, run=case.run))
        elif case.target == "unpack":
            if pack(unpack(case.data, max_size=UNPACK_CAP)) != case.data:
                raise AcceptedWrongly("unpack accepted bytes that do not re-encode to themselves")
        else:
            check_inflated(case.data, decompress(case.data, max_output=DECOMPRESS_CAP))
    except ProtocolError as error:
        return error.code
    return "accepted"


class AcceptedWrongly(AssertionError):
    """An input the decoder accepted although it breaks the rules it promises."""


def check_envelope(data: bytes, envelope: Any) -> None:
    if envelope.encode() != data:
        raise AcceptedWrongly("decode accepted an envelope that does not re-encode to the same bytes")
    if type(envelope.v) is not int or envelope.v != 1:
        version = f"{envelope.v!r} ({type(envelope.v).__name__})"
        raise AcceptedWrongly(f"decode accepted protocol version {version}, not the integer 1")
    signed = signing_bytes(envelope.v, envelope.kind, envelope.run, envelope.author, envelope.body)
    verify(envelope.author, envelope.sig, signed)


def check_inflated(frame: bytes, output: bytes) -> None:
    if len(output) > DECOMPRESS_CAP or len(output) != zstandard.frame_content_size(frame):
        raise AcceptedWrongly("decompress returned other than the frame's declared size within the cap")


# --- the campaign ----------------------------------------------------------------------------------------


@dataclass
class Tally:
    outcomes: Counter = field(default_factory=Counter)  # (target, outcome) -> count
    failures: Counter = field(default_factory=Counter)  # (target, generator, exception type) -> count
    samples: list[dict[str, Any]] = field(default_factory=list)
    seen: set[tuple[str, str]] = field(default_factory=set)
    slowest: tuple[float, int, str] = (0.0, -1, "")
    over_cap: int = 0

    def failure(self, index: int, case: Case, error: BaseException) -> None:
        self.failures[(case.target, case.generator, type(error).__name__)] += 1
        self.outcomes[(case.target, "FAILURE " + type(error).__name__)] += 1
        signature = (type(error).__name__, str(error)[:60])  # one sample per distinct error, the first seen
        if signature not in self.seen and len(self.samples) < MAX_FAILURE_SAMPLES:
            self.seen.add(signature)
            self.samples.append(describe_failure(index, case, error))


def describe_failure(index: int, case: Case, error: BaseException) -> dict[str, Any]:
    return {
        "index": index, "target": case.target, "generator": case.generator, "run": case.run.hex() if case.run else None,
        "error": repr(error), "traceback": "".join(traceback.format_exception(error)),
        "input_hex": case.data.hex()[:MAX_HEX], "input_len": len(case.data),
    }


class InFlight:
    """Keeps the index of the input being run in a file, and arms a watchdog that dumps and exits on a hang.

    The watchdog is faulthandler's C thread, so it fires even when the hang is
    inside C code that holds the GIL.
    """

    def __init__(self, hang_limit: float) -> None:
        self.hang_limit = hang_limit
        fd, self.path = tempfile.mkstemp(prefix="locomesh-fuzz-", suffix=".index")
        self.fd = fd
        print(f"fuzz: the index of the input in flight is kept in {self.path} (left there if the watchdog "
              f"ends the run after {hang_limit:g} s on one input)", file=sys.stderr)

    def start(self, index: int) -> None:
        os.pwrite(self.fd, f"{index:<20}\n".encode(), 0)
        faulthandler.dump_traceback_later(self.hang_limit, exit=True)

    def done(self) -> None:
        faulthandler.cancel_dump_traceback_later()

    def close(self) -> None:
        faulthandler.cancel_dump_traceback_later()
        os.close(self.fd)
        os.unlink(self.path)


def campaign(count: int, seed: int, time_cap: float, hang_limit: float) -> Tally:
    corpus = Corpus.build(seed)
    tally = Tally()
    in_flight = InFlight(hang_limit)
    try:
        for index in range(count):
            case = make_case(corpus, seed, index)
            in_flight.start(index)
            started = time.perf_counter()
            try:
                outcome = run_case(case)
            except Exception as error:  # noqa: BLE001 - catching everything is the point of a fuzzer
                tally.failure(index, case, error)
            else:
                tally.outcomes[(case.target, outcome)] += 1
            elapsed = time.perf_counter() - started
            in_flight.done()
            if elapsed > tally.slowest[0]:
                tally.slowest = (elapsed, index, f"{case.target}/{case.generator}")
            tally.over_cap += elapsed > time_cap
    finally:
        in_flight.close()
    return tally


def replay(seed: int, index: int) -> int:
    case = make_case(Corpus.build(seed), seed, index)
    print(f"input {index} (seed {seed}): {case.target}/{case.generator}, {len(case.data)} bytes, run={case.run!r}")
    print(case.data.hex())
    try:
        print("outcome:", run_case(case))
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--time-cap", type=float, default=1.0, help="seconds one input may take before it counts as slow")
    parser.add_argument("--hang-limit", type=float, default=60.0, help="seconds after which the watchdog ends the run")
    parser.add_argument("--replay", type=int, metavar="INDEX", help="rebuild and run one input")
    args = parser.parse_args(argv)
    if args.replay is not None:
        return replay(args.seed, args.replay)

    started = time.perf_counter()
    tally = campaign(args.count, args.seed, args.time_cap, args.hang_limit)
    seconds = time.perf_counter() - started
    failures = sum(tally.failures.values())
    rows = [{"target": t, "outcome": o, "count": n} for (t, o), n in sorted(tally.outcomes.items())]
    rows.append({"target": "all", "outcome": "total", "count": args.count})
    meta = {
        "count": args.count, "seed": args.seed, "seconds": round(seconds, 1), "inputs_per_s": round(args.count / seconds),
        "kinds": sorted(KINDS), "failures": failures,
        "failures_by_source": {"/".join(k): n for k, n in sorted(tally.failures.items())},
        "slowest_input_s": round(tally.slowest[0], 4),
        "slowest_input": {"index": tally.slowest[1], "source": tally.slowest[2]},
        "time_cap_s": args.time_cap, "inputs_over_time_cap": tally.over_cap,
        **machine(), "note": "CPU shared with other work while measured",
    }
    report("protocol_fuzz", rows, meta)
    for sample in tally.samples:
        print(f"\n--- failure at input {sample['index']} ({sample['target']}/{sample['generator']}, run={sample['run']}):"
              f" {sample['error']}\n{sample['traceback']}input ({sample['input_len']} bytes): {sample['input_hex']}")
    return 1 if failures or tally.over_cap else 0


if __name__ == "__main__":
    sys.exit(main())
