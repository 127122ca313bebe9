"""Which round a new member's join names (`RoundService._write_join`): never one its contributors
already train, so peers joining a few seconds apart do not start a round late and hold it up; and
the leave/join pair a paused node writes (`run pause` / `run resume`) in the run's CRDT."""

from __future__ import annotations

from types import SimpleNamespace

from locomesh.node.rounds.machine import Timing
from locomesh.node.rounds.service import RoundService
from locomesh.protocol import peer_id_from_public_key

from .test_crdt_support import joined_replica, keys

A, B, NEW = keys(3)


def join_round(replica, *, connected, min_peers=1) -> tuple[int, list]:
    """The round NEW's join names, and the ops it wrote, with `connected` the peers it reaches."""
    written = []

    def write(run_id, op_type, **fields):
        written.append((op_type, fields))
        return replica.create(NEW, op_type, **fields)

    service = RoundService(None, SimpleNamespace(ban_reason=lambda run_id: None, write=write), None)
    peers = {peer_id_from_public_key(key.public_key) for key in connected}
    service._node = SimpleNamespace(identity=SimpleNamespace(public_key=NEW.public_key), peers=peers)
    return service._write_join(replica, Timing(min_peers=min_peers)), written


def test_a_joiner_skips_a_round_its_reachable_contributors_already_train():
    first, written = join_round(joined_replica([A]), connected=[A])  # the creator trains round 1 alone
    assert first == 2 and written == [("join", {"round": 2})]


def test_a_joiner_takes_the_next_round_while_the_run_waits_for_min_peers():
    first, _ = join_round(joined_replica([A, B]), connected=[A, B], min_peers=3)
    assert first == 1  # two of three: round 1 has not started, NEW completes it


def test_contributors_out_of_reach_do_not_count_so_an_abandoned_run_stays_joinable():
    first, _ = join_round(joined_replica([A, B]), connected=[])
    assert first == 1


def test_commits_out_mean_a_round_under_way_whatever_the_counts():
    replica = joined_replica([A, B])
    replica.create(A, "commit", round=1, hash=b"\x07" * 32, size=10)
    first, _ = join_round(replica, connected=[], min_peers=3)
    assert first == 2


def test_a_member_that_left_to_sit_out_leaves_the_electorate_and_joins_again():
    replica = joined_replica([A, B, NEW])
    assert NEW.public_key in replica.electorate(1)
    replica.create(NEW, "leave", round=0)  # paused before round 1: nobody waits for it
    assert NEW.public_key not in replica.electorate(1) and NEW.public_key not in replica.state.members
    replica.create(NEW, "join", round=2)  # resumed while round 1 is under way
    assert NEW.public_key not in replica.electorate(1) and NEW.public_key in replica.electorate(2)
    assert NEW.public_key in replica.state.members


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

    from locomesh.node.rounds.service import NOT_JOINED
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
