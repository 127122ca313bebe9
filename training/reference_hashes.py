"""The outer step's reference vectors and the hashes every CPU must compute from them.

Peers agree on θ bit for bit only if every CPU computes the outer step (decode, validate,
aggregate, Nesterov) to the same bits (training/exact.py says how). The cross-CPU determinism test
(tests/test_outer_determinism.py) runs these vectors under several CPU settings and compares;
``locomesh doctor`` runs them on the user's machine and compares with `REFERENCE_HASHES`, computed
once here and written down, so that a machine whose arithmetic differs is found before it joins a
run (it would never agree on a round).

The vectors are seeded: six authors (the last an attacker at 50 times the scale, one payload of
the second round non-finite), three rounds over `NUMEL` values, encoded int8 with error feedback.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .codec import Encoder, non_finite_payload

NUMEL = 100_001  # several slabs and a ragged tail
AUTHORS = 6
ROUNDS = 3  # the third round's peer momenta have a history
AGGREGATORS = [
    ("centered_clip", {}),
    ("mean", {}),
    ("coordinate_median", {}),
    ("trimmed_mean", {"beta": 0.2}),
    ("geometric_median", {"iterations": 4}),
    ("multi_krum", {"f": 1, "m": 3}),
]
CAP = 60.0  # below the first round's aggregate norm, so the cap path runs
SHARD_VALUES = 30_000  # sharded exchange: 4 shards, the last one ragged
SEED = 2024

# params_hash of θ after each round, per aggregator, as every CPU computes it (see the module docstring).
REFERENCE_HASHES: dict[str, list[str]] = {
    "centered_clip": [
        "607c2f34e2af8c2a54027d6847cf871c42f53796d0c9dbd931c9654dfe66f036",
        "559f07a0937d498c135ebcc5cc07176ff70d57bbb290df01d0a4d5240b4c0d9c",
        "4a3718dfb058b50bc7927def9491a5ecf462ac0dcafe6bec664c918f9aa8c685",
    ],
    "mean": [
        "eec1d8bc4d41783c012b8e4b94c57307d885b02ddea4e2517319fd21e1b8013f",
        "e1a4f34b10de308a98644e6924742155d6a3790a29d46dd6e944608607054935",
        "671ec4124f4382bb19ddf3785b08bf2eea08926b7cb81a4f62f18b03bc535752",
    ],
    "coordinate_median": [
        "9e31bd24dbe80bb677f68ad9b1e4918259f25df1baff308f56fc32ef19aca7e7",
        "55787035b57fb59028cf665c0ac1caa0827d01ccad144e4b0d5ac774311cf566",
        "5be3c89e0667d8320f88b596af6e85743f226f37d9f00c75a1b3929ec577f518",
    ],
    "trimmed_mean": [
        "fb076d6e1ec9e1d9ec8ddbb5279529fa037dc70492891fc8c3c16aeb7560ff33",
        "dc7ca63c189b224a7c97ac2cfdc30988035eb606d8288cddcb73cfb97903911c",
        "e60c9ad8a5d5d2f36fb70966f9d52c399c238ed2300463b745d566071bca4034",
    ],
    "geometric_median": [
        "3edb4083ad3ef55fadb915b574b37f9aa357cff3e28688414b39bdcfbde1a743",
        "91454763bff933b821f9819531eededaff8aad8ef2f36a6920c7d4814d1b4a8f",
        "1e0f4149a147d40955ceb5ecdd1103a185f85bc4bb8c4b449a2aba7a84379fe0",
    ],
    "multi_krum": [
        "dccc5d46b680fb8333acf45a3beaf5a50008f1d8b1f889d305ef0a20361c543d",
        "085b75e5c0181163b0501a51126c6bbea72083e6714b74db6d125d424205553c",
        "2d4f5b70a63ac18abf5d2cd6fb690ee5248e6f221acc5ae3ee0e137d8cf709a9",
    ],
}


@dataclass(frozen=True)
class ReferenceRounds:
    """The starting θ, each round's payloads by author, and the last round's raw Δ by author."""

    theta: np.ndarray
    payloads: list[dict[str, bytes]]
    last_deltas: dict[str, np.ndarray]

    @property
    def authors(self) -> list[str]:
        return list(self.payloads[0])


def reference_rounds() -> ReferenceRounds:
    """The reference vectors, made from `SEED` (the same bits on every machine: NumPy's seeded
    generator and the codec are exact)."""
    rng = np.random.default_rng(SEED)
    theta = rng.standard_normal(NUMEL).astype(np.float32)
    authors = [f"author-{i}" for i in range(AUTHORS)]
    encoders = {author: Encoder("int8", error_feedback=True) for author in authors}
    direction = rng.standard_normal(NUMEL).astype(np.float32)
    rounds, deltas = [], {}
    for r in range(ROUNDS):
        payloads = {}
        for i, author in enumerate(authors):
            delta = (0.3 * direction + 0.1 * rng.standard_normal(NUMEL)).astype(np.float32)
            if i == AUTHORS - 1:
                delta *= np.float32(-50)  # an attacker
            deltas[author] = delta
            payload = encoders[author].encode(delta)
            if r == 1 and i == 0:
                payload = non_finite_payload("int8", float("nan"), NUMEL)  # rejected, not raised
            payloads[author] = payload
        rounds.append(payloads)
    return ReferenceRounds(theta, rounds, deltas)


def write_round_files(folder: Path) -> None:
    """The reference vectors as files, for the determinism test's subprocesses: ``theta.f32``,
    ``<round>-<author>.bin``, ``delta-<author>.f32`` (the last round's) and ``spec.json``."""
    made = reference_rounds()
    made.theta.astype("<f4").tofile(folder / "theta.f32")
    for r, payloads in enumerate(made.payloads):
        for author, payload in payloads.items():
            (folder / f"{r}-{author}.bin").write_bytes(payload)
    for author, delta in made.last_deltas.items():
        delta.tofile(folder / f"delta-{author}.f32")
    spec = {"aggregators": AGGREGATORS, "authors": made.authors, "rounds": ROUNDS, "cap": CAP,
            "shard_values": SHARD_VALUES}
    (folder / "spec.json").write_text(json.dumps(spec))


def outer_hashes(aggregators: list[tuple[str, dict]] | None = None) -> dict[str, list[str]]:
    """The θ hash after each reference round, per aggregator (default: all of `AGGREGATORS`),
    computed here by the outer step."""
    from .outer import OuterStep

    made = reference_rounds()
    found = {}
    for name, options in AGGREGATORS if aggregators is None else aggregators:
        step = OuterStep(made.theta, aggregator=name, max_update_norm=CAP, **options)
        found[name] = [step.step({a.encode(): p for a, p in payloads.items()}).params_hash
                       for payloads in made.payloads]
    return found


def mismatches(aggregators: list[tuple[str, dict]] | None = None) -> list[str]:
    """The aggregators whose hashes this machine computes differently from `REFERENCE_HASHES`,
    as "name round N" lines; empty when this CPU agrees."""
    wrong = []
    for name, hashes in outer_hashes(aggregators).items():
        for r, (mine, reference) in enumerate(zip(hashes, REFERENCE_HASHES[name])):
            if mine != reference:
                wrong.append(f"{name} round {r}")
                break
    return wrong
