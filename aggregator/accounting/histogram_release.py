"""The privacy statement of one shuffled-histogram release. Pure math.

``histogram`` gives (ε, δ) for n_h honest devices besides the target in its batch;
``histogram_crowd`` bounds n_h from what the aggregator sees: report counts, not devices.
Its confidence bounds fail with probability β = ``DEVICE_BOUND_SHARE``·δ, charged to δ
(the accounting runs at δ − β and the statement prints δ). The crowd is the smallest
batch, not the window (β split over batches by a union bound); dishonest devices are
counted over the whole window, all in the target's batch. A window with repeated report
ids (or no record of them) links a device's reports, so its release states no central
figure, only ε_L (``HistogramRelease.linked``). A release covers one collection window;
several compose by basic composition ((R·ε, R·δ), R·ε_L colluding).
Reasons: docs/design.md, "Aggregator: accounting", shuffled-histogram release.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from crowdmix.aggregator.accounting.histogram import central_epsilon, format_g_up, format_up
from crowdmix.aggregator.accounting.histogram_crowd import (
    HonestCrowd,
    dishonest_share,
    honest_crowd,
)
from crowdmix.core.histogram import HistogramParams

if TYPE_CHECKING:
    from crowdmix.aggregator.accounting.histogram_plan import HistogramPlan

__all__ = [
    "ASSUMPTIONS",
    "DEVICE_BOUND_SHARE",
    "PLAN_MISS",
    "HistogramRelease",
    "histogram_release",
    "plan_release",
    "report_total_low",
]

#: Share of δ charged for the device-count confidence bounds failing.
DEVICE_BOUND_SHARE = 0.1

#: A plan's stated ε meets its target for every report total but the PLAN_MISS
#: least likely ones (``plan_release``): all but one run in 10⁹.
PLAN_MISS = 1e-9

#: What the central figure assumes, printed with it. The aggregator opens every report
#: and sees its report id and key id, so (a) a call stored twice (a retried
#: DEADLINE_EXCEEDED or store_not_replicated whose first attempt was stored) shows it, by
#: the repeated ids, which reports came together, as a colluding shuffler would: checked,
#: the repeats are counted per window and a window with any states no central figure;
#: (b) reports sealed to different keys (a rotation mid-window) split a batch into
#: smaller crowds: not checked by the code.
ASSUMPTIONS = (
    "reports sealed (the shuffler sees no value)",
    "shuffler and aggregator not colluding",
    "every counted report from a device of the crowd",
    "a device sending one report set per window in one call (at most 1 + m reports, "
    "the shuffler's cap)",
    "no call stored twice (checked: the aggregator counts the report ids it sees twice "
    "per window, and a window with any gets no central figure)",
    "a batch's reports sealed to one key (each key's reports are a crowd of their own)",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class HistogramRelease:
    """One release's statement: both figures, the crowd counted and its cost."""

    metric: str
    total_reports: int
    smallest_batch: int
    crowd: HonestCrowd
    rounds: int
    epsilon: float  # central, per window (analyst; shuffler not colluding)
    delta: float  # per window, β included
    local_epsilon: float  # per window, colluding shuffler + aggregator (inf: none)
    params: HistogramParams
    sealed: bool | None = None
    #: report ids seen twice in the window (None: not recorded, unknown)
    duplicate_reports: int | None = 0

    @property
    def n_honest(self) -> int:
        return self.crowd.n_honest

    @property
    def honest_lower(self) -> int:
        return self.crowd.honest_lower

    @property
    def device_failure(self) -> float:
        return self.crowd.failure

    @property
    def honest_fraction(self) -> float | None:
        return self.crowd.honest_fraction

    @property
    def linked(self) -> bool:
        """The aggregator may have linked a device's reports (repeated ids, or unknown):
        no central figure holds, only ε_L."""
        return self.duplicate_reports != 0

    @property
    def withheld(self) -> str | None:
        """Why no central figure is stated (None: it is)."""
        if self.duplicate_reports is None:
            return (
                "the counts do not record how many report ids were seen twice in this "
                "window (counted before the aggregator kept that count): the aggregator "
                "may have linked a device's reports; no central guarantee"
            )
        if self.duplicate_reports:
            return (
                f"{self.duplicate_reports:,} report ids were seen twice in this window: the "
                "aggregator may have linked a device's reports; no central guarantee"
            )
        return None

    @property
    def epsilon_total(self) -> float:
        return self.epsilon * self.rounds

    @property
    def delta_total(self) -> float:
        return min(1.0, self.delta * self.rounds)

    @property
    def local_epsilon_total(self) -> float:
        return self.local_epsilon * self.rounds

    def to_dict(self) -> dict[str, object]:
        def fin(x: float) -> float | None:
            return x if math.isfinite(x) else None

        krr = self.params.local_epsilon is not None
        return {
            "encoding": "shuffled-histogram",
            "metric": self.metric,
            "total_reports": self.total_reports,
            "smallest_batch": self.smallest_batch,
            "honest_lower_bound": self.honest_lower,
            "devices_upper_bound": self.crowd.devices_upper,
            "dishonest_devices": self.crowd.dishonest,
            "device_bound_failure": self.device_failure,
            "honest_fraction": self.honest_fraction,
            "n_honest": self.n_honest,
            "rounds": self.rounds,
            "central": None if self.linked else {"epsilon": fin(self.epsilon), "delta": self.delta},
            "central_total": None
            if self.linked
            else {"epsilon": fin(self.epsilon_total), "delta": self.delta_total},
            "central_withheld": self.withheld,
            "duplicate_reports": self.duplicate_reports,
            "colluding_local_epsilon": fin(self.local_epsilon),
            "colluding_local_epsilon_total": fin(self.local_epsilon_total),
            "fake_slots": self.params.fake_slots,
            "fake_probability": self.params.fake_probability,
            "domain_size": self.params.domain_size,
            "sealed": self.sealed,
            "assumptions": list(ASSUMPTIONS),
            "bound": (
                "fake reports and k-RR blanket (crowdmix.aggregator.accounting.histogram_blanket)"
                if krr
                else "exact fake-report pair (crowdmix.aggregator.accounting.histogram)"
            )
            + " for the honest crowd of the smallest batch "
            "(crowdmix.aggregator.accounting.histogram_crowd)",
        }

    def _crowd_text(self) -> str:
        c = self.crowd
        where = "in the window" if c.batches == 1 else "in the smallest batch"
        sending = "sending 1 + m reports each"
        if c.batches > 1:
            sending += ", all assumed in its batch"
        if c.honest_fraction is None:
            dishonest = f"beside at most {c.dishonest:,} dishonest devices (as given) {sending}"
        elif c.honest_fraction == 1.0:
            dishonest = "all devices assumed honest (honest fraction 1)"
        elif c.devices_upper is None:
            dishonest = (
                f"beside dishonest devices up to a share {1.0 - c.honest_fraction:.6g} of "
                f"the window's, {sending}"
            )
        else:
            dishonest = (
                f"beside up to {c.dishonest:,} dishonest devices (a share "
                f"{1.0 - c.honest_fraction:.6g} of at most {c.devices_upper:,} in the "
                f"window) {sending}"
            )
        return (
            f"at least {c.honest_lower:,} honest devices {where} ({self.smallest_batch:,} "
            f"reports), {dishonest}; the bounds fail with probability "
            f"{format_g_up(c.failure)}, charged to δ"
        )

    def render(self) -> str:
        if self.linked:
            return self._render_linked()
        central = format_up(self.epsilon) if math.isfinite(self.epsilon) else "∞ (no guarantee)"
        local = (
            f"{format_up(self.local_epsilon)}-LDP per report set (k-RR on the real report)"
            if math.isfinite(self.local_epsilon)
            else "no guarantee (ε = ∞: the real value is among the device's reports)"
        )
        cover = "fakes and k-RR noise" if self.params.local_epsilon is not None else "fakes"
        lines = [
            f"Privacy ({self.metric}, shuffled histogram, {self.total_reports:,} reports): "
            f"the analyst's histogram is (ε = {central}, δ = {format_g_up(self.delta)})-DP for one "
            f"device's value in this collection window (a device reporting in R windows: "
            f"R·ε, R·δ by basic composition), counting as cover only the {cover} of "
            f"{self.n_honest:,} honest devices besides it in its batch ({self._crowd_text()}).",
            f"  Shuffler + aggregator colluding: {local}.",
        ]
        if self.rounds > 1:
            total = format_up(self.epsilon_total) if math.isfinite(self.epsilon_total) else "∞"
            lines.append(
                f"  Over {self.rounds} windows (basic composition): ε = {total}, "
                f"δ = {format_g_up(self.delta_total)}; colluding: ε = "
                f"{format_up(self.local_epsilon_total)}."
            )
        lines.append("  Assumes: " + "; ".join(ASSUMPTIONS) + ".")
        return "\n".join(lines)

    def _render_linked(self) -> str:
        """No central number at all: the reason, then ε_L only."""
        local = (
            f"ε_L = {format_up(self.local_epsilon)}-LDP per report set (k-RR on the real "
            "report), the figure of a colluding shuffler and aggregator"
            if math.isfinite(self.local_epsilon)
            else "ε_L = ∞, no guarantee (no k-RR: the real value is among the device's reports)"
        )
        return "\n".join(
            [
                f"Privacy ({self.metric}, shuffled histogram, {self.total_reports:,} reports): "
                "no central (ε, δ) for this collection window.",
                f"  {self.withheld}.",
                f"  Local only: {local}.",
            ]
        )


