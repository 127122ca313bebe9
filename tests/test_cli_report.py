"""`locomesh run report`, the round views of `run status` / `run watch`, the rich tables and the
progress lines, on a status recorded from three real daemons (tests/data/run_status_3_daemons.json:
`run status --json` of node 0 after four rounds with contribution scores on)."""

from __future__ import annotations

import io
import json
import struct
import time
from pathlib import Path

import pytest

from locomesh.cli.common import TextTable, emit
from locomesh.cli.main import main
from locomesh.cli.plots import PLOTS
from locomesh.cli.progress import PlainView
from locomesh.cli.report_cmd import WAITING, series_from_status
from locomesh.cli.run_view import ROUND_COLUMNS, phase_text, round_line, round_table

RECORDED = Path(__file__).parent / "data" / "run_status_3_daemons.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def status() -> dict:
    return json.loads(RECORDED.read_text())


def png_size(path: Path) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (which must come first)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR", path
    return struct.unpack(">II", data[16:24])


def test_a_report_writes_every_plot_and_a_summary_of_the_run(status, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["run", "report", status["run_id"], "--from", str(RECORDED), "--out", str(out)]) == 0
    for name in PLOTS:
        assert png_size(out / f"{name}.png") == (750, 420), name  # 7.5 x 4.2 inches at 100 dpi
        assert (out / f"{name}.png").stat().st_size > 10_000, "a plot with nothing drawn is a few KB"
    summary = (out / "summary.md").read_text()
    assert f"# Run {status['run_id']}" in summary
    assert "2.7956 at the start (the run's initial weights) → 2.6504 after round 4 (floor 1.6259: 1.0245 above it)" in summary
    assert "4 finished here, 1 to 4 (4 computed, 0 synced)" in summary
    assert "0.37 MiB of payloads published, 0.83 MiB of others' fetched" in summary
    assert summary.count("| 4 | +0.03") == 3, "three members, each in all four certified sets, each scored"
    assert all(f"]({name}.png)" in summary for name in PLOTS)
    assert json.loads((out / "status.json").read_text()) == status, "the report keeps what it was made from"
    assert capsys.readouterr().out.splitlines()[-1] == f"wrote {out / 'summary.md'}"


