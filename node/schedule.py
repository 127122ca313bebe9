"""When this node trains: local-time windows, and only while the machine is idle or on AC power.

`TrainingSchedule.reason_to_sit_out(now)` is the whole decision, pure but for
the platform probes it is given: None when the node may train now, else a
plain reason ("outside the schedule 22:00-07:00", "on battery", "the machine
is busy: other processes use 63% of the CPU"). The round participation asks
it before each round; a node that sits a round out stays a member of the
run, as one that missed a round for any other reason (it lapses and rejoins;
the others never wait for it).

The probes use psutil and answer None where the platform does not tell (no
battery sensor on a desktop or in a container): an unknown answer never stops
training, and the schedule says so once, in the log.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, time
from time import monotonic

logger = logging.getLogger(__name__)

IDLE_CPU_SHARE = 0.25  # the machine counts as busy while other processes use more of its CPU than this
_WINDOW = re.compile(r"^\s*(\d{1,2}):(\d{2})\s*-\s*(\d{1,2}):(\d{2})\s*$")

Probe = Callable[[], "bool | None"]
LoadProbe = Callable[[], "float | None"]


class ScheduleError(ValueError):
    """A window that cannot be read; the message says what is wrong, in one line."""


@dataclass(frozen=True)
class Window:
    """Local times from `start` (included) to `end` (excluded); across midnight when `end` <= `start`."""

    start: time
    end: time
    text: str

    def contains(self, moment: time) -> bool:
        if self.start < self.end:
            return self.start <= moment < self.end
        return moment >= self.start or moment < self.end


def parse_window(text: str) -> Window:
    """A window written ``HH:MM-HH:MM`` (24-hour local time), or `ScheduleError`."""
    match = _WINDOW.match(text) if isinstance(text, str) else None
    if match is None:
        raise ScheduleError(f"{str(text)[:40]!r} is not a window like 22:00-07:00 (HH:MM-HH:MM, local time)")
    hours_1, minutes_1, hours_2, minutes_2 = (int(part) for part in match.groups())
    if max(hours_1, hours_2) > 23 or max(minutes_1, minutes_2) > 59:
        raise ScheduleError(f"{text.strip()!r} is not a window: hours run 00-23, minutes 00-59")
    start, end = time(hours_1, minutes_1), time(hours_2, minutes_2)
    if start == end:
        raise ScheduleError(f"{text.strip()!r} is an empty window (leave the schedule empty to train at any time)")
    return Window(start, end, f"{start:%H:%M}-{end:%H:%M}")


def on_ac_power() -> bool | None:
    """Whether the machine runs on mains power: True without a battery, None where the platform
    cannot tell."""
    try:
        import psutil

        battery = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError, RuntimeError):
        return None
    if battery is None:  # no battery, or none psutil can see: a desktop or a server, on mains power
        return None if _has_battery_class() else True
    return battery.power_plugged


def _has_battery_class() -> bool:
    """On Linux, whether a battery exists that psutil could not read (then the answer is unknown)."""
    try:
        return any(name.startswith("BAT") for name in os.listdir("/sys/class/power_supply"))
    except OSError:
        return False


class OtherProcessesLoad:
    """The share of the machine's CPU (0 to 1) that processes other than this one and its children
    used since the previous call; None on the first call, or where psutil cannot tell."""

    def __init__(self) -> None:
        self._last: tuple[float, float, float] | None = None  # (wall, all busy CPU, ours), in seconds

    def __call__(self) -> float | None:
        try:
            sample = _cpu_sample()
        except Exception as error:  # noqa: BLE001 - psutil raises per-platform types; unknown is the answer
            logger.debug("cannot read the CPU's load: %s", error)
            return None
        last, self._last = self._last, sample
        if last is None or sample[0] <= last[0]:
            return None
        capacity = (sample[0] - last[0]) * (os.cpu_count() or 1)
        others = (sample[1] - last[1]) - (sample[2] - last[2])
        return min(1.0, max(0.0, others / capacity))


def _cpu_sample() -> tuple[float, float, float]:
    import psutil

    times = psutil.cpu_times()
    busy = sum(times) - times.idle - getattr(times, "iowait", 0.0)
    own = psutil.Process()
    ours = sum(own.cpu_times()[:2])
    for child in own.children(recursive=True):
        try:
            ours += sum(child.cpu_times()[:2])
        except psutil.Error:
            pass  # it ended meanwhile
    return monotonic(), busy, ours


class TrainingSchedule:
    """The node's schedule (config: ``schedule``, ``only_when_idle``, ``only_on_ac_power``), with its
    platform probes injected for tests."""

    def __init__(
        self, windows: Sequence[str] = (), *, only_when_idle: bool = False, only_on_ac_power: bool = False,
        ac_power: Probe = on_ac_power, others_load: LoadProbe | None = None, idle_share: float = IDLE_CPU_SHARE,
    ) -> None:
        self.windows = [parse_window(window) for window in windows]
        self.only_when_idle, self.only_on_ac_power = only_when_idle, only_on_ac_power
        self._ac_power = ac_power
        if others_load is None:
            others_load = OtherProcessesLoad()
            if only_when_idle:
                others_load()  # the first sample: the first round's question then has a load to answer with
        self._others_load = others_load
        self.idle_share = idle_share
        self._said_unknown: set[str] = set()

    @classmethod
    def from_config(cls, config: object) -> TrainingSchedule:
        """The schedule a `NodeConfig` names."""
        return cls(getattr(config, "schedule", ()), only_when_idle=getattr(config, "only_when_idle", "off") == "on",
                   only_on_ac_power=getattr(config, "only_on_ac_power", "off") == "on")

    @property
    def always(self) -> bool:
        """True when nothing in it can ever keep the node from training."""
        return not (self.windows or self.only_when_idle or self.only_on_ac_power)

    def reason_to_sit_out(self, now: datetime) -> str | None:
        """None if the node may train at local time `now`; else why not, in plain words."""
        outside = self.outside_windows(now)
        if outside is not None:
            return f"outside the schedule {outside}"
        if self.only_on_ac_power:
            plugged = self._ac_power()
            if plugged is None:
                self._say_unknown("ac", "this platform does not tell whether it runs on battery: "
                                        "only_on_ac_power is not applied")
            elif not plugged:
                return "on battery"
        if self.only_when_idle:
            load = self._others_load()
            if load is None:
                self._say_unknown("idle", "the CPU's load is not known yet (or on this platform): "
                                          "only_when_idle lets this round train")
            elif load > self.idle_share:
                return f"the machine is busy: other processes use {load:.0%} of the CPU"
        return None

    def outside_windows(self, now: datetime) -> str | None:
        """The windows ("22:00-07:00, 12:00-13:00") if local time `now` is outside all of them; else
        None. Pure: no platform probe is asked (`run join` says it before any round would)."""
        if self.windows and not any(window.contains(now.time()) for window in self.windows):
            return ", ".join(window.text for window in self.windows)
        return None

    def describe(self) -> str:
        """The schedule in a few words, for status and logs."""
        parts = [f"between {', '.join(window.text for window in self.windows)}"] if self.windows else []
        parts += ["when idle"] * self.only_when_idle + ["on AC power"] * self.only_on_ac_power
        return "trains " + (" and ".join(parts) if parts else "at any time")

    def _say_unknown(self, what: str, message: str) -> None:
        if what not in self._said_unknown:
            self._said_unknown.add(what)
            logger.info("%s", message)
