"""Are we reachable from the internet? Our own dial-back check, as a sans-IO state machine.

Theory of operation
-------------------
py-libp2p's AutoNAT says "reachable" even for an address nothing listens on,
because its dial-back reuses the connection the question came over. Ours
cannot be fooled that way: the proof of reachability is a *dial-back
received* on a fresh inbound, direct connection, carrying a nonce we chose.

One probe (`/locomesh/reach/1`, see `locomesh.node.nat.reach_service`)::

    we (A) --request{nonce, our addrs}--> helper B      (B is connected to us)
    B takes the ports of our addrs at the IP it sees us at, and asks one of its own peers:
    B --delegate{nonce, A, addrs}--> dialer C           (C must not be connected to A)
    C dials each addr on a new connection; on success:
    C ==dialback{nonce, addr}==> A                      (fresh inbound connection)
    C --result--> B --result{outcome, addr, dialer}--> A

This module keeps the probes and decides. It never does I/O and reads time
only through the `now` callable, so it is tested without a network.

Probe transitions (event -> new state; an event not in the table is ignored,
so a late or repeated message cannot undo a decision)::

    state         event                         next          why
    SENT          dialback                      CONFIRMED     direct proof: someone new reached us
    SENT          result unreachable/no-address REFUTED       a dialer tried our addrs and failed
    SENT          result dialed                 SENT          wait for the dialback itself
    SENT          result no-dialer/busy         INCONCLUSIVE  nobody could try
    SENT          timeout                       INCONCLUSIVE
    REFUTED       dialback                      CONFIRMED     a proof beats a report
    INCONCLUSIVE  dialback                      CONFIRMED

A second kind of evidence needs no probe: a *stranger's inbound connection*
(a peer we had never met dialled us, directly) at a listen address whose IP
is global. With no NAT between us and the internet, nothing but our being
reachable lets a stranger in, so it is recorded as a confirmed probe
(`on_stranger`). This is how a bootstrap node, which everyone dials and whose
peers are all connected to it (so no dialer of the probe above qualifies),
learns that it is public.

Verdict, over the finished probes of the last `window` seconds: *public* if
any is CONFIRMED; *private* if at least `min_refutations` are REFUTED (and
none confirmed); *unknown* otherwise. A lying helper can at worst make us
believe we are private (we then also use relays: harmless); it cannot make
us believe we are public, since it cannot forge an inbound connection.
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from locomesh.node.rate_limit import RateLimiter  # noqa: F401 - re-exported: it was born here
from locomesh.node.addresses import tcp_endpoint

PUBLIC, PRIVATE, UNKNOWN = "public", "private", "unknown"

PROBE_TIMEOUT = 30.0
EVIDENCE_WINDOW = 1800.0
MAX_PROBES = 32
MIN_REFUTATIONS = 2


class ProbeState(enum.Enum):
    SENT = "sent"
    CONFIRMED = "confirmed"
    REFUTED = "refuted"
    INCONCLUSIVE = "inconclusive"


_S = ProbeState
TRANSITIONS: dict[tuple[ProbeState, str], ProbeState] = {
    (_S.SENT, "dialback"): _S.CONFIRMED,
    (_S.SENT, "unreachable"): _S.REFUTED,
    (_S.SENT, "no-address"): _S.REFUTED,
    (_S.SENT, "dialed"): _S.SENT,
    (_S.SENT, "no-dialer"): _S.INCONCLUSIVE,
    (_S.SENT, "busy"): _S.INCONCLUSIVE,
    (_S.SENT, "timeout"): _S.INCONCLUSIVE,
    (_S.REFUTED, "dialback"): _S.CONFIRMED,
    (_S.INCONCLUSIVE, "dialback"): _S.CONFIRMED,
}


@dataclass
class Probe:
    nonce: bytes
    helper: str
    addrs: list[str]
    sent_at: float
    state: ProbeState = ProbeState.SENT
    finished_at: float | None = None
    addr: str = ""  # which address the dialer reached, or tried last
    dialer: str = ""  # who dialled us (or tried to)

    def names_port_of(self, addr: str) -> bool:
        """True if `addr` is a TCP address at one of our probed ports (helpers dial them at the IP they see)."""
        endpoint = tcp_endpoint(addr)
        return endpoint is not None and endpoint[1] in {found[1] for found in map(tcp_endpoint, self.addrs) if found}

    def evidence(self) -> dict[str, Any]:
        return {
            "outcome": self.state.value,
            "helper": self.helper,
            "dialer": self.dialer,
            "addr": self.addr,
            "at": self.finished_at if self.finished_at is not None else self.sent_at,
        }


@dataclass
class ReachabilityTracker:
    """Our probes and the verdict drawn from them (see the module docstring)."""

    now: Callable[[], float]
    probe_timeout: float = PROBE_TIMEOUT
    window: float = EVIDENCE_WINDOW
    min_refutations: int = MIN_REFUTATIONS
    max_probes: int = MAX_PROBES
    _probes: OrderedDict[bytes, Probe] = field(default_factory=OrderedDict)

    def start_probe(self, nonce: bytes, helper: str, addrs: list[str]) -> Probe:
        """Record a request sent to `helper`; the oldest probes are forgotten past `max_probes`."""
        if nonce in self._probes:
            raise ValueError("a nonce is used once")
        probe = Probe(nonce=nonce, helper=helper, addrs=list(addrs), sent_at=self.now())
        self._probes[nonce] = probe
        while len(self._probes) > self.max_probes:
            self._probes.popitem(last=False)
        return probe

    def on_dialback(self, nonce: bytes, addr: str, dialer: str, *, opened_at: float) -> bool:
        """A dialback from `dialer` arrived on an inbound direct connection opened at `opened_at` (our clock).

        True if it proved a probe. It must name a TCP address at one of the
        probed ports (at the IP the helper saw us at, which we cannot check)
        and come on a connection opened after the request went out, from a
        peer other than the helper (which is connected to us already: a
        "dialback" over that connection proves nothing).
        """
        probe = self._probes.get(nonce)
        if probe is None or dialer == probe.helper or opened_at < probe.sent_at or not probe.names_port_of(addr):
            return False
        return self._apply(probe, "dialback", addr=addr, dialer=dialer)

    def on_stranger(self, addr: str, peer: str) -> None:
        """A peer we had never met connected to us at `addr`, one of our global listen addresses."""
        nonce = b"stranger:" + peer.encode()
        if nonce in self._probes:
            return
        probe = self.start_probe(nonce, helper="", addrs=[addr])
        self._apply(probe, "dialback", addr=addr, dialer=peer)

    def on_result(self, nonce: bytes, helper: str, outcome: str, addr: str, dialer: str) -> bool:
        """The helper's report; only the helper the probe was sent to may report on it."""
        probe = self._probes.get(nonce)
        if probe is None or probe.helper != helper:
            return False
        return self._apply(probe, outcome, addr=addr, dialer=dialer)

    def expire(self) -> None:
        """Time out probes that waited longer than `probe_timeout`."""
        deadline = self.now() - self.probe_timeout
        for probe in self._probes.values():
            if probe.state is ProbeState.SENT and probe.sent_at <= deadline:
                self._apply(probe, "timeout", addr=probe.addr, dialer=probe.dialer)

    def _apply(self, probe: Probe, event: str, *, addr: str, dialer: str) -> bool:
        following = TRANSITIONS.get((probe.state, event))
        if following is None:
            return False
        if following is not probe.state:
            probe.state = following
            probe.finished_at = self.now()
        probe.addr, probe.dialer = addr or probe.addr, dialer or probe.dialer
        return True

    # --- what the node shows and acts on --------------------------------------------------

    def recent(self) -> list[Probe]:
        """Finished probes of the last `window` seconds, newest first."""
        since = self.now() - self.window
        finished = [p for p in self._probes.values() if p.finished_at is not None and p.finished_at >= since]
        return sorted(finished, key=lambda probe: probe.finished_at or 0.0, reverse=True)

    def verdict(self) -> str:
        recent = self.recent()
        if any(probe.state is ProbeState.CONFIRMED for probe in recent):
            return PUBLIC
        if sum(probe.state is ProbeState.REFUTED for probe in recent) >= self.min_refutations:
            return PRIVATE
        return UNKNOWN

    def decisive(self) -> int:
        """How many recent probes were confirmed or refuted (the evidence the verdict rests on)."""
        return sum(probe.state in (ProbeState.CONFIRMED, ProbeState.REFUTED) for probe in self.recent())

    def pending_helpers(self) -> set[str]:
        return {probe.helper for probe in self._probes.values() if probe.state is ProbeState.SENT}

    def confirmed_addrs(self) -> list[str]:
        """Addresses someone new reached us at, most recent first."""
        found: list[str] = []
        for probe in self.recent():
            if probe.state is ProbeState.CONFIRMED and probe.addr not in found:
                found.append(probe.addr)
        return found

    def status(self) -> dict[str, Any]:
        """The `reachability` status field: the verdict and the evidence behind it."""
        return {
            "verdict": self.verdict(),
            "confirmed_addrs": self.confirmed_addrs(),
            "probes_pending": len(self.pending_helpers()),
            "evidence": [probe.evidence() for probe in self.recent()[:8]],
        }
