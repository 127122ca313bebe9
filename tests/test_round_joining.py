"""The join a new member writes (`RoundService._write_join`): it names the next round, whose
certified value admits it (crdt/membership.py); a key admitted at genesis may train that round
already, unless its commits are out (it would commit after the cut); a join is written once. And
a member that leaves: out of the electorate once a value names its leave, back by committing."""

from __future__ import annotations

from types import SimpleNamespace

from locomesh.node.rounds.machine import Timing
from locomesh.node.rounds.service import RoundService

from .test_crdt_support import certify, joined_replica, keys

A, B, NEW = keys(3)


def join_round(replica, *, min_peers=1) -> tuple[int, list]:
    """The first round NEW may train after its join, and the ops it wrote (it reaches no peer)."""
    written = []

    def write(run_id, op_type, **fields):
        written.append((op_type, fields))
        return replica.create(NEW, op_type, **fields)

    service = RoundService(None, SimpleNamespace(ban_reason=lambda run_id: None, write=write), None)
    service._node = SimpleNamespace(identity=SimpleNamespace(public_key=NEW.public_key), peers=set())
    return service._write_join(replica, Timing(min_peers=min_peers)), written


def test_an_admitted_joiner_names_the_next_round_and_may_train_it_with_its_join():
    replica = joined_replica([A], admitted=[NEW.public_key])  # the creator trains round 1 alone
    assert NEW.public_key not in replica.contributors(1)
    first, written = join_round(replica)
    assert first == 1 and written == [("join", {"round": 1})]
    assert NEW.public_key in replica.contributors(1), "round 1's value may admit it with its payload"
    certify(replica, [A, NEW])
    assert replica.chain.certificates[1].accepted == {A.public_key, NEW.public_key}
    assert NEW.public_key in replica.electorate(2)


def test_a_fresh_key_joins_the_same_way_and_trains_once_a_round_draws_it():
    replica = joined_replica([A])  # an open run: NEW is admitted by nobody
    first, written = join_round(replica)
    assert written == [("join", {"round": 1})] and first == 1
    assert NEW.public_key not in replica.contributors(1), "a fresh key's payload is not taken with its join"
    certify(replica, [A])
    assert NEW.public_key in replica.state.members and NEW.public_key not in replica.electorate(2)
    assert NEW.public_key in replica.contributors(2), "the only fresh key: round 2's slate draws it"


def test_commits_out_mean_a_round_under_way_whatever_the_counts():
    replica = joined_replica([A, B], admitted=[B.public_key, NEW.public_key])
    replica.create(A, "commit", round=1, hash=b"\x07" * 32, size=10)
    first, written = join_round(replica, min_peers=3)
    assert first == 2, "it would commit after round 1's cut: it trains from round 2"
    assert written == [("join", {"round": 1})], "round 1's value admits it all the same"


def test_a_join_is_written_once_while_it_waits_and_never_by_a_member():
    replica = joined_replica([A], admitted=[NEW.public_key])
    assert join_round(replica)[1] == [("join", {"round": 1})]
    assert join_round(replica) == (1, []), "a join of ours waits for a value: not another"
    certify(replica, [A])
    assert NEW.public_key in replica.state.members
    assert join_round(replica) == (2, []), "on the roster: nothing to join"


def test_a_member_that_left_leaves_the_electorate_once_a_value_names_it_and_is_back_by_committing():
    replica = joined_replica([A, B, NEW])
    certify(replica, [A, B, NEW])
    assert NEW.public_key in replica.electorate(2)
    replica.create(NEW, "leave", round=2)
    assert NEW.public_key in replica.electorate(2), "a leave takes effect with the value that names it"
    certify(replica, [A, B, NEW], contributors=[A, B])
    assert NEW.public_key not in replica.electorate(3), "nobody waits for it from the next round on"
    assert NEW.public_key in replica.state.members and NEW.public_key in replica.contributors(3), "it keeps its say"
    certify(replica, [A, B, NEW])  # it commits again, and round 3 counts its payload
    assert NEW.public_key in replica.chain.certificates[3].accepted and NEW.public_key in replica.electorate(4)


