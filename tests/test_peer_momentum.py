"""Peer momentum (training/outer.py): the outer momentum as a robust aggregate of every author's."""

from __future__ import annotations

import numpy as np
import pytest

from locomesh.training import attacks
from locomesh.training.attacks import AttackView
from locomesh.training.codec import Encoder, non_finite_payload
from locomesh.training.simulation import DiLoCoConfig
from locomesh.training.exact import F32, SLAB
from locomesh.training.outer import OuterStep

NUMEL = 4000
MU = 0.9


def fp32(deltas: dict[bytes, np.ndarray]) -> dict[bytes, bytes]:
    return {author: Encoder("fp32").encode(delta) for author, delta in deltas.items()}


@pytest.mark.parametrize("codec, numel", [("fp32", NUMEL), ("int8", 2 * SLAB + 123)])  # int8: slabs, a ragged tail
def test_with_the_plain_mean_it_is_the_usual_momentum(codec, numel):
    rng = np.random.default_rng(1)
    theta = rng.standard_normal(numel).astype(np.float32)
    plain = OuterStep(theta, codec=codec, aggregator="mean")
    per_peer = OuterStep(theta, codec=codec, aggregator="mean", peer_momentum=True)
    for _ in range(4):
        deltas = {bytes([i]): rng.standard_normal(numel).astype(np.float32) for i in range(5)}
        payloads = {author: Encoder(codec).encode(delta) for author, delta in deltas.items()}
        expected, got = plain.step(payloads), per_peer.step(payloads)
        np.testing.assert_allclose(got.theta, expected.theta, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(per_peer.momentum, plain.momentum, rtol=1e-5, atol=1e-5)


def test_a_newcomer_starts_from_the_runs_momentum_and_an_absent_author_is_forgotten():
    rng = np.random.default_rng(2)
    step = OuterStep(np.zeros(NUMEL, np.float32), codec="fp32", peer_momentum=True)
    first = {author: rng.standard_normal(NUMEL).astype(np.float32) for author in (b"a", b"b", b"c")}
    step.step(fp32(first))
    kept_a = step.peer_momenta[b"a"].copy()
    run_momentum = step.momentum.copy()
    second = {author: rng.standard_normal(NUMEL).astype(np.float32) for author in (b"a", b"b", b"d")}
    step.step(fp32(second))
    assert set(step.peer_momenta) == {b"a", b"b", b"d"}
    newcomer = np.add(np.multiply(run_momentum, F32(MU)), second[b"d"])
    assert np.array_equal(step.peer_momenta[b"d"], newcomer)
    assert np.array_equal(step.peer_momenta[b"a"], np.add(np.multiply(kept_a, F32(MU)), second[b"a"]))


def test_a_rejected_payload_leaves_its_author_out_of_the_momenta():
    rng = np.random.default_rng(3)
    step = OuterStep(np.zeros(NUMEL, np.float32), codec="fp32", peer_momentum=True)
    payloads = fp32({bytes([i]): rng.standard_normal(NUMEL).astype(np.float32) for i in range(4)})
    payloads[b"x"] = non_finite_payload("fp32", float("nan"), NUMEL)
    result = step.step(payloads)
    assert list(result.rejected) == [b"x"] and set(step.peer_momenta) == {bytes([i]) for i in range(4)}


def test_it_runs_with_allgather_only():
    step = OuterStep(np.zeros(NUMEL, np.float32), codec="fp32", peer_momentum=True)
    with pytest.raises(ValueError, match="allgather"):
        step.aggregate_range({}, 0, 10, out=np.empty(10, np.float32))
    with pytest.raises(ValueError, match="allgather"):
        DiLoCoConfig(exchange="sharded", peer_momentum=True)


def _pull_of_a_held_direction(peer_momentum: bool, attack: attacks.Attack | None, rounds: int = 12) -> np.ndarray:
    """θ after `rounds` of 6 honest authors (a shared signal plus fresh noise ten times larger) and,
    with `attack`, 2 colluders running it with full knowledge of the outer step."""
    rng = np.random.default_rng(4)
    signal = 0.05 * rng.standard_normal(NUMEL)
    step = OuterStep(np.zeros(NUMEL, np.float32), codec="fp32", peer_momentum=peer_momentum, lr=0.7)
    for round_index in range(rounds):
        honest = [(signal + 0.5 * rng.standard_normal(NUMEL)).astype(np.float32) for _ in range(6)]
        payloads = {bytes([i]): delta for i, delta in enumerate(honest)}
        if attack is not None:
            view = AttackView(
                round_index=round_index, honest_deltas=honest, past_honest_payloads=[], workers=8, byzantine=2,
                rng=np.random.default_rng(0), encode_non_finite=lambda value, numel: b"",
                previous=step.previous, aggregate=step.trial_aggregate,
                peer_momentum=MU if peer_momentum else None, momentum=step.momentum,
            )
            sent = attack(view)
            payloads.update({b"z1": sent, b"z2": sent})
        step.step(fp32(payloads))
    return step.theta.astype(np.float64)


def test_peer_momentum_shrinks_the_pull_of_colluders_holding_one_direction_inside_the_radius():
    u = attacks._fixed_direction(NUMEL, 0)
    pulls = {}
    for peer_momentum in (False, True):
        clean = _pull_of_a_held_direction(peer_momentum, None)
        attacked = _pull_of_a_held_direction(peer_momentum, attacks.inside_radius(0.95, "random"))
        pulls[peer_momentum] = -float(np.dot(attacked - clean, u))  # θ moves against the Δs
    assert pulls[False] > 100.0  # the attack works against CenteredClip alone: its pull adds up ...
    assert 0.1 * pulls[False] < pulls[True] < 0.5 * pulls[False]  # ... peer momentum takes most of it away (the
    # attacker, tracking every momentum, still pulls: it is adapted, not defeated by construction)
