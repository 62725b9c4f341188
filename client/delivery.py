"""The device's delivery policy: one pure function from what waits to what to do.

``decide(rows, config, now, state)`` looks at the oldest group of waiting reports (one
metric, one window: a report, or a shuffled histogram's real report and its fakes) and
answers with one action; ``crowdmix.client.reporter`` does the I/O and asks again.
``Send`` the group with its window and report ids; ``Drop`` it, counted under
``reason``, when never deliverable (window closed, params gone, above the privacy
ceiling, refused); ``Refetch`` the config first (none, expired, or said outdated: at most
once per pass); ``Wait`` (``seconds``; None: until woken), possibly with a ``problem``
for the app; ``Offline``: stop and back off. A report's window is fixed at its claim
(``CachedConfig.window``); one more than ``TOLERANCE_WINDOWS`` behind the current window
is closed at the shuffler and dropped without asking it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from crowdmix.client.answers import Action, Answer
from crowdmix.client.ceiling import Ceiling

if TYPE_CHECKING:
    from crowdmix.client.outbox import PendingReport
    from crowdmix.core.device_config import DeviceConfig
    from crowdmix.core.sealed import PublicKeyConfig

__all__ = [
    "SERVER_TIME_RANGE",
    "TOLERANCE_WINDOWS",
    "CachedConfig",
    "Decision",
    "Drop",
    "Offline",
    "Refetch",
    "Send",
    "SendState",
    "Wait",
    "clock_offset",
    "decide",
]

#: A report's window is closed once the current window is this many windows later.
TOLERANCE_WINDOWS = 1
#: The server times a device believes (Unix seconds, 2020-01-01 to 2100-01-01): taken
#: for the server's clock, an absurd one would put the claimed windows far away.
SERVER_TIME_RANGE = (1_577_836_800.0, 4_102_444_800.0)
#: Shortest wait for a config that publishes no key to be fetched again (seconds).
MIN_KEY_WAIT = 60.0


def clock_offset(server_time: float, received: float) -> float:
    """server − device seconds from a ``GetConfig`` answer's ``server_time`` and the
    device time it arrived; ``ValueError`` for a time no server clock shows."""
    lo, hi = SERVER_TIME_RANGE
    if not lo <= server_time <= hi:  # NaN and ±inf too
        raise ValueError(
            f"server_time {server_time!r} is not a plausible time "
            f"(Unix seconds {lo:.0f} to {hi:.0f})"
        )
    return server_time - received


@dataclass(frozen=True, slots=True)
class CachedConfig:
    """The config in use: the ``GetConfig`` answer, when it was received (device
    clock; ``-inf`` for one bundled with the app: fetch a new one at once) and the
    server's clock offset it gave (server − device seconds; 0 for a bundled one)."""

    config: DeviceConfig
    fetched: float
    offset: float = 0.0

    def window(self, now: float) -> int:
        """The collection window at device time ``now``: ⌊(now + offset) / window_seconds⌋."""
        return math.floor((now + self.offset) / self.config.window_seconds)

    def expired(self, now: float) -> bool:
        return now >= self.fetched + self.config.cache_seconds


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
    rows: Sequence[PendingReport], config: CachedConfig | None, now: float, state: SendState
) -> Decision:
    """The next action for ``rows`` (one group, oldest first; empty: nothing waits) at
    device time ``now``."""
    if state.backoff > 0:
        return Wait(state.backoff)
    if config is None:  # no config ever: nothing can be sent, nor made without one
        if not state.refetched:
            return Refetch("no config yet")
        return _failed(state.fetch_failure, "no config yet")
    if config.expired(now) and not state.refetched:
        return Refetch("the config expired")
    if not rows:
        return Wait(None)
    metric, window = rows[0].report.metric, rows[0].window
    ids = tuple(r.report.report_id for r in rows)
    if rows[0].window_seconds != config.config.window_seconds:
        # the server's windows changed length: an index of the old length names no window
        return Drop(ids, "window_changed")
    if window < config.window(now) - TOLERANCE_WINDOWS:
        return Drop(ids, "window_closed")
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
    if mc is None or any(r.report.params_fingerprint != mc.fingerprint for r in rows):
        if not state.refetched:  # maybe our config is the outdated one
            return Refetch(f"metric {metric!r}: the reports' params are not in the config")
        return Drop(ids, "params_changed")
    if mc.histogram is not None and state.sealing == "off":
        # a histogram's real report and its fakes look alike only when sealed
        return Drop(ids, "refused", f"metric {metric!r}: a shuffled histogram is never sent clear")
    refusal = state.ceiling.refusal(metric, mc)
    if refusal is not None:  # made under a looser ceiling (an earlier run of the app)
        return Drop(ids, "refused_by_ceiling", refusal)
    if state.sealing == "off":
        return Send(tuple(rows), window, None, mc.report_bytes)
    key = _usable_key(config, now)
    if key is None:
        if not state.refetched:
            return Refetch("no aggregator key usable now")
        # never downgraded to clear reports: they wait for a config with a key
        return Wait(
            max(config.fetched + config.config.cache_seconds - now, MIN_KEY_WAIT),
            (
                "the shuffler takes clear reports only (it was started without the "
                "aggregator's public keys)"
                if config.config.plaintext
                else "the shuffler publishes no aggregator key usable now"
            )
            + ": reports wait (sealing='required' never sends them clear)",
        )
    return Send(tuple(rows), window, key, mc.report_bytes)


def _usable_key(config: CachedConfig, now: float) -> PublicKeyConfig | None:
    """The newest key usable at the server's time now, or None."""
    from crowdmix.core.sealed import SealingError, choose_key

    try:
        return choose_key(config.config.keys.keys, now + config.offset)
    except SealingError:
        return None
