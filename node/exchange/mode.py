"""Which exchange a round uses, from the run's `exchange` setting and the round's electorate.

`allgather`: every member fetches every payload and aggregates the whole vector. `sharded`: each
shard is aggregated by a committee sized by `committees.plan` for the run's `byzantine_fraction`,
and every member fetches the shard results. `auto` compares what a member downloads per round:

    allgather: (n − 1) payloads
    sharded:   k payloads (its committee seats: k per member on average) + the aggregate

and takes sharded when it is smaller. The aggregate is float32, so it weighs as much as several
int8 payloads: small runs keep allgather, large ones shard (docs/design-notes.md, "Sharded exchange",
has the table). The choice depends only on the run's settings and the round's first electorate,
which every member reads alike, so all members of a round exchange the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

from locomesh.training.run_settings import EXCHANGES

from .committees import CommitteePlan, plan


@dataclass(frozen=True)
class ExchangeChoice:
    """A round's exchange, and why (for `run status`)."""

    mode: str  # "allgather" or "sharded"
    reason: str
    plan: CommitteePlan | None  # the committee plan of a sharded round

    def to_json(self) -> dict[str, object]:
        fields: dict[str, object] = {"mode": self.mode, "reason": self.reason}
        if self.plan is not None:
            fields.update(committee=self.plan.committee, checks=self.plan.verified, shards=self.plan.shards)
        return fields


def choose(setting: str, members: int, *, byzantine_fraction: float, shards: int, payload_bytes: int,
           aggregate_bytes: int) -> ExchangeChoice:
    """The exchange of a round with `members` in its electorate, for the run `setting`;
    `payload_bytes` is the largest payload of the run, `aggregate_bytes` its aggregate's size."""
    if setting not in EXCHANGES:
        raise ValueError(f"exchange is one of {', '.join(EXCHANGES)}, not {setting!r}")
    if setting == "allgather" or members < 2:
        return ExchangeChoice("allgather", "the run's setting" if setting == "allgather" else "one member", None)
    committees = plan(members, byzantine_fraction=byzantine_fraction, shards=shards)
    if setting == "sharded":
        return ExchangeChoice("sharded", "the run's setting", committees)
    allgather = (members - 1) * payload_bytes
    sharded = committees.payloads_fetched * payload_bytes + aggregate_bytes
    if sharded < allgather:
        return ExchangeChoice("sharded", f"auto: {_mib(sharded)} down per member against {_mib(allgather)} "
                              f"in allgather", committees)
    return ExchangeChoice("allgather", f"auto: {_mib(allgather)} down per member against {_mib(sharded)} "
                          f"sharded", None)


def _mib(size: float) -> str:
    return f"{size / 2**20:.1f} MiB"
