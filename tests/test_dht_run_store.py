"""The data dir's runs (`locomesh.node.runs.store`) and the `run` command's argument parsing."""

from __future__ import annotations

import pytest

from locomesh.cli.run_cmd import parse_setting
from locomesh.node.runs.store import RunStore
from locomesh.protocol import ProtocolError
from locomesh.protocol.runs import format_run_id, run_id, sign_manifest


def manifest(identity, task: str = "toy", created: int = 1_800_000_000) -> bytes:
    return sign_manifest(identity, task=task, created=created, public=True)


def test_runs_are_kept_across_a_reload(tmp_path, identity_factory):
    first, second = manifest(identity_factory(1)), manifest(identity_factory(1), task="other", created=1_800_000_001)
    store = RunStore(tmp_path)
    store.add(first, "created")
    store.add(second, "seen")
    again = RunStore(tmp_path).load()
    assert [(run.manifest, run.origin) for run in again] == [(first, "created"), (second, "seen")]


def test_a_stronger_origin_wins_and_a_weaker_one_does_not_demote(tmp_path, identity_factory):
    value = manifest(identity_factory(1))
    store = RunStore(tmp_path)
    assert store.add(value, "seen").origin == "seen"
    assert store.add(value, "joined").origin == "joined"
    assert store.add(value, "seen").origin == "joined"
    assert [run.origin for run in RunStore(tmp_path).load()] == ["joined"]


def test_bad_files_are_skipped_and_left_in_place(tmp_path, identity_factory, caplog):
    good, other = manifest(identity_factory(1)), manifest(identity_factory(2))
    store = RunStore(tmp_path)
    store.add(good, "created")
    folder = tmp_path / "runs" / "created"
    (folder / f"{format_run_id(run_id(other))}.manifest").write_bytes(other[:-1])  # truncated
    (folder / f"{format_run_id(run_id(good)).replace('a', 'b', 1)}.manifest").write_bytes(other)  # misnamed
    loaded = RunStore(tmp_path).load()
    assert [run.manifest for run in loaded] == [good]
    assert len(list(folder.iterdir())) == 3
    assert caplog.text.count("skipping run file") == 2


def test_only_signed_manifests_are_added(tmp_path):
    with pytest.raises(ProtocolError):
        RunStore(tmp_path).add(b"\x80", "created")
    with pytest.raises(ValueError):
        RunStore(tmp_path).add(b"\x80", "stolen")


@pytest.mark.parametrize(
    "text, expected",
    [("lr=0.01", ("lr", 0.01)), ("vocab=256", ("vocab", 256)), ("shuffle=True", ("shuffle", True)),
     ("path=a=b", ("path", "a=b")), (" name = x", ("name", " x")), ("empty=", ("empty", ""))],
)
def test_settings_are_typed(text, expected):
    assert parse_setting(text) == expected


@pytest.mark.parametrize("text", ["novalue", "=1", " =1"])
def test_settings_without_a_key_are_refused(text):
    with pytest.raises(ValueError):
        parse_setting(text)
