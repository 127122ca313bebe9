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
    assert list(report)[:3] == ["scenario", "overview", "verdict"]  # the JSON starts with what came out
    assert path.with_suffix(".md").read_text().startswith("# netsim: connectivity")
    captured = capsys.readouterr()
    assert "Gossip (flood) delivery" in captured.out and "wrote" in captured.err and "verdict: PASS" in captured.err


def test_the_connectivity_report_has_no_empty_relay_or_hole_punch_columns(tmp_path):
    """Those protocols are scenario nat's: the direct-only dials table no longer promises them."""
    path = tmp_path / "c.json"
    assert main(["sim", "connectivity", "--nodes", "6", "--seed", "1", "--report", str(path)]) == 0
    dials = json.loads(path.read_text())["tables"][0]
    assert "relay" not in dials["columns"] and "hole-punch" not in dials["columns"]
    assert "stay empty" not in dials["note"] and "locomesh sim nat" in dials["note"]


# Each scenario small enough to run in seconds, and terms its glossary must explain.
SMALL_RUNS = {
    "connectivity": (["--nodes", "8"], ["flood degree", "flood mesh components", "NAT types", "delivery ratio"]),
    "dht": (["--nodes", "6", "-o", "join_window=5", "-o", "settle=10", "-o", "lookup_window=20", "-o", "lookups=6"],
            ["DHT", "churn", "provider lookup", "success rate"]),
    "checkpoint": (["--nodes", "3", "-o", "probe_providers=2", "-o", "probe_size=1048576", "-o",
                    "probe_chunk_size=65536", "-o", "join_window=5", "-o", "model_width=64"],
                   ["provider", "speedup", "chunks from seeder"]),
    "train": (["--nodes", "3", "-o", "rounds=1", "-o", "inner_steps=5"],
              ["splits (synced)", "certified", "contributors", "compute share", "held KiB"]),
    "nat": (["--nodes", "6", "-o", "relays=3", "-o", "settle=30", "-o", "upgrade_wait=30", "-o", "relay_outage=0"],
            ["hole punch", "relay", "model says", "direct share"]),
}


@pytest.mark.parametrize("scenario", sorted(SMALL_RUNS))
def test_every_report_starts_with_an_overview_and_a_verdict_and_ends_with_a_glossary(scenario, tmp_path, capsys):
    argv, terms = SMALL_RUNS[scenario]
    path = tmp_path / "r.json"
    assert main(["sim", scenario, "--seed", "1", "--report", str(path), *argv]) == 0
    report = json.loads(path.read_text())
    assert report["verdict"]["result"] == "PASS" and report["verdict"]["criteria"]
    assert all(entry["passed"] for entry in report["verdict"]["criteria"])
    assert 2 <= report["overview"].count(". ") + 1 <= 4  # two or three plain sentences (one may end in a list)
    printed = capsys.readouterr().out
    markdown = path.with_suffix(".md").read_text()
    for text in (printed, markdown):
        lines = text.splitlines()
        assert lines[0] == f"# netsim: {scenario}" and lines[2] == report["overview"]
        assert lines[4].startswith("**Verdict: PASS**, judged by: ")
        assert lines[4].count(": pass") == len(report["verdict"]["criteria"])
        glossary = text.partition("\n## Glossary\n")[2]
        for term in [*terms, "virtual seconds"]:
            assert f"- **{term}**: " in glossary, term
    assert set(terms) <= set(report["glossary"])


@pytest.mark.parametrize(
    ("argv", "failed"),
    [
        # No node dials anyone: no mesh forms.
        (["connectivity", "--nodes", "6", "-o", "degree=0"],
         "the largest mesh holds at least 90% of the live nodes (measured 1 of 4): FAIL"),
        # The run is stopped a virtual second after the joins, long before its round is certified.
        (["train", "--nodes", "3", "-o", "rounds=1", "-o", "inner_steps=5", "-o", "run_timeout=1"],
         "every live node reached the last round (measured 0 of 3): FAIL"),
    ],
)
def test_sim_exits_1_when_the_verdict_is_fail(argv, failed, tmp_path, capsys):
    path = tmp_path / "r.json"
    assert main(["sim", *argv, "--seed", "1", "--report", str(path)]) == 1
    report = json.loads(path.read_text())
    assert report["verdict"]["result"] == "FAIL"
    captured = capsys.readouterr()
    assert "**Verdict: FAIL**" in captured.out and failed in captured.out and "verdict: FAIL" in captured.err


def test_sim_help_lists_every_scenario_with_its_options(capsys):
    from locomesh.netsim.scenarios import CONFIGS, SCENARIOS, option_defaults, shows

    with pytest.raises(SystemExit) as exit_:
        main(["sim", "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for scenario in SCENARIOS:
        assert f"\n{scenario}: {shows(scenario)}\n" in text
    assert "    -o rounds=3                training rounds to run" in text
    assert "-o min_success=0.99" in text and "-o topology=homes" in text and "-o delayed_updates=false" in text
    assert "Exit codes: 0 PASS, 1 FAIL, 2 bad arguments." in text
    for scenario in CONFIGS:
        for name in option_defaults(scenario):
            assert f"-o {name}=" in text, (scenario, name)
    with pytest.raises(SystemExit):
        main(["sim", "dht", "--help"])
    only = capsys.readouterr().out
    assert "\ndht: " in only and "-o provider_limit=1" in only and "\ntrain: " not in only


def test_every_scenario_option_explains_itself():
    from locomesh.netsim.scenarios import CONFIGS
    from locomesh.netsim.scenarios.options import option_fields

    missing = [(scenario, field.name) for scenario, config in CONFIGS.items() for field in option_fields(config)
               if len(field.metadata.get("help", "")) < 10]
    assert missing == []


def test_a_verdict_passes_only_when_every_criterion_does():
    from locomesh.netsim.report import criterion, passed, to_json, verdict, verdict_line

    fine = criterion("every node arrived", "3 of 3", True)
    late = criterion("at least 99% on time", 0.5, False)
    assert verdict([fine])["result"] == "PASS" and verdict([fine, late])["result"] == "FAIL"
    assert verdict_line(verdict([fine, late])) == (
        "FAIL, judged by: every node arrived (measured 3 of 3): pass; at least 99% on time (measured 0.500): FAIL")
    report = {"tables": [], "summary": {"b": 1, "a": 2}, "verdict": verdict([late]), "scenario": "x", "overview": "o"}
    assert not passed(report) and passed({"scenario": "x"})
    assert list(json.loads(to_json(report))) == ["scenario", "overview", "verdict", "summary", "tables"]
    assert list(json.loads(to_json(report))["summary"]) == ["a", "b"]  # below the top: keys sorted, as before


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
    assert report["verdict"]["result"] == "PASS"
    assert report["verdict"]["criteria"][0]["criterion"] == "every round was certified despite the hostile nodes (1 byzantine)"


@pytest.mark.parametrize(
    ("option", "complaint"),
    [
        ("no_such_option=1", "has no option 'no_such_option'; its options (defaults):\ntrain: "),
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


def test_an_unknown_option_lists_the_scenarios_options_with_their_help(capsys, tmp_path):
    assert main(["sim", "dht", "--report", str(tmp_path / "r.json"), "-o", "lookup=5"]) == 2
    err = capsys.readouterr().err
    assert "scenario 'dht' has no option 'lookup'; its options (defaults):" in err
    assert "-o lookups=0" in err and "(0: as many as nodes)" in err


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
