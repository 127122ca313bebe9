"""`locomesh sim`: runs a scenario and writes its report as JSON and markdown."""

from __future__ import annotations

import json

import pytest

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


def test_sim_passes_scenario_options_to_the_scenario(tmp_path):
    path = tmp_path / "train.json"
    argv = ["sim", "train", "--nodes", "4", "--seed", "2", "--report", str(path),
            "-o", "rounds=1", "-o", "inner-steps=5", "-o", "byzantine=1", "-o", "delayed_updates=no"]
    assert main(argv) == 0
    report = json.loads(path.read_text())
    assert report["config"]["rounds"] == 1 and report["config"]["inner_steps"] == 5
    assert report["config"]["byzantine"] == 1 and report["config"]["delayed_updates"] is False
    assert report["summary"]["nodes that reached the last round"] == 4


@pytest.mark.parametrize(
    ("option", "complaint"),
    [
        ("no_such_option=1", "has no option 'no_such_option'; its options (defaults): rounds=3"),
        ("rounds", "is not KEY=VALUE"),
        ("rounds=2.5", "option rounds takes an integer, not '2.5'"),
        ("latency=fast", "option latency takes a number, not 'fast'"),
        ("latency=nan", "must be a finite number ≥ 0"),
        ("byzantine=-1", "must be a finite number ≥ 0"),
        ("delayed_updates=maybe", "option delayed_updates takes true or false"),
        ("nodes=5", "has no option 'nodes'"),
    ],
)
def test_sim_refuses_a_bad_scenario_option_before_it_starts(option, complaint, capsys, tmp_path):
    assert main(["sim", "train", "--report", str(tmp_path / "r.json"), "-o", option]) == 2
    assert complaint in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_sim_train_draws_the_plots_of_its_rounds_beside_the_report(tmp_path, capsys):
    path = tmp_path / "train.json"
    assert main(["sim", "train", "--nodes", "4", "--seed", "2", "--report", str(path), "-o", "rounds=2",
                 "-o", "inner-steps=5"]) == 0
    report = json.loads(path.read_text())
    contributions = next(entry for entry in report["tables"] if entry["title"] == "Contributions")
    assert contributions["rows"] == [[f"n000{i}", "honest", 2] for i in range(4)]  # all four in both certified sets
    for name in ("round_timeline", "contributions"):
        png = tmp_path / f"train-{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert f"](train-{name}.png)" in path.with_suffix(".md").read_text()
    assert not (tmp_path / "train-loss_by_round.png").exists()
    assert "not drawn: loss by round: the simulator models training time" in capsys.readouterr().out


def test_sim_without_rounds_draws_no_plot(tmp_path):
    assert main(["sim", "connectivity", "--nodes", "5", "--seed", "1", "--report", str(tmp_path / "c.json")]) == 0
    assert sorted(path.name for path in tmp_path.iterdir()) == ["c.json", "c.md"]
    assert "## Plots" not in (tmp_path / "c.md").read_text()