def test_a_participation_sits_out_when_paused_or_when_its_schedule_says_so_asking_it_sparingly():
    import math

    import trio
    import trio.testing

    from locomesh.node.rounds.participation import SCHEDULE_SECONDS, RunParticipation

    answers = iter(["outside the schedule 22:00-07:00", None])
    asked = []

    def schedule():
        asked.append(trio.current_time())
        return next(answers)

    participation = SimpleNamespace(paused=False, schedule=schedule, _schedule_said=(-math.inf, None))

    async def main():
        assert RunParticipation.sitting_out(participation) == "outside the schedule 22:00-07:00"
        await trio.sleep(SCHEDULE_SECONDS / 2)
        assert RunParticipation.sitting_out(participation) == "outside the schedule 22:00-07:00"  # not asked again
        await trio.sleep(SCHEDULE_SECONDS)
        assert RunParticipation.sitting_out(participation) is None
        participation.paused = True
        assert RunParticipation.sitting_out(participation).startswith("paused")

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert len(asked) == 2


async def test_run_status_tells_an_unknown_run_from_one_this_node_has_not_joined(tmp_path):
    """Issue #37: `run status` of a mistyped ID said "this node has not joined run ..." as if the run
    existed. An unknown run is "no such run"; a run this node knows (looked up, browsed) but never
    joined says how to join it; text that is no run ID stays a bad parameter."""
    import pytest

    from locomesh.node.rounds.answers import NOT_JOINED
    from locomesh.node.rpc.dispatch import INVALID_PARAMS, RpcError
    from locomesh.node.runs.registry import RUN_NOT_FOUND, RunRegistryService
    from locomesh.protocol.runs import format_run_id, run_id, sign_manifest

    registry = RunRegistryService(tmp_path)
    service = RoundService(registry, None, None)
    manifest = sign_manifest(A, task="synthetic-lm", created=1_700_000_000)
    full = format_run_id(run_id(manifest))

    async def refusal(text: str) -> RpcError:
        with pytest.raises(RpcError) as refused:
            await service._rpc_status(text)
        return refused.value

    unknown = await refusal(full)
    assert unknown.code == RUN_NOT_FOUND and unknown.message.startswith(f"no such run: this node knows no run {full}")
    assert (await refusal(full[:16])).message.startswith("no such run: no run this node knows starts with")
    registry.store.add(manifest, "seen")  # `run info` looked it up
    for text in (full, full[:16]):
        known = await refusal(text)
        assert known.code == NOT_JOINED and known.message == (
            f"this node has not joined run {full[:16]}; join it with: locomesh run join {full}")
    assert (await refusal("not-a-run-id")).code == INVALID_PARAMS


def window(inside: bool) -> str:
    """A schedule window that holds local time now (an hour on each side), or one that starts in two hours."""
    from datetime import datetime, timedelta

    start = datetime.now() + timedelta(hours=-1 if inside else 2)
    return f"{start:%H:%M}-{start + timedelta(hours=2 if inside else 1):%H:%M}"


async def test_run_join_outside_the_schedule_says_training_starts_with_the_next_window(tmp_path):
    """Issue #37: `run join` said "training from round 5" while the node sat rounds out until its
    schedule's window opened."""
    from datetime import datetime

    from locomesh.cli.run_view import joined_text
    from locomesh.node.runs.registry import RunRegistryService
    from locomesh.node.schedule import TrainingSchedule
    from locomesh.protocol.runs import format_run_id, run_id, sign_manifest

    registry = RunRegistryService(tmp_path)
    manifest = sign_manifest(A, task="synthetic-lm", created=1_700_000_000)
    registry.store.add(manifest, "seen")
    full = format_run_id(run_id(manifest))

    async def joined(schedule: TrainingSchedule) -> dict:
        service = RoundService(registry, None, None, schedule=schedule)

        async def join(manifest: bytes) -> int:  # a participation asks the schedule as `RunParticipation` does
            participation = SimpleNamespace(sitting_out=lambda: schedule.reason_to_sit_out(datetime.now()))
            service.participations[run_id(manifest)] = (participation, None)
            return 5

        service.join = join
        return await service._rpc_join(full)

    outside = window(inside=False)
    result = await joined(TrainingSchedule([outside]))
    assert (result["joins_at"], result["outside_schedule"]) == (5, outside)
    assert result["sitting_out"] == f"outside the schedule {outside}"
    assert joined_text(result) == f"joined; outside this node's schedule ({outside}): training from the next window"
    result = await joined(TrainingSchedule([window(inside=True)]))
    assert (result["sitting_out"], result["outside_schedule"]) == (None, None)
    assert joined_text(result) == "joined; training from round 5"
    assert joined_text({**result, "sitting_out": "on battery"}) == "joined; sitting rounds out for now: on battery"


