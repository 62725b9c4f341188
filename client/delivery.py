"""The device's delivery policy: one pure function from what waits to what to do.

``decide(rows, config, now, state)`` looks at the oldest group of waiting reports (one
metric, one window: a report, or a shuffled histogram's real report and its fakes) and
answers with one action; ``crowdmix.client.reporter`` does the I/O and asks again.
``Send`` the group with its window and report ids; ``Drop`` it, counted under
``reason``, when never deliverable (window closed, params gone, above the ceiling,
refused; more than a window ahead of a server time learnt here: ``window_ahead``, its
claim withdrawn); ``Refetch`` the config first (none, expired, clocks drifted apart, or
said outdated: at most once per pass); ``Wait`` (``seconds``; None: until woken),
possibly with a ``problem`` for the app; ``Offline``: stop and back off. ``now`` is a
``Reading`` of the device's wall and monotonic clocks; the server's time is the one
``GetConfig`` gave plus the monotonic time since (``CachedConfig.server_now``), so a wall
clock set by the user moves no window. A report's window is fixed at its claim; one more
than the served ``window_tolerance`` behind is dropped unasked (``CachedConfig.trusted``).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from crowdmix.client.answers import Action, Answer
from crowdmix.client.ceiling import Ceiling

if TYPE_CHECKING:
    from crowdmix.client.outbox import PendingReport
    from crowdmix.core.device_config import DeviceConfig
    from crowdmix.core.sealed import PublicKeyConfig

__all__ = [
    "CLOCK_SLACK",
    "SERVER_TIME_RANGE",
    "CachedConfig",
    "Decision",
    "Drop",
    "Offline",
    "Reading",
    "Refetch",
    "Send",
    "SendState",
    "Wait",
    "check_server_time",
    "decide",
    "monotonic",
    "read_clocks",
]

#: The server times a device believes (Unix seconds, 2020-01-01 to 2100-01-01): taken
#: for the server's clock, an absurd one would put the claimed windows far away.
SERVER_TIME_RANGE = (1_577_836_800.0, 4_102_444_800.0)
#: Shortest wait for a config that publishes no key to be fetched again (seconds).
MIN_KEY_WAIT = 60.0
#: Seconds the wall clock may gain on the monotonic clock (or lose) since the config
#: was fetched before the server time learnt is doubted and fetched again: the wall
#: clock was set, or the device slept on a monotonic clock that stops in suspend.
CLOCK_SLACK = 60.0

#: The device's monotonic clock: CLOCK_BOOTTIME where the OS has it (Linux: it counts
#: the time the device was suspended), else ``time.monotonic``.
monotonic: Callable[[], float] = (
    functools.partial(time.clock_gettime, time.CLOCK_BOOTTIME)
    if hasattr(time, "CLOCK_BOOTTIME")
    else time.monotonic
)


@dataclass(frozen=True, slots=True)
class Reading:
    """The device's two clocks read together: ``wall`` (Unix seconds; the user or NTP
    may set it) and ``mono`` (seconds from any origin; only moves forward, and is only
    compared within one process)."""

    wall: float
    mono: float


def read_clocks() -> Reading:
    return Reading(time.time(), monotonic())


def check_server_time(server_time: float) -> float:
    """A ``GetConfig`` answer's ``server_time``; ``ValueError`` for one no server clock shows."""
    lo, hi = SERVER_TIME_RANGE
    if not lo <= server_time <= hi:  # NaN and ±inf too
        raise ValueError(
            f"server_time {server_time!r} is not a plausible time "
            f"(Unix seconds {lo:.0f} to {hi:.0f})"
        )
    return server_time