def _check_release(
    delta: float, rounds: int, duplicate_reports: int | None, dishonest_devices: int | None
) -> None:
    if duplicate_reports is not None and (
        isinstance(duplicate_reports, bool)
        or not isinstance(duplicate_reports, int)
        or duplicate_reports < 0
    ):
        raise ValueError(
            f"duplicate_reports must be a non-negative integer or None, got {duplicate_reports!r}"
        )
    if dishonest_devices is not None and (
        isinstance(dishonest_devices, bool)
        or not isinstance(dishonest_devices, int)
        or dishonest_devices < 0
    ):
        raise ValueError(
            f"dishonest_devices must be a non-negative integer or None, got {dishonest_devices!r}"
        )
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    if rounds > 1:
        # The device bound needs each window's own report total (the smallest window
        # holds fewer than the average): not known here, so it is refused, not guessed.
        raise ValueError(
            f"a shuffled-histogram release is stated per collection window; these counts "
            f"merge {rounds} windows: report one window at a time (--windows W)"
        )


def histogram_release(
    metric: str,
    params: HistogramParams,
    total_reports: int,
    *,
    delta: float = 1e-6,
    honest_fraction: float = 1.0,
    dishonest_devices: int | None = None,
    rounds: int = 1,
    sealed: bool | None = None,
    batch_sizes: tuple[int, ...] | None = None,
    min_batch: int | None = None,
    duplicate_reports: int | None = 0,
) -> HistogramRelease:
    """The statement of a release of ``total_reports`` reports of one window, forwarded
    in batches of ``batch_sizes`` reports (None: unknown, each at least ``min_batch``).

    Dishonest devices: ``dishonest_devices`` D if given, else a share 1 − ``honest_fraction``
    of the window's devices (``histogram_crowd``). ``duplicate_reports``: report ids the
    aggregator saw twice in the window (None: not recorded); anything but 0 withdraws the
    central figure (``HistogramRelease.linked``). 0 is the default for plans and
    what-ifs; the report job passes the store's count."""
    _check_release(delta, rounds, duplicate_reports, dishonest_devices)
    failure = DEVICE_BOUND_SHARE * delta
    if batch_sizes is not None and (
        not batch_sizes or min(batch_sizes) < 1 or sum(batch_sizes) != total_reports
    ):
        # Refused, not replaced by one batch of the total: that would state the crowd of
        # the whole window for batches that may be far smaller. (The report job drops
        # sizes that do not cover its counts itself and falls back to ``min_batch``.)
        raise ValueError(
            f"batch sizes {list(batch_sizes)[:8]} must be positive and add up to the "
            f"{total_reports:,} reports of the release"
        )
    if batch_sizes is not None:
        smallest, batches = min(batch_sizes), len(batch_sizes)
    else:
        floor_ = min_batch if min_batch is not None else total_reports
        smallest = max(1, min(total_reports, floor_))
        batches = max(1, math.ceil(total_reports / smallest))
    crowd = honest_crowd(
        params,
        smallest_batch=smallest,
        batches=batches,
        window_reports=total_reports,
        failure=failure,
        honest_fraction=honest_fraction,
        dishonest_devices=dishonest_devices,
    )
    return _release(
        metric, params, total_reports, smallest, crowd, delta, sealed, duplicate_reports
    )


