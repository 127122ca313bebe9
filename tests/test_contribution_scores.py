"""Contribution scores in the daemon, "report" policy: the `score` op (its limits and checks), the
scoring committee, the view's median (crdt/scores.py), a participation that measures and publishes
(node/rounds/scoring.py), and `run status` showing the history."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import trio

from locomesh.cli.run_cmd import format_status
from locomesh.crdt import Genesis, Replica, decode_op, evidence_fields, guilty_author
from locomesh.crdt.evidence import ban_reason
from locomesh.crdt.ops import seal_ops
from locomesh.crdt.ops.base import MAX_SET
from locomesh.crdt.ops.score import MAX_SCORE, SCORE_UNIT
from locomesh.crdt.scores import SCORING_COMMITTEE, round_scores, score_history, scores_json, scoring_committee
from locomesh.netsim.offload import run_inline
from locomesh.node.agreement.proposing import own_value
from locomesh.node.exchange.work import RoundWork
from locomesh.node.rounds import machine as rm
from locomesh.node.rounds.participation import RunParticipation
from locomesh.node.rounds.scoring import score_fields
from locomesh.protocol import ProtocolError, canonical, peer_id_from_public_key, unpack
from locomesh.protocol.runs import sign_manifest
from locomesh.training.adversary import AttackingParticipant
from locomesh.training.participant import Participant
from locomesh.training.run_settings import RoundSettings, RunSettingsError

from .test_crdt_support import H1, H2, certify, in_causal_order, joined_replica, keys

MEMBERS = keys(5)
KEYS = [m.public_key for m in MEMBERS]
ROUND = 2  # the round scored: round 1's electorate is the creator alone, round 2's every member


def certified_round(members=MEMBERS, voters=None) -> Replica:
    """Round 1 certified by the creator, admitting every member (admitted at genesis: a say from
    round 2); round 2 certified with H1: every member committed, attempt 0's proposer proposed
    them all, and `voters` (default: every member) precommitted it."""
    replica = joined_replica(members)
    certify(replica, members)
    decide(replica, members, H1, voters)
    assert replica.state.round == ROUND and replica.chain.certificates[ROUND].accepted == {m.public_key for m in members}
    return replica


def decide(replica: Replica, members, state: bytes, voters=None) -> None:
    """The tip round's value of every member's commit, proposed by its proposer and precommitted
    with `state` by `voters` (default: every member)."""
    chain, round_ = replica.chain, replica.chain.tip.round
    for m in members:
        if m.public_key not in replica.commit_ops(round_):
            replica.create(m, "commit", round=round_, hash=bytes([m.public_key[0]]) * 32, size=10)
    value = own_value(chain, replica.facts, set(replica.commit_ops(round_)))
    proposer = next(m for m in members if m.public_key == chain.proposer(0))
    replica.create(proposer, "proposal", round=round_, epoch=0, attempt=0, valid=0, **value.fields())
    for m in (members if voters is None else voters):
        replica.create(m, "precommit", round=round_, epoch=0, attempt=0, value=value.id, state=state)


def by_key(key: bytes):
    return next(m for m in MEMBERS if m.public_key == key)


def forged(identity, run: bytes, body: dict) -> bytes:
    """A sealed score op whose body skips every check a writer runs (what a hostile peer can send)."""
    content = canonical.pack({"author": identity.public_key, "body": {"parents": [], "seq": 1, **body},
                              "kind": "crdt.score", "run": run, "v": 1})
    return seal_ops(identity, run, [content])[0]


# --- the op -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("body, what", [
    ({"round": 1, "authors": [b"\x01" * 32], "scores": [MAX_SCORE + 1]}, "over the range"),
    ({"round": 1, "authors": [b"\x01" * 32], "scores": [0.5]}, "a float"),
    ({"round": 1, "authors": [b"\x02" * 32, b"\x01" * 32], "scores": [1, 2]}, "unsorted authors"),
    ({"round": 1, "authors": [b"\x01" * 32, b"\x01" * 32], "scores": [1, 2]}, "a repeated author"),
    ({"round": 1, "authors": [b"\x01" * 32, b"\x02" * 32], "scores": [1]}, "lists of two lengths"),
    ({"round": 1, "authors": [bytes([i // 256, i % 256]) * 16 for i in range(MAX_SET + 1)],
      "scores": [0] * (MAX_SET + 1)}, "more entries than a set can have"),
    ({"round": 1, "authors": [], "scores": []}, "no entry"),
])
def test_a_score_op_that_breaks_its_shape_is_refused_on_decode_and_never_written(body, what):
    replica = joined_replica(MEMBERS[:1])
    with pytest.raises(ProtocolError):
        decode_op(forged(MEMBERS[0], replica.run_id, body), replica.run_id)
    with pytest.raises(ProtocolError):
        replica.create(MEMBERS[0], "score", **body)


def test_only_members_score_and_a_second_different_report_is_an_equivocation_and_a_ban():
    replica = certified_round()
    stranger = keys(1, offset=50)[0]
    with pytest.raises(ProtocolError, match="join the run first"):
        replica.create(stranger, "score", round=ROUND, authors=[KEYS[0]], scores=[1])
    scorer = by_key(scoring_committee(replica.state.certificates[ROUND])[0])
    first = replica.create(scorer, "score", round=ROUND, authors=[KEYS[0]], scores=[1])
    second = replica.create(scorer, "score", round=ROUND, authors=[KEYS[0]], scores=[2])
    assert scorer.public_key in replica.state.banned
    assert ban_reason(replica.facts, scorer.public_key) == "double score: two different ones for round 2"
    fields = evidence_fields(decode_op(first, replica.run_id), decode_op(second, replica.run_id))
    assert fields["reason"] == "double-score"
    assert guilty_author(fields["reason"], fields["a"], fields["b"], replica.run_id) == scorer.public_key
    with pytest.raises(ProtocolError, match="over-cap|at most"):
        replica.create(scorer, "score", round=ROUND, authors=[KEYS[0]], scores=[3])
    assert round_scores(replica.facts, replica.state, ROUND) == {}  # a banned measurer counts for nothing


def test_the_same_report_twice_is_no_equivocation():
    replica = certified_round()
    scorer = by_key(scoring_committee(replica.state.certificates[ROUND])[0])
    other = certified_round()
    data = replica.create(scorer, "score", round=ROUND, authors=[KEYS[0]], scores=[7])
    assert other.add(data).applied and not other.state.banned


def test_the_facts_round_trip_with_scores_and_keep_their_old_form_without():
    replica = certified_round()
    before = replica.facts.encode()
    # a run without score ops keeps the facts (and snapshot hash) it had: no empty table is written
    assert "score" not in unpack(before, max_size=2**20)
    replica.create(MEMBERS[0], "score", round=ROUND, authors=sorted(KEYS[:2]), scores=[5, -5])
    data = replica.facts.encode()
    assert "score" in unpack(data, max_size=2**20)
    decoded = type(replica.facts).decode(data)
    assert decoded.rows["score"] == replica.facts.rows["score"] == {
        (MEMBERS[0].public_key, ROUND, tuple(sorted(KEYS[:2])), (5, -5))}
    assert decoded.encode() == data and decoded.scores_in(ROUND) == replica.facts.scores_in(ROUND)


# --- the committee and the view ----------------------------------------------------------------------


def test_every_peer_draws_the_same_committee_from_the_certificate_and_only_precommitters_count():
    committee = scoring_committee(certified_round().state.certificates[ROUND])
    silent = by_key(committee[0])  # on the committee (the electorate and hash draw it, not the precommits)...
    replica = certified_round(voters=[m for m in MEMBERS if m is not silent])  # ...but it did not precommit
    certificate = replica.state.certificates[ROUND]
    shuffled = Replica(replica.genesis)
    for data in reversed(in_causal_order(replica)):  # another arrival order: parked, then released
        shuffled.add(data)
    assert scoring_committee(certificate) == scoring_committee(shuffled.state.certificates[ROUND]) == committee
    assert len(committee) == SCORING_COMMITTEE and set(committee) <= certificate.electorate
    assert silent.public_key not in certificate.voters and silent.public_key not in replica.chain.voters(ROUND)
    redrawn = replace(certificate, state=H2)
    assert scoring_committee(redrawn) != committee  # another certified hash, another committee
    # Everyone off the committee reports: nothing counts.
    for m in MEMBERS:
        if m.public_key not in committee:
            replica.create(m, "score", round=ROUND, authors=[KEYS[1]], scores=[-MAX_SCORE])
    assert round_scores(replica.facts, replica.state, ROUND) == {}
    # The committee's non-precommitter reports a lie, its two precommitters their word: the lie
    # counts for nothing, and two counted reports make no score (their median, their mean, is one
    # liar's choice).
    replica.create(silent, "score", round=ROUND, authors=[KEYS[1]], scores=[MAX_SCORE])
    for key, value in zip(committee[1:], (200_000, 300_000)):
        replica.create(by_key(key), "score", round=ROUND, authors=[KEYS[1]], scores=[value])
    assert round_scores(replica.facts, replica.state, ROUND) == {KEYS[1]: None}
    assert scores_json(replica.facts, replica.state)[KEYS[1].hex()] == {"rounds": [{"round": ROUND, "score": None}],
                                                                      "mean": None}
    # A precommit of the certified value with another state: it did not compute the certified state.
    value_id = certificate.value_id
    replica.create(silent, "precommit", round=ROUND, epoch=0, attempt=0, value=value_id, state=H2)
    assert round_scores(replica.facts, replica.state, ROUND) == {KEYS[1]: None}
    # A late precommit of the certified (value, state), in a later attempt: it computed it, its report counts.
    replica.create(silent, "precommit", round=ROUND, epoch=0, attempt=1, value=value_id, state=H1)
    assert silent.public_key in replica.chain.voters(ROUND) and replica.chain.certificates[ROUND] is certificate
    assert round_scores(replica.facts, replica.state, ROUND) == {KEYS[1]: 0.3}  # the median of its lie and the two


def test_the_median_is_robust_to_one_lying_measurer_of_three():
    replica = certified_round(MEMBERS[:4])
    committee = scoring_committee(replica.state.certificates[ROUND])
    honest, liar = committee[:2], committee[2]
    keys_ = sorted(KEYS[:4])
    truth = {key: [100_000 + 1000 * i, 110_000 + 1000 * i] for i, key in enumerate(keys_)}
    for j, key in enumerate(honest):
        replica.create(by_key(key), "score", round=ROUND, authors=keys_, scores=[truth[k][j] for k in keys_])
    lies = [MAX_SCORE if i % 2 else -MAX_SCORE for i in range(len(keys_))]
    replica.create(by_key(liar), "score", round=ROUND, authors=keys_, scores=lies)
    scores = round_scores(replica.facts, replica.state, ROUND)
    for key in keys_:
        low, high = (v / SCORE_UNIT for v in truth[key])
        assert low <= scores[key] <= high
    assert score_history(replica.facts, replica.state)[keys_[0]] == [(ROUND, scores[keys_[0]])]


def test_scoring_is_a_run_setting_checked_like_the_others():
    assert RoundSettings().scoring == "off"
    assert RoundSettings.from_hparams({"scoring": "report", "scoring_batches": 2}).scoring_batches == 2
    for bad in ({"scoring": "weights"}, {"scoring_batches": 0}, {"scoring_batch_size": 1.5}):
        with pytest.raises(RunSettingsError):
            RoundSettings.from_hparams(bad)


# --- the daemon: a committee member measures and publishes ----------------------------------------------

TASK = {"d_model": 32, "n_layer": 1, "n_head": 2}
HPARAMS = {"inner_steps": 4, "batch_size": 8, "scoring": "report", "scoring_batches": 2, "scoring_batch_size": 8}
FREE_RIDER = 2


class Written:
    """`CrdtService.write`, recording what the participation publishes."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, dict]] = []

    def write(self, run_id: bytes, kind: str, **fields) -> None:
        self.ops.append((kind, fields))


