"""Tables on a terminal fit its width (#37): `run status` and `run watch` at 80 and 120 columns cut
no cell to "02…" and draw no line wider than the terminal; narrow terminals lose the optional
columns first (named under the table), then get one "header  value" block per row."""

from __future__ import annotations

import io
import time

import pytest
import rich
from rich.console import Console

# Every command module that binds `on_terminal` by name, imported before a test patches it: one
# imported first under the patch would keep the patched function for the rest of the session.
from locomesh.cli import common, doctor_cmd, run_audit, run_cmd, watch_cmd  # noqa: F401
from locomesh.cli.client import EXIT_OK
from locomesh.cli.common import TextTable
from locomesh.cli.main import main
from locomesh.cli.status_cmd import format_status as format_node_status

WIDTHS = (80, 120)
PEER = "12D3KooWQYhTNQdmr3ArTeUHRYzFg94BKyTkoWBDWez9kSCVe2Xo"


def record(round_number: int) -> dict:
    """A `run.status` history record, with figures as wide as a long run's."""
    return {"round": round_number, "state_hash": "ab" * 32, "synced": False, "contributors": 12,
            "train_loss": 2.5123, "eval_loss": 2.4321, "floor": 1.6259, "payload_bytes": 96_500,
            "bytes_fetched": 1_931_000, "seconds": 1234.5, "train_seconds": 1101.5, "exchange_seconds": 120.5,
            "fetch_seconds": 100.25, "aggregate_seconds": 20.125, "finished_at": 1_700_000_000.0 + round_number}


def run_status(rounds: range) -> dict:
    return {"run_id": "r" * 52, "phase": "train", "training": True, "round": rounds[-1], "certified": rounds[-1],
            "members": 1, "peers": 0, "waiting": {"for": "our inner steps", "on": []}, "member_peers": [],
            "history": [record(number) for number in rounds]}


class Daemon:
    def __init__(self, answer: dict) -> None:
        self.answer = answer

    def call(self, method: str, params: dict | None = None) -> dict:
        return self.answer


def drawn(renderable, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def row_of(lines: list[str]) -> str:
    return next(line for line in lines if "1200" in line)


def assert_fits(lines: list[str], width: int) -> None:
    assert lines and all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    assert not any("…" in line for line in lines), "a cell was cut"


@pytest.mark.parametrize("width", WIDTHS)
def test_run_status_on_a_terminal_fits_it_and_cuts_no_cell(width, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("COLUMNS", str(width))  # rich's width where stdout is not a terminal
    monkeypatch.setattr(run_cmd, "on_terminal", lambda: True)
    monkeypatch.setattr(common, "on_terminal", lambda: True)
    monkeypatch.setattr(run_cmd.RpcClient, "for_data_dir", classmethod(lambda cls, *a, **k: Daemon(run_status(
        range(1198, 1201)))))
    assert main(["run", "status", "r", "--data-dir", str(tmp_path)]) == EXIT_OK
    out = capsys.readouterr().out
    lines = out.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if line.startswith("ROUND")):
                  next(i for i, line in enumerate(lines) if line.startswith("  (DONE AT"))]
    assert_fits(table, width)  # the lines around it are plain print()s: the terminal wraps those
    assert "…" not in out
    for cell in ("1200", "2.4321", time.strftime("%H:%M:%S", time.localtime(1_700_001_200.0)), "1234.5"):
        assert cell in "\n".join(table), f"{cell} is shown whole"


@pytest.mark.parametrize("width", WIDTHS)
def test_run_watch_live_table_fits_the_terminal(width, monkeypatch):
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    monkeypatch.setattr(rich, "_console", console)  # the console rich's Live draws on
    args = watch_cmd.argparse.Namespace(run_id="r", interval=0.01, timeout=None, until=1200)
    assert watch_cmd._watch_live(args, Daemon(run_status(range(1181, 1201)))) == EXIT_OK
    lines = console.export_text().splitlines()
    assert lines[0].startswith(f"run {'r' * 16}…:")  # the run ID's start, shortened on purpose
    assert_fits(lines[1:], width)
    assert all(f"{number}" in "\n".join(lines) for number in range(1181, 1201)), "every round shown"


def test_a_narrow_terminal_leaves_out_the_optional_columns_first_and_names_them():
    header = ("ROUND", "DONE AT", "EVAL LOSS", "SENT", "FETCH (s)", "ROUND (s)")
    table = TextTable.columns(header, [("1200", "22:33:20", "2.4321", "94.2 KiB", "100.2", "1234.5")],
                              optional=("FETCH (s)", "SENT"))
    assert table.splitlines()[0].split("  ")[-1] == "ROUND (s)", "the plain text keeps every column"
    wide = drawn(table.to_rich(), 80).splitlines()
    assert_fits(wide, 80)
    assert "94.2 KiB" in row_of(wide) and "100.2" in row_of(wide), "each cell on one line"
    narrow = drawn(table.to_rich(), 44).splitlines()
    assert_fits(narrow, 44)
    assert "94.2 KiB" in row_of(narrow) and "100.2" not in "\n".join(narrow)
    assert "too narrow for FETCH (s): a wider terminal or --json shows them" in " ".join(line.strip() for line in narrow)
    tiny = drawn(table.to_rich(), 20).splitlines()
    assert_fits(tiny, 20)
    assert [line.rstrip() for line in tiny[:2]] == ["ROUND      1200", "DONE AT    22:33:20"], "one row: its pairs"


def test_status_on_a_terminal_folds_a_long_address_instead_of_cutting_it(monkeypatch, capsys):
    address = f"/ip4/192.168.100.200/tcp/40001/p2p/{PEER}"
    status = {"peer_id": PEER, "listen_addrs": [address], "dial_addrs": [{"addr": address, "kind": "LAN only"}]}
    text = drawn(format_node_status(status).to_rich(), 80)
    assert_fits(text.splitlines(), 80)
    assert address in "".join(line.strip() for line in text.splitlines() if not line.startswith("peer id"))
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.setattr(common, "on_terminal", lambda: True)
    common.emit(format_node_status(status))
    out = capsys.readouterr().out.splitlines()
    assert out[-2] == f"  LAN only  --bootstrap {address}", "the ready line whole, for the terminal to wrap"