def _release(
    metric: str,
    params: HistogramParams,
    total_reports: int,
    smallest: int,
    crowd: HonestCrowd,
    delta: float,
    sealed: bool | None,
    duplicate_reports: int | None,
) -> HistogramRelease:
    eps = central_epsilon(params, delta - crowd.failure, n_honest=crowd.n_honest)
    return HistogramRelease(
        metric=metric,
        total_reports=total_reports,
        smallest_batch=smallest,
        crowd=crowd,
        rounds=1,
        # linked (or unknown): no central figure, not even in the value object
        epsilon=eps if duplicate_reports == 0 else math.inf,
        delta=delta,
        local_epsilon=params.local_epsilon if params.local_epsilon is not None else math.inf,
        params=params,
        sealed=sealed,
        duplicate_reports=duplicate_reports,
    )


def report_total_low(
    params: HistogramParams,
    n: int,
    *,
    miss: float = PLAN_MISS,
    honest_fraction: float = 1.0,
    dishonest_devices: int | None = None,
) -> int:
    """T_lo with Pr[T < T_lo] ≤ ``miss`` for the report total T of one window of n devices.

    With D = ``dishonest_devices`` or ⌈(1 − h)·n⌉, at least n − D devices are honest and
    send 1 + Bin(m, q) reports each, and every device sends at least one: T ≥ n +
    Bin((n − D)·m, q). T_lo = n + the binomial's ``binom.ppf(miss)`` (the smallest k with
    Pr[X ≤ k] ≥ miss, so Pr[X < k] < miss).
    """
    from scipy import stats

    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not 0.0 < miss < 1.0:
        raise ValueError(f"miss must be in (0, 1), got {miss!r}")
    dishonest = (
        dishonest_share(n, honest_fraction) if dishonest_devices is None else dishonest_devices
    )
    trials = (n - min(n, dishonest)) * params.fake_slots
    low = int(stats.binom.ppf(miss, trials, params.fake_probability)) if trials else 0
    return n + low