async def test_run_status_says_a_joined_run_is_being_rejoined_after_a_restart_until_its_participation_starts(
        tmp_path, nursery, monkeypatch, capsys):
    """Issue #37: for seconds after a restart, `run status` said "this node has not joined run ..."
    of a run it had joined, until the automatic rejoin (`RoundService._resume`) was done."""
    import pytest
    import trio
    import trio.testing

    from locomesh.cli import run_cmd
    from locomesh.cli.main import main
    from locomesh.node.rounds.history import RoundHistory, mark_left
    from locomesh.node.rounds.answers import NOT_JOINED
    from locomesh.node.rpc.dispatch import RpcError
    from locomesh.node.runs.registry import RunRegistryService
    from locomesh.protocol.runs import format_run_id, run_id, sign_manifest

    from .test_cli_status import ScriptedDaemon, record

    registry = RunRegistryService(tmp_path)
    manifests = [sign_manifest(A, task="synthetic-lm", created=1_700_000_000 + n) for n in range(2)]
    rejoined, left = (run_id(manifest) for manifest in manifests)
    for manifest in manifests:
        registry.store.add(manifest, "joined")
    mark_left(tmp_path, left, 3)  # `run leave` before the restart: not taken up again
    RoundHistory.load(tmp_path, rejoined, maxlen=10).append(record(4))
    loaded = trio.Event()
    resumed = []

    async def join(manifest: bytes, *, resuming: bool = False) -> int:  # building the model, meeting the participants
        resumed.append((run_id(manifest), resuming))
        await loaded.wait()
        raise RpcError(-32000, "cannot train this run here: not enough memory")

    service = RoundService(registry, SimpleNamespace(replicas={}), SimpleNamespace(uploads=None, scores=None),
                           shard_service=lambda *args, **kwargs: SimpleNamespace(register=lambda: None, bytes_served=0))
    service.join = join
    node = SimpleNamespace(rpc=SimpleNamespace(register=lambda *args: None), add_status_field=lambda *args: None,
                           services=[], peers=set(), identity=SimpleNamespace(public_key=NEW.public_key))
    await nursery.start(service.run, node)
    await trio.testing.wait_all_tasks_blocked()
    assert resumed == [(rejoined, True)], "only the run not left is taken up again"

    status = await service._rpc_status(format_run_id(rejoined))
    assert (status["phase"], [r["round"] for r in status["history"]]) == ("rejoining", [4])
    assert (await service._rpc_status(format_run_id(left)))["phase"] == "left"
    with pytest.raises(RpcError) as paused:
        await service._rpc_pause(format_run_id(rejoined))
    assert paused.value.message.startswith(f"rejoining run {format_run_id(rejoined)[:16]} after the restart")
    monkeypatch.setattr(run_cmd.RpcClient, "for_data_dir", lambda *args, **kwargs: ScriptedDaemon([status]))
    assert main(["run", "status", format_run_id(rejoined), "--data-dir", str(tmp_path)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith(f"rejoining run {format_run_id(rejoined)} after the restart: ") and "round    4:" in shown

    loaded.set()  # the rejoin failed (logged): the run is not joined any more
    await trio.testing.wait_all_tasks_blocked()
    with pytest.raises(RpcError) as refused:
        await service._rpc_status(format_run_id(rejoined))
    assert refused.value.code == NOT_JOINED and "has not joined" in refused.value.message