@dataclass(frozen=True, slots=True)
class CachedConfig:
    """The config in use: the ``GetConfig`` answer, the server's clock ``server_time``
    when the device's clocks read ``at``, and how long the answer had been held then
    (``age``: 0 for one fetched in this process; ``inf`` for a bundled one, fetched
    again at once). Within a process the server time runs on the monotonic clock."""

    config: DeviceConfig
    server_time: float
    at: Reading
    age: float = 0.0

    @classmethod
    def restored(
        cls, config: DeviceConfig, fetched: float, offset: float, now: Reading
    ) -> CachedConfig:
        """An answer stored by an earlier process (``fetched``: its wall clock then;
        ``offset``: server − wall seconds): its monotonic reading means nothing here, so
        the server time is the wall clock corrected by ``offset`` until the config
        expires; aged by the wall clock (one set back since: expired at once)."""
        age = now.wall - fetched
        return cls(config, now.wall + offset, now, age if age >= 0 else math.inf)

    def server_now(self, now: Reading) -> float:
        """The server's clock at ``now``: its time at the fetch + the monotonic time since."""
        return self.server_time + (now.mono - self.at.mono)

    def window(self, now: Reading) -> int:
        """The collection window at ``now``: ⌊server time / window_seconds⌋."""
        return math.floor(self.server_now(now) / self.config.window_seconds)

    def held(self, now: Reading) -> float:
        """Seconds since the answer was fetched."""
        return self.age + (now.mono - self.at.mono)

    def drifted(self, now: Reading) -> bool:
        """The wall and monotonic clocks moved apart by more than ``CLOCK_SLACK``."""
        return abs((now.wall - self.at.wall) - (now.mono - self.at.mono)) > CLOCK_SLACK

    def expired(self, now: Reading) -> bool:
        return self.held(now) >= self.config.cache_seconds or self.drifted(now)

    def learnt(self) -> bool:
        """The server time was learnt in this process (and runs on the monotonic clock)."""
        return self.age == 0

    def trusted(self, now: Reading) -> bool:
        """The server time is believed: learnt in this process (run on the monotonic
        clock since, even once expired), or restored and not expired. A bundled answer,
        or a restored one past its lifetime, is only the wall clock: a report is not
        taken for closed on it, the shuffler says so."""
        return self.learnt() or not self.expired(now)


@dataclass(frozen=True, slots=True, kw_only=True)
class SendState:
    """What the sender knows besides the rows and the config."""

    sealing: Literal["required", "off"] = "required"
    ceiling: Ceiling = field(default_factory=Ceiling)
    backoff: float = 0.0  # seconds left of the sender's backoff (0: may try now)
    refetched: bool = False  # the config was fetched (or tried) in this pass
    fetch_failure: Answer | None = None  # why that fetch failed
    answer: Answer | None = None  # the shuffler's refusal of this group's last attempt


@dataclass(frozen=True, slots=True)
class Send:
    rows: tuple[PendingReport, ...]
    window: int
    key: PublicKeyConfig | None  # None: clear (``sealing="off"``)
    report_bytes: int
    # heavy hitters: a sealed report names its round's fingerprint in the clear too
    round_bound: bool = False


@dataclass(frozen=True, slots=True)
class Drop:
    report_ids: tuple[bytes, ...]
    reason: str
    message: str = ""


@dataclass(frozen=True, slots=True)
class Refetch:
    reason: str


@dataclass(frozen=True, slots=True)
class Wait:
    seconds: float | None  # None: until a report is made or the network returns
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class Offline:
    reason: str
    fatal: bool = False  # a setup error (token, TLS, protocol): the app should hear of it


Decision = Send | Drop | Refetch | Wait | Offline


def _failed(answer: Answer | None, fallback: str) -> Offline:
    if answer is None:
        return Offline(fallback)
    return Offline(answer.message, fatal=answer.action is Action.FATAL)