def plan_release(
    epsilon: float,
    delta: float,
    n: int,
    domain_size: int,
    *,
    max_messages: int,
    honest_fraction: float = 1.0,
    dishonest_devices: int | None = None,
    local_epsilon: float | Literal["auto"] | None = None,
    miss: float = PLAN_MISS,
) -> tuple[HistogramPlan, HistogramRelease]:
    """A plan whose *stated* figure meets (ε, δ) in all but ``miss`` of the windows of n
    devices, each released as one batch, and the statement of its worst such window.

    The statement of a window of T reports counts k_low(T) − 1 honest others
    (``histogram_crowd.honest_crowd``), non-decreasing in T, and its ε is non-increasing in
    them (the fixed cover grid of ``histogram_blanket`` keeps the computed figure so). So
    every T ≥ T_lo (``report_total_low``: probability ≥ 1 − miss) states at most the ε of
    T_lo. The fakes are planned (``plan_histogram`` at δ − β) for that statement's crowd,
    re-planned until its ε meets the target. Raises ``PlanError`` when no plan within the
    cap does.
    """
    from crowdmix.aggregator.accounting.histogram_plan import plan_histogram
    from crowdmix.aggregator.accounting.planner import PlanError

    _check_release(delta, 1, 0, dishonest_devices)
    failure = DEVICE_BOUND_SHARE * delta
    n_honest: int | None = None  # first: the crowd of n devices known exactly
    for _ in range(8):
        plan = plan_histogram(
            epsilon,
            (1.0 - DEVICE_BOUND_SHARE) * delta,
            n,
            domain_size,
            max_messages=max_messages,
            honest_fraction=honest_fraction,
            dishonest_devices=dishonest_devices,
            local_epsilon=local_epsilon,
            n_honest=n_honest,
        )
        low = report_total_low(
            plan.params,
            n,
            miss=miss,
            honest_fraction=honest_fraction,
            dishonest_devices=dishonest_devices,
        )
        crowd = honest_crowd(
            plan.params,
            smallest_batch=low,
            batches=1,
            window_reports=low,
            failure=failure,
            honest_fraction=honest_fraction,
            dishonest_devices=dishonest_devices,
        )
        stated = _release("plan", plan.params, low, low, crowd, delta, None, 0)
        if stated.epsilon <= epsilon:
            return plan, stated
        planned = plan.n_honest
        n_honest = max(0, min(planned - 1, crowd.n_honest))  # plan for the crowd counted
    raise PlanError(
        f"no plan within {max_messages} reports per device states ε ≤ {epsilon} at n = {n}"
    )
