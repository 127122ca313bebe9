"""Contribution scores: which members measure a round, and what their reports say.

A run whose settings turn scoring on ("scoring": "report", training/run_settings.py) has, for each
certified round r, a *scoring committee*: the first SCORING_COMMITTEE members of r's certifying
electorate in an order drawn from r's certified hash (shared randomness: no single key chose
it). Each of them that precommitted the certified state (it computed it, so it holds θ_{r-1} and
the round's payloads; a say is earned) measures every accepted contribution of r applied alone
to θ_{r-1} (training/scoring.py) and signs the scores in a `score` op. Why the electorate and not
the precommitters: late precommits add to those, so an order over them could change after a
member scored; the electorate that certified the round does not.

Scores are floats from torch forward passes, not bit-exact across CPUs: nobody recomputes them,
they are the measurers' signed word. What counts, a pure function of the facts:

- reports of committee members that precommitted the certified state and are not banned; any other
  key's score op is kept in the DAG (it is a valid op of a member) and counts for nothing, as a
  precommit from outside the electorate does;
- of a report, only the entries for r's accepted contributions;
- per contribution, the median of the counted reports, once at least MIN_REPORTS of them count:
  with three one liar cannot move it beyond the honest ones' range. Fewer, and the score is not
  known (None, shown as "—"): the median of two is their mean, which one liar sets.

Two different reports by one member for one round are an equivocation (facts.py): a ban.
Scores only inform (`run status`); they change no aggregate and no certificate.
"""

from __future__ import annotations

import statistics

from .chain import Certificate
from .facts import Facts
from .ops.score import MAX_SCORE, SCORE_UNIT
from .quorum import drawn_order
from .view import RunState

SCORING_COMMITTEE = 3  # measurers per round: a median of three outvotes one liar
MIN_REPORTS = 3  # counted reports a contribution's score needs (module docstring)
SCORE_HISTORY = 10  # certified rounds `run status` shows scores for
CONTRIBUTION_HISTORY = 100  # certified rounds `run status` counts accepted contributions over (as its history)


def scoring_committee(certificate: Certificate) -> list[bytes]:
    """The members that score round `certificate.round`, in drawn order (the same on every peer)."""
    order = drawn_order(b"locomesh scorer", certificate.round, certificate.hash, 0, certificate.electorate)
    return order[:SCORING_COMMITTEE]


def to_units(score: float) -> int:
    """A measured score as a `score` op carries it: fixed point, clipped to ±MAX_SCORE units
    (a non-finite score, from a contribution whose loss overflowed, is the worst one)."""
    if score != score or score == float("-inf"):  # NaN or -inf
        return -MAX_SCORE
    if score == float("inf"):
        return MAX_SCORE
    return max(-MAX_SCORE, min(MAX_SCORE, round(score * SCORE_UNIT)))


def round_scores(facts: Facts, state: RunState, round_: int) -> dict[bytes, float | None]:
    """Accepted contributor of certified round `round_` that a counted report scores -> the
    median of the counted reports of its score, None while fewer than MIN_REPORTS count (module
    docstring); {} if the round is not certified or nobody counted reported."""
    certificate = state.certificates.get(round_)
    if certificate is None:
        return {}
    reports = facts.scores_in(round_)
    measured: dict[bytes, list[int]] = {}
    for scorer in scoring_committee(certificate):
        said = reports.get(scorer)
        if not said or len(said) != 1 or not _computed(facts, certificate, scorer) or scorer in state.banned:
            continue
        ((authors, values),) = said
        for author, value in zip(authors, values):
            if author in certificate.accepted:
                measured.setdefault(author, []).append(value)
    return {author: statistics.median(values) / SCORE_UNIT if len(values) >= MIN_REPORTS else None
            for author, values in measured.items()}


def _computed(facts: Facts, certificate: Certificate, member: bytes) -> bool:
    """Did `member` precommit the certified (value, state) of `certificate`'s round: it computed the state."""
    named = (certificate.value_id, certificate.state)
    return any((row[5], row[6]) == named for row in facts.in_round("precommit", certificate.round).get(member, ()))


def score_history(facts: Facts, state: RunState,
                  last: int = SCORE_HISTORY) -> dict[bytes, list[tuple[int, float | None]]]:
    """Member -> its (round, score or None: not known) over the newest `last` certified rounds, oldest first."""
    history: dict[bytes, list[tuple[int, float | None]]] = {}
    for round_ in range(max(1, state.round - last + 1), state.round + 1):
        for author, score in sorted(round_scores(facts, state, round_).items()):
            history.setdefault(author, []).append((round_, score))
    return history


def scores_json(facts: Facts, state: RunState, last: int = SCORE_HISTORY) -> dict[str, dict]:
    """`score_history` for RPC and the CLI: member (hex) -> {"rounds": [{round, score}], "mean"};
    a score not known is None, and so is the mean of none known (the mean is of those known)."""
    history = score_history(facts, state, last)
    return {
        author.hex(): {
            "rounds": [{"round": round_, "score": score} for round_, score in rows],
            "mean": _mean([score for _round, score in rows if score is not None]),
        }
        for author, rows in sorted(history.items())
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def accepted_counts(state: RunState, last: int = CONTRIBUTION_HISTORY) -> dict[bytes, int]:
    """Member -> in how many of the newest `last` certified rounds (of those whose certificate the
    state holds) the certified set held its contribution (`Certificate.accepted`: the set the round
    agreed to aggregate, before the aggregator leaves out what it finds invalid): what `run report`
    plots per member."""
    counts: dict[bytes, int] = {}
    for round_ in range(max(1, state.round - last + 1), state.round + 1):
        certificate = state.certificates.get(round_)
        for author in () if certificate is None else sorted(certificate.accepted):
            counts[author] = counts.get(author, 0) + 1
    return counts
