"""`locomesh sim`: runs a scenario and writes its report as JSON and markdown."""

from __future__ import annotations

import json

from locomesh.cli.main import main


def test_sim_writes_json_and_markdown(tmp_path, capsys):
    path = tmp_path / "report.json"
    assert main(["sim", "connectivity", "--nodes", "8", "--seed", "3", "--report", str(path)]) == 0
    report = json.loads(path.read_text())
    assert report["scenario"] == "connectivity" and report["summary"]["nodes"] == 8
    assert path.with_suffix(".md").read_text().startswith("# netsim: connectivity")
    captured = capsys.readouterr()
    assert "Gossip (flood) delivery" in captured.out and "wrote" in captured.err


def test_sim_refuses_an_unknown_scenario(capsys):
    assert main(["sim", "no-such-scenario"]) == 2
    assert "connectivity" in capsys.readouterr().err.partition("known:")[2]