def test_a_report_says_which_plots_it_could_not_draw_and_why(status, tmp_path, capsys):
    for record in status["history"]:
        record.update(eval_loss=None, synced=True, seconds=0.0, payload_bytes=0)  # as a node that only synced
    status.update(initial_eval_loss=None, contributions={}, scores={})
    saved = tmp_path / "status.json"
    saved.write_text(json.dumps(status))
    out = tmp_path / "report"
    assert main(["run", "report", status["run_id"], "--from", str(saved), "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert set(result["skipped"]) == set(PLOTS)
    assert result["files"] == [str(out / "status.json"), str(out / "summary.md")]
    assert not list(out.glob("*.png"))
    summary = (out / "summary.md").read_text()
    assert "- not drawn: loss by round: no round this node finished has an eval loss" in summary
    assert "- not drawn: round timeline: no round has timings" in summary
    assert "**eval loss**: not measured" in summary



def test_a_score_not_yet_known_gets_no_bar_and_a_dash_in_the_summary(status, tmp_path):
    unknown = sorted(status["scores"])[0]
    status["scores"][unknown] = {"rounds": [{"round": 4, "score": None}], "mean": None}  # fewer than three reports
    assert len(series_from_status(status).scores) == len(status["scores"]) - 1
    saved = tmp_path / "status.json"
    saved.write_text(json.dumps(status))
    assert main(["run", "report", status["run_id"], "--from", str(saved), "--out", str(tmp_path / "report")]) == 0
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert summary.count("| 4 | +0.03") == 2 and summary.count("| 4 | — |") == 1

def test_a_report_refuses_the_status_of_another_run(status, tmp_path, capsys):
    other = "a" * len(status["run_id"])
    assert main(["run", "report", other, "--from", str(RECORDED), "--out", str(tmp_path / "r")]) == 2
    assert f"is not the `run status --json` of run {other}" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_report_takes_the_short_id_the_cli_prints(status, tmp_path, monkeypatch, capsys):
    """Issue #37: the daemon answers with the full ID; a short one (`run list`, `run browse`) was
    refused as "not the `run status --json` of run ..."."""
    from locomesh.cli.client import RpcClient

    daemon = type("Daemon", (), {"call": lambda self, method, params: status})()
    monkeypatch.setattr(RpcClient, "for_data_dir", classmethod(lambda cls, *args, **kwargs: daemon))
    short = status["run_id"][:16]
    assert main(["run", "report", short, "--out", str(tmp_path / "r"), "--data-dir", str(tmp_path)]) == 0, \
        capsys.readouterr().err
    assert (tmp_path / "r" / "summary.md").exists()


def test_the_timeline_splits_each_round_into_what_its_time_went_to(status):
    series = series_from_status(status)
    assert [point.round for point in series.rounds] == [1, 2, 3, 4]
    assert series.rounds[0].start == 0.0 and all(point.start > 0 for point in series.rounds[1:])
    for point, record in zip(series.rounds, status["history"]):
        spans = dict(point.spans)
        assert list(spans) == ["training", WAITING, "fetching payloads", "outer step"]
        assert spans["training"] == record["train_seconds"] and spans["fetching payloads"] == record["fetch_seconds"]
        assert sum(spans.values()) == pytest.approx(record["seconds"])
        assert point.bytes_sent == record["payload_bytes"]
    synced = series_from_status({**status, "history": [{**status["history"][0], "synced": True, "seconds": 0.0}]})
    assert synced.rounds[0].spans == () and synced.rounds[0].start is None


def test_a_round_reads_the_same_as_a_line_and_as_a_table_row(status):
    record = status["history"][1]  # recorded before outcomes were kept: a train loss says we contributed
    assert round_line(record) == ("round    2: eval loss 2.6776 (floor 1.6259), train loss 2.6643, contributed, "
                                  "3 payloads aggregated, 94.2 KiB sent, 188.6 KiB fetched; train 1.6 s, exchange "
                                  "0.3 s (fetch 0.1 s, outer step 0.0 s), round 2.4 s")
    table = round_table(status["history"])
    assert table.header == ROUND_COLUMNS and len(table.rows) == 4
    assert all(column in ("ROUND", "DONE AT", "OUR PART", "PAYLOADS", "SENT", "FETCHED") or "LOSS" in column
               or column == "FLOOR" or column.endswith("(s)") for column in ROUND_COLUMNS), "every time column names its unit"
    done_at = time.strftime("%H:%M:%S", time.localtime(record["finished_at"]))
    assert table.rows[1] == ("2", done_at, "2.6776", "1.6259", "2.6643", "contributed", "3", "94.2 KiB", "188.6 KiB",
                             "1.6", "0.1", "0.0", "0.3", "2.4")
    assert phase_text(status) == ("round 5: training (inner steps)", "waiting for our inner steps")
    assert phase_text({**status, "phase": "sync"}) == ("syncing the run's state (certified round 4)", "")


def test_a_table_is_plain_text_in_a_pipe_and_drawn_by_rich_on_a_terminal(capsys):
    from rich.console import Console

    table = TextTable.columns(("PEER", "NOTE"), [("a", "[bold]not markup[/bold]"), ("bb", "x")])
    assert table == "PEER  NOTE\na     [bold]not markup[/bold]\nbb    x"
    emit(table)  # pytest's captured stdout is not a terminal
    assert capsys.readouterr().out == table + "\n"
    console = Console(file=io.StringIO(), width=80, color_system=None)
    console.print(table.to_rich())
    drawn = console.file.getvalue()
    assert "PEER" in drawn and "[bold]not markup[/bold]" in drawn and drawn != table + "\n"
    pairs = TextTable.pairs([("round", 3), ("members", "a, b")])
    assert pairs == "round    3\nmembers  a, b" and pairs.rows == [("round", "3"), ("members", "a, b")]


def test_plain_progress_prints_a_line_per_change_and_never_redraws():
    out = io.StringIO()
    view = PlainView(out)
    download = {"id": "ab" * 32, "state": "manifest", "chunks_total": 0, "chunks_stored": 0, "bytes_fetched": 0,
                "bytes_total": 0, "error": None}
    view.step("join", "finding the run")
    view.step("join", "finding the run", "3 peers")  # the detail alone changed: no line
    view.download(download)
    view.download({**download, "state": "chunks", "chunks_total": 3, "chunks_stored": 1, "bytes_fetched": 2**20})
    view.download({**download, "state": "done", "chunks_total": 3, "chunks_stored": 3, "bytes_fetched": 3 * 2**20})
    view.download({**download, "state": "done", "chunks_total": 3, "chunks_stored": 3, "bytes_fetched": 3 * 2**20})
    view.done("join", "joined")
    assert out.getvalue().splitlines() == [
        "finding the run", f"checkpoint {'ab' * 6}: downloading", f"checkpoint {'ab' * 6}: done, 3 chunks, 3.0 MiB fetched",
        "joined",
    ]
