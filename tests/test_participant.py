"""One peer's share of a run (training/participant.py): same payloads, same state, on every peer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from locomesh.node.transfer.store import load_state, manifest_path, remove_checkpoints, write_state
from locomesh.training.checkpoint_manifest import LimitError
from locomesh.training.adversary import AttackingParticipant
from locomesh.training.participant import Participant, ParticipantError, RoundSettings

RUN = b"\x07" * 32
BODY = {"task": "synthetic-lm", "task_config": {"d_model": 32, "n_layer": 1, "n_head": 2}, "seed": 3,
        "hparams": {"inner_steps": 2, "batch_size": 4}}
KEYS = [bytes([index + 1]) * 32 for index in range(3)]


def peers():
    return [Participant.for_run(BODY, key) for key in KEYS]


def one_round(participants):
    payloads = {key: participant.train().payload for key, participant in zip(KEYS, participants)}
    return [participant.aggregate(payloads).params_hash for participant in participants]


def test_peers_that_aggregate_the_same_payloads_hold_the_same_state(tmp_path):
    participants = peers()
    assert len(set(one_round(participants))) == 1
    manifests = [write_state(tmp_path / str(index), participant.snapshot(), RUN)
                 for index, participant in enumerate(participants)]
    assert len({manifest.state_hash for manifest in manifests}) == 1
    assert all(participant.round == 1 for participant in participants)


def test_a_peer_that_loads_the_certified_state_computes_the_next_round_like_the_others(tmp_path):
    participants = peers()
    one_round(participants)
    manifest = write_state(tmp_path, participants[0].snapshot(), RUN)
    assert manifest == participants[0].snapshot().manifest(RUN)  # what every voter attests
    newcomer = Participant.for_run(BODY, b"\x09" * 32)
    assert load_state(tmp_path, manifest.id, newcomer, RUN).state_hash == manifest.state_hash
    assert newcomer.round == 1
    payloads = {key: participant.train().payload for key, participant in zip(KEYS, participants)}
    assert participants[1].aggregate(payloads).params_hash == newcomer.aggregate(payloads).params_hash


def test_a_checkpoint_of_another_run_is_refused(tmp_path):
    participant = peers()[0]
    manifest = write_state(tmp_path, participant.snapshot(), RUN)
    newcomer = Participant.for_run(BODY, KEYS[1])
    with pytest.raises(LimitError, match="run is") as error:
        load_state(tmp_path, manifest.id, newcomer, b"\x08" * 32)
    assert error.value.limit == "metadata" and newcomer.round == 0


def test_an_alie_adversary_behaves_until_it_has_seen_the_others_then_hides_in_their_spread():
    honest, attacker = Participant.for_run(BODY, KEYS[0]), AttackingParticipant.for_run(BODY, KEYS[0], "alie")
    others = peers()[1:]
    first = honest.train().payload
    assert attacker.train().payload == first  # round 1: no Δ of anyone else seen yet
    payloads = {KEYS[0]: first, **{key: p.train().payload for key, p in zip(KEYS[1:], others)}}
    assert honest.aggregate(payloads).params_hash == attacker.aggregate(payloads).params_hash
    assert len(attacker.others_last_round) == 2
    assert attacker.train().payload != honest.train().payload


def test_a_test_adversary_commits_its_attack_not_its_update():
    honest, attacker = Participant.for_run(BODY, KEYS[0]), AttackingParticipant.for_run(BODY, KEYS[0], "sign_flip_x100")
    assert honest.train().payload != attacker.train().payload


@pytest.mark.parametrize(
    "hparams, message",
    [({"inner_steps": 0}, "inner_steps"), ({"batch_size": "16"}, "batch_size"), ({"aggregator": "vote"}, "unknown aggregator"),
     ({"outer_momentum": 1.5}, "momentum")],
)
def test_bad_run_hyperparameters_are_refused(hparams, message):
    with pytest.raises(ParticipantError, match=message):
        RoundSettings.from_hparams(hparams)


def test_with_delayed_updates_the_next_round_starts_from_the_outer_step_with_our_own_delta():
    participant = Participant.for_run({**BODY, "hparams": {**BODY["hparams"], "delayed_updates": True}}, KEYS[0])
    theta = participant.outer.theta.copy()
    first = participant.train()
    start = participant.delayed_start(first)
    # The outer step with our own Δ for the aggregate (Nesterov: θ − lr·(Δ + μ·(μ·0 + Δ))), state untouched.
    expected = theta - np.float32(0.7) * (first.delta + np.float32(0.9) * first.delta)
    assert np.allclose(start, expected, rtol=0, atol=1e-6) and np.array_equal(participant.outer.theta, theta)
    # Round 2 trains from that start while round 1 is aggregated (θ changes under it: no matter).
    participant.aggregate({KEYS[0]: first.payload})
    assert not np.array_equal(participant.outer.theta, start)  # the real aggregate is the decoded payload
    second = participant.train(start=start)
    assert np.array_equal(participant.delayed_start(second), participant.outer.preview(second.delta))
    assert not np.array_equal(participant.train(start=start).delta, participant.train().delta)


def test_delayed_updates_train_a_swarm_to_a_lower_loss_with_one_state():
    """Three peers, round r+1 trained before round r's aggregate is in: they agree and learn."""
    body = {**BODY, "hparams": {"inner_steps": 8, "batch_size": 8, "delayed_updates": True}}
    participants = [Participant.for_run(body, key) for key in KEYS]
    before = participants[0].evaluate()["loss"]
    trained = [participant.train() for participant in participants]
    for _ in range(4):
        starts = [p.delayed_start(t) for p, t in zip(participants, trained)]  # before the aggregate lands
        payloads = {key: t.payload for key, t in zip(KEYS, trained)}
        trained = [p.train(start=start) for p, start in zip(participants, starts)]  # overlaps the exchange
        assert len({p.aggregate(payloads).params_hash for p in participants}) == 1
    after = participants[0].evaluate()["loss"]
    assert after < before - 0.03, (before, after)


def test_evaluation_leaves_the_training_model_alone():
    participant = peers()[0]
    participant.train()
    weights = [parameter.detach().clone() for parameter in participant.worker.model.parameters()]
    participant.evaluate()
    assert all(torch.equal(a, b) for a, b in zip(weights, participant.worker.model.parameters()))


def test_old_rounds_are_removed_with_their_chunks_and_the_rest_kept(tmp_path):
    participant = peers()[0]
    old = write_state(tmp_path, participant.snapshot(), RUN)
    participant.round = 5
    kept = write_state(tmp_path, participant.snapshot(), RUN)
    assert remove_checkpoints(tmp_path, lambda meta: meta["round"] < 3) == 1
    assert not manifest_path(tmp_path, old.id).exists() and manifest_path(tmp_path, kept.id).exists()
    chunks = {path.name for path in (tmp_path / "chunks").iterdir()}
    assert chunks == {ref.hash.hex() for ref in kept.chunks}
    assert np.isfinite(participant.evaluate()["loss"])