def decide(
    rows: Sequence[PendingReport], config: CachedConfig | None, now: Reading, state: SendState
) -> Decision:
    """The next action for ``rows`` (one group, oldest first; empty: nothing waits) at
    ``now``."""
    if state.backoff > 0:
        return Wait(state.backoff)
    if config is None:  # no config ever: nothing can be sent, nor made without one
        if not state.refetched:
            return Refetch("no config yet")
        return _failed(state.fetch_failure, "no config yet")
    if config.expired(now) and not state.refetched:
        return Refetch(
            "the device's clock was set (or it slept)"
            if config.drifted(now)
            else "the config expired"
        )
    if not rows:
        return Wait(None)
    metric, window = rows[0].report.metric, rows[0].window
    ids = tuple(r.report.report_id for r in rows)
    if rows[0].window_seconds != config.config.window_seconds:
        # the server's windows changed length: an index of the old length names no window
        return Drop(ids, "window_changed")
    if window < config.window(now) - config.config.window_tolerance and config.trusted(now):
        return Drop(ids, "window_closed")
    if window > config.window(now) + 1 and config.learnt():
        # a wall clock set forward named it (a restart on the stored offset): no
        # shuffler took it (its skew allowance is under one window), so it is withdrawn
        # and its claim moved back, instead of holding the metric until it begins
        return Drop(
            ids,
            "window_ahead",
            f"metric {metric!r}: window {window} is {window - config.window(now)} windows "
            "ahead of the server's time (the device's clock was set forward); withdrawn",
        )
    answer = state.answer
    if answer is not None:
        if answer.action is Action.DROP:
            return Drop(ids, answer.reason, answer.message)
        if answer.action is Action.REFETCH:
            if not state.refetched:
                return Refetch(answer.message)
            if answer.after_refetch is Action.DROP:
                return Drop(ids, "refused", answer.message)
        return _failed(answer, answer.message)
    mc = config.config.metrics.get(metric)
    # a heavy-hitters report carries its round's fingerprint; a window this config serves
    # no round of (no longer listed) is the shuffler's to judge
    hh = mc is not None and mc.heavy_hitters is not None
    expected = None if mc is None else mc.fingerprint
    if mc is not None and hh:
        served = config.config.round_of(metric, window)
        expected = None if served is None else served.fingerprint(mc.fingerprint)
    if mc is None or (
        expected is not None and any(r.report.params_fingerprint != expected for r in rows)
    ):
        if not state.refetched:  # maybe our config is the outdated one
            what = "round is not the config's" if hh else "params are not in the config"
            return Refetch(f"metric {metric!r}: the reports' {what}")
        # a heavy-hitters report of another round of its window (another shuffler's)
        # cannot be made again, and is never counted against this round
        return Drop(ids, "round_changed" if hh else "params_changed")
    if mc.histogram is not None and state.sealing == "off":
        # a histogram's real report and its fakes look alike only when sealed
        return Drop(ids, "refused", f"metric {metric!r}: a shuffled histogram is never sent clear")
    refusal = state.ceiling.refusal(metric, mc)
    if refusal is not None:  # made under a looser ceiling (an earlier run of the app)
        return Drop(ids, "refused_by_ceiling", refusal)
    bound = mc.heavy_hitters is not None
    if state.sealing == "off":
        return Send(tuple(rows), window, None, mc.report_bytes, bound)
    key = _usable_key(config, now)
    if key is None:
        if not state.refetched:
            return Refetch("no aggregator key usable now")
        # never downgraded to clear reports: they wait for a config with a key
        return Wait(
            max(config.config.cache_seconds - config.held(now), MIN_KEY_WAIT),
            (
                "the shuffler takes clear reports only (it was started without the "
                "aggregator's public keys)"
                if config.config.plaintext
                else "the shuffler publishes no aggregator key usable now"
            )
            + ": reports wait (sealing='required' never sends them clear)",
        )
    return Send(tuple(rows), window, key, mc.report_bytes, bound)


def _usable_key(config: CachedConfig, now: Reading) -> PublicKeyConfig | None:
    """The newest key usable at the server's time now, or None."""
    from crowdmix.core.sealed import SealingError, choose_key

    try:
        return choose_key(config.config.keys.keys, config.server_now(now))
    except SealingError:
        return None