@pytest.mark.trio
async def test_a_committee_member_publishes_scores_after_the_round_and_a_free_rider_scores_lowest(tmp_path):
    members = MEMBERS[:3]
    manifest = sign_manifest(members[0], task="synthetic-lm", created=1_700_000_000, task_config=TASK, seed=3,
                             hparams=HPARAMS, admitted=[m.public_key for m in members[1:]])
    replica = Replica(Genesis.from_manifest(manifest))
    for m in members:
        replica.create(m, "join", round=1)
    certify(replica, members)  # round 1, by the creator alone: the others have a say from round 2
    body = {"task": "synthetic-lm", "task_config": TASK, "seed": 3, "hparams": HPARAMS}
    peers = [AttackingParticipant.for_run(body, m.public_key, "zero") if i == FREE_RIDER
             else Participant.for_run(body, m.public_key) for i, m in enumerate(members)]
    payloads = {m.public_key: peer.train().payload for m, peer in zip(members, peers)}
    for m in members:
        replica.create(m, "commit", round=ROUND, hash=bytes([m.public_key[0]]) * 32, size=len(payloads[m.public_key]))
    authors = tuple(sorted(payloads))
    value = own_value(replica.chain, replica.facts, set(replica.commit_ops(ROUND)))
    proposer = next(m for m in members if m.public_key == replica.chain.proposer(0))
    replica.create(proposer, "proposal", round=ROUND, epoch=0, attempt=0, valid=0, **value.fields())

    me, crdt = members[1], Written()
    node = SimpleNamespace(identity=me, peers={}, host=SimpleNamespace(get_connected_peers=lambda: []))
    party = RunParticipation(node, crdt, replica, peers[1], tmp_path, scores=None, timing=rm.Timing(),
                             compute=run_inline, offload=run_inline)
    work = party.work = RoundWork(ROUND, 0.0)
    work.payloads.update(payloads)
    async with trio.open_nursery() as nursery:
        party._nursery = nursery
        # The real path of the state of a value: θ kept, then the outer step.
        state_hash = await party._compute_value(ROUND, value.id, authors)
        assert work.scoring_base is not None and work.aggregated == authors
        for i, peer in enumerate(peers):
            if i != 1:
                peer.aggregate(payloads)
                assert peer.state_hash() == state_hash
        for m in members:
            replica.create(m, "precommit", round=ROUND, epoch=0, attempt=0, value=value.id, state=state_hash)
        assert replica.state.round == ROUND
        assert me.public_key in scoring_committee(replica.state.certificates[ROUND])  # 3 members: all score
        party._carry_out([rm.RoundDone(ROUND, state_hash, len(authors), False)])
        with trio.fail_after(60):
            while not any(kind == "score" for kind, _ in crdt.ops):
                await trio.sleep(0.01)
        nursery.cancel_scope.cancel()

    (fields,) = [f for kind, f in crdt.ops if kind == "score"]
    assert fields["round"] == ROUND and fields["authors"] == list(authors)
    replica.create(me, "score", **fields)  # what the service's write does: sign it into the run state
    assert set(round_scores(replica.facts, replica.state, ROUND).values()) == {None}  # one report: not known yet
    text = format_status({**party.status(), "run_id": "run", "history": []})
    assert f"{peer_id_from_public_key(members[FREE_RIDER].public_key)}  mean —  r2 —" in text
    for other in (members[0], members[2]):  # the rest of the committee measures alike (the round's seed decides)
        replica.create(other, "score", **fields)
    scores = round_scores(replica.facts, replica.state, ROUND)
    rider = members[FREE_RIDER].public_key
    assert scores[rider] == 0.0  # a zero Δ changes nothing
    assert all(scores[m.public_key] > scores[rider] for i, m in enumerate(members) if i != FREE_RIDER)

    status = party.status()
    assert status["scores"][rider.hex()] == {"rounds": [{"round": ROUND, "score": 0.0}], "mean": 0.0}
    text = format_status({**status, "run_id": "run", "history": []})
    assert f"{peer_id_from_public_key(rider)}  mean +0.0000  r2 +0.0000" in text
    assert score_fields(ROUND, {rider: float("nan")})["scores"] == [-MAX_SCORE]


@pytest.mark.trio
async def test_a_member_off_the_committee_or_with_scoring_off_publishes_nothing(tmp_path):
    replica = certified_round()
    committee = scoring_committee(replica.state.certificates[ROUND])
    outsider = next(m for m in MEMBERS if m.public_key not in committee)
    insider = by_key(committee[0])
    calls = []
    for member, scoring, publishes in ((outsider, "report", False), (insider, "off", False), (insider, "report", True)):
        crdt = Written()
        participant = SimpleNamespace(settings=SimpleNamespace(delayed_updates=False, scoring=scoring),
                                      score=lambda *args: calls.append(args) or {KEYS[0]: 1.0})
        party = RunParticipation(SimpleNamespace(identity=member), crdt, replica, participant, None, scores=None,
                                 timing=rm.Timing(), compute=run_inline, offload=run_inline)
        await party.scoring.score(ROUND, np.zeros(3), tuple(KEYS), {k: b"p" for k in KEYS})
        assert [kind for kind, _fields in crdt.ops] == (["score"] if publishes else [])
    assert len(calls) == 1  # the insider with scoring on measured; the others did not even measure
