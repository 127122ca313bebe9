"""What became of this node's part in a finished round, for `run status`, `run watch` and the
round history (`work.RoundRecord.outcome`).

A round finished "synced" used to read as "my work was discarded", although adopting the
certified state by a download says nothing about whether our payload counted. The outcome says
what happened to our part instead:

- COUNTED: our payload is in the round's certified set (`Certificate.accepted`), and the
  aggregator took it;
- NOT_COUNTED: we committed a payload that the certified state leaves out, and why where this
  node knows it (no proposal named it: it came after the proposers' cuts or could not be fetched;
  a proposal named it but the round decided another; the aggregator refused it);
- SAT_OUT: we trained nothing for the round on purpose (paused, outside the node's schedule,
  not a member of the round yet);
- SYNCED_ONLY: we did not train the round (catching up after a restart, or the round was
  certified before our inner steps ended), only took its state;
- CONTRIBUTED: we committed, but the certificate is not at hand to tell whether it counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from locomesh.node.rounds.work import RoundWork

COUNTED = "counted"
NOT_COUNTED = "not counted"
SAT_OUT = "sat out"
SYNCED_ONLY = "synced only"
CONTRIBUTED = "contributed"

AFTER_THE_CUT = "in no proposal: committed after the proposers' cuts, or the proposers could not fetch it"
NOT_PROPOSED = "in a proposal, but the round decided another one"
CERTIFIED_FIRST = "the round was decided before our commit was seen"
NOT_A_MEMBER = "not a member yet"
TRAINING_OVERTAKEN = "the round was certified before our inner steps ended"


@dataclass(frozen=True)
class Outcome:
    kind: str  # one of the kinds above
    why: str | None = None  # where this node knows it


def round_outcome(round_number: int, work: RoundWork | None, *, me: bytes, accepted: frozenset[bytes] | None,
                  committed: bool, proposed: bool | None, sitting_out: str | None, contributor: bool) -> Outcome:
    """The outcome of round `round_number` for us. `work`: the round we last worked on;
    `accepted`: whose payloads the round's certificate holds (None: no certificate at hand);
    `committed`: whether the run holds a commit of ours for the round (it outlives a restart,
    our work does not); `proposed`: whether a proposal of the round named our commit (None: we made
    none); `sitting_out`: why this node trains no round now (None: it would train);
    `contributor`: whether we were among the round's contributors."""
    ours = work if work is not None and work.round == round_number else None
    if accepted is not None and me in accepted:
        refused = None if ours is None else ours.refused  # decoding fails alike everywhere: ours says it
        return Outcome(COUNTED) if refused is None else Outcome(NOT_COUNTED, f"left out by the aggregator: {refused}")
    if not (committed or (ours is not None and ours.committed)):
        return _without_payload(ours, sitting_out, contributor)
    if accepted is None:
        return Outcome(CONTRIBUTED)
    return Outcome(NOT_COUNTED, _why_left_out(proposed))


def outcome_of(p: Any, round_number: int) -> Outcome:
    """What became of our part in round `round_number` of `RunParticipation` `p`, just finished:
    asked at once, while its work and the reason to sit out are still this round's."""
    certificate = p.replica.chain.certificates.get(round_number)
    return round_outcome(
        round_number, p.work, me=p.me, accepted=None if certificate is None else certificate.accepted,
        committed=p.me in p.replica.commits(round_number), proposed=_proposed(p, round_number),
        sitting_out="paused" if p.paused else p.sitting_out(),  # the history needs no `run resume` hint
        contributor=p.me in p.replica.chain.tip.membership.roster)


def _proposed(p: Any, round_number: int) -> bool | None:
    """Whether a proposal of round `round_number` named our commit (None: we made none)."""
    ours = p.replica.commit_ops(round_number).get(p.me)
    if ours is None:
        return None
    return any(ours in row[6] for rows in p.replica.facts.in_round("proposal", round_number).values() for row in rows)


def refusal(result: Any, me: bytes) -> str | None:
    """Why an outer step (its `OuterResult.rejected`) refused our payload `me`; None if it took it,
    or says nothing (the simulator's participant)."""
    error = (getattr(result, "rejected", None) or {}).get(me)
    return None if error is None else str(error)


def _without_payload(ours: RoundWork | None, sitting_out: str | None, contributor: bool) -> Outcome:
    """A round we sent nothing for: sat out on purpose, or only synced."""
    if ours is not None and ours.training:  # we started its inner steps: the others finished the round first
        return Outcome(SYNCED_ONLY, TRAINING_OVERTAKEN)
    if sitting_out is not None:
        return Outcome(SAT_OUT, sitting_out)
    if not contributor:  # a join takes effect at a later round; a pause's leave ends membership
        return Outcome(SAT_OUT, NOT_A_MEMBER)
    return Outcome(SYNCED_ONLY)


def _why_left_out(proposed: bool | None) -> str:
    """Why a certified set lacks our payload: a proposal named it (another value won), or none did."""
    if proposed is None:
        return CERTIFIED_FIRST
    return NOT_PROPOSED if proposed else AFTER_THE_CUT
