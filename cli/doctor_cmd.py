"""`locomesh doctor [RUN_ID]`: can this machine take part, and if not, why not and what to do.

Checked here, without a daemon: Python, torch, the training device (the running daemon's, else the
configuration's), whether this CPU computes the outer step to the reference bits
(`training.reference_hashes`, the cross-CPU determinism test's vectors), the configuration and the
data dir with its permissions.
Asked of the running daemon (``node.doctor``, node/doctor/): bootstrap reachability, the
reachability verdict and NAT behaviour, port mapping, relays and, for RUN_ID, the run's members,
links, memory and round time.

Each problem comes with its fix. The last line, the verdict, follows from the checks: the node can
take part unless a check failed (a warning says what works less well). The exit status is 0 when
the node can take part, 1 when a check failed, and 3 when no daemon runs (its checks cannot be
made: start one and run doctor again). On a terminal the checks are a table; piped, plain lines;
``--json`` for scripts (with ``ok`` and the ``verdict`` line).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any

from locomesh.node.doctor.checks import FAIL, OK, WARN, Check, fail, ok, takes_part, verdict

from .client import EXIT_ERROR, EXIT_NO_DAEMON, EXIT_OK, DaemonNotRunning, RpcCallError, RpcClient
from .common import TextTable, add_data_dir_argument, data_dir_of, emit, on_terminal

DOCTOR_TIMEOUT = 120.0  # a run's checks dial, probe and time real inner steps
RPC_CHECK = "RPC"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("doctor", help="check that this machine can take part (in RUN_ID), with a fix for "
                                                  "each problem")
    parser.add_argument("run_id", metavar="RUN_ID", nargs="?", help="also check what this run needs (a unique "
                                                                     "prefix of a known run's ID is enough)")
    add_data_dir_argument(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.set_defaults(handler=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    data_dir = data_dir_of(args)
    daemon = daemon_checks(data_dir, args.run_id)  # first: the device to check is the running daemon's
    config, checks = local_checks(data_dir, daemon["facts"].get("device"))
    checks.extend(daemon["checks"])
    report = {"ok": takes_part(checks), "verdict": verdict(checks), "checks": [c.as_dict() for c in checks],
              "facts": {"data_dir": str(data_dir), "device": getattr(config, "device", None), **daemon["facts"]}}
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        emit(format_checks(checks))
    if report["ok"]:
        return EXIT_OK
    return EXIT_NO_DAEMON if any(c.name == RPC_CHECK and c.status == FAIL for c in checks) else EXIT_ERROR


# --- what this process checks itself ---------------------------------------------------------------


def local_checks(data_dir: Path, daemon_device: str | None = None) -> tuple[Any, list[Check]]:
    """(the node's configuration or None, the checks made without a daemon). `daemon_device`: the
    device the running daemon trains on (its --device may differ from the configuration), if one runs."""
    checks = [python_check()]
    config, config_check = load_node_config(data_dir)
    checks.append(config_check)
    torch_ok = torch_check()
    checks.append(torch_ok)
    if torch_ok.status == OK:
        if daemon_device:
            checks.append(device_check(daemon_device, " (the running daemon's device)"))
        else:
            checks.append(device_check(getattr(config, "device", "auto")))
    checks.append(determinism_check())
    checks.append(data_dir_check(data_dir))
    return config, checks


def python_check() -> Check:
    version = ".".join(str(part) for part in sys.version_info[:3])
    if sys.version_info < (3, 11):
        return fail("python", f"Python {version} is too old", "install Python 3.11 or newer and reinstall locomesh")
    return ok("python", f"Python {version} ({sys.executable})")


def load_node_config(data_dir: Path) -> tuple[Any, Check]:
    from locomesh.node.config import ConfigError, load_config

    try:
        config = load_config(data_dir=data_dir)
    except ConfigError as error:
        return None, fail("config", str(error), "fix the value named (the keys: docs/usage.md, Configuration)")
    where = config.config_file or "defaults (no config.toml)"
    return config, ok("config", f"read from {where}")


def torch_check() -> Check:
    try:
        import torch
    except Exception as error:  # noqa: BLE001 - a broken install raises all sorts
        return fail("torch", f"torch does not import: {type(error).__name__}: {error}",
                    "reinstall locomesh in a fresh virtual environment (pip install locomesh)")
    return ok("torch", f"torch {torch.__version__}")


def device_check(spec: str, whose: str = "") -> Check:
    """Device `spec` resolves here and computes (a small matrix product on it). `whose`: which
    node's device it is, in words, for the end of the detail."""
    from locomesh.training.devices import DeviceError, resolve_device

    try:
        import torch

        device = resolve_device(spec)
        x = torch.ones(64, 64, device=device)
        float((x @ x).sum())
    except DeviceError as error:
        return fail("device", f"{spec} requested, not available: {_without_request(str(error), spec)}{whose}",
                    "start the node with --device auto or cpu, or the device this machine has")
    except Exception as error:  # noqa: BLE001 - a driver error, out of device memory
        return fail("device", f"{spec} does not compute: {type(error).__name__}: {str(error)[:200]}",
                    "check the GPU driver (nvidia-smi), or start the node with --device cpu")
    return ok("device", f"{spec} -> {device}: works{whose}")


def _without_request(reason: str, spec: str) -> str:
    """A `DeviceError`'s reason without its opening "SPEC asked for, (and)", which the check says already."""
    return re.sub(rf"^{re.escape(spec)} asked for,( and)? ", "", reason)


def determinism_check() -> Check:
    from locomesh.training.reference_hashes import mismatches

    wrong = mismatches()
    if wrong:
        return fail("outer step", f"this CPU computes the outer step to other bits than the reference ({', '.join(wrong)}):"
                    " it would never agree with other peers on a round",
                    "report it with the output of `locomesh doctor --json` and your CPU model; do not join runs "
                    "from this machine until it is fixed")
    return ok("outer step", "computes the reference hashes bit for bit (peers on other CPUs will agree)")


def data_dir_check(data_dir: Path) -> Check:
    from locomesh.node.datadir import DataDir

    if not data_dir.exists():
        parent = next((p for p in data_dir.parents if p.exists()), None)
        if parent is None or not os.access(parent, os.W_OK | os.X_OK):
            return fail("data dir", f"{data_dir} does not exist and cannot be created ({parent} is not writable)",
                        "choose another place with --data-dir DIR or LOCOMESH_DATA_DIR")
        return ok("data dir", f"{data_dir} does not exist yet; the node creates it at start")
    if not data_dir.is_dir():
        return fail("data dir", f"{data_dir} is not a directory", "remove it, or choose another --data-dir")
    if not os.access(data_dir, os.R_OK | os.W_OK | os.X_OK):
        return fail("data dir", f"{data_dir} is not writable by this user",
                    f"give it back to this user (chown -R $USER {data_dir}), or choose another --data-dir")
    key = DataDir(data_dir).identity_path
    if key.exists():
        mode = stat.S_IMODE(key.stat().st_mode)
        if mode & 0o077:
            return fail("data dir", f"the node's key {key} can be read by other users (mode {mode:o})",
                        f"chmod 600 {key}")
        if not os.access(key, os.R_OK):
            return fail("data dir", f"the node's key {key} is not readable by this user",
                        f"give it back to this user (chown $USER {key})")
    return ok("data dir", f"{data_dir}: writable" + (", key private" if key.exists() else ""))


# --- what the daemon checks ------------------------------------------------------------------------


def daemon_checks(data_dir: Path, run_id: str | None) -> dict[str, Any]:
    """{"checks", "facts"} from the daemon's ``node.doctor``; an RPC check that failed if there is none."""
    try:
        client = RpcClient.for_data_dir(data_dir, timeout=DOCTOR_TIMEOUT)
        result = client.call("node.doctor", {"run_id": run_id} if run_id else {})
    except DaemonNotRunning as error:
        fix = f"start it (locomesh node start --data-dir {data_dir}), then run doctor again"
        return {"checks": [fail(RPC_CHECK, f"the daemon's RPC is down: {error}", fix)], "facts": {}}
    except RpcCallError as error:
        return {"checks": [fail(RPC_CHECK, f"the daemon refused node.doctor: {error.message}",
                                "update the daemon to this version of locomesh and restart it")], "facts": {}}
    checks = [ok(RPC_CHECK, f"the daemon answers on 127.0.0.1:{client.port}")]
    checks.extend(Check(str(c.get("name")), str(c.get("status")), str(c.get("detail")), str(c.get("fix") or ""))
                  for c in result.get("checks", []))
    return {"checks": checks, "facts": result.get("facts", {})}


# --- output ----------------------------------------------------------------------------------------


_MARK = {OK: "ok", WARN: "WARN", FAIL: "FAIL"}


def format_checks(checks: list[Check]) -> str:
    """A table on a terminal; piped, one line per check and an indented "fix:" line under each problem;
    last, whether the node can take part (`checks.verdict`)."""
    if on_terminal():
        rows = [(_MARK.get(c.status, c.status), c.name, c.detail, c.fix or "-") for c in checks]
        emit(TextTable.columns(("", "CHECK", "FOUND", "FIX"), rows))
        return verdict(checks)
    lines = []
    for check in checks:
        lines.append(f"{_MARK.get(check.status, check.status):<4}  {check.name}: {check.detail}")
        if check.fix:
            lines.append(f"      fix: {check.fix}")
    lines.append(verdict(checks))
    return "\n".join(lines)
