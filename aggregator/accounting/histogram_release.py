"""The privacy statement of one shuffled-histogram release. Pure math.

``crowdmix.aggregator.accounting.histogram`` gives (ε, δ) for n devices. The
aggregator does not know n: it sees T, the number of reports (real and fake
alike, sealed, shuffled), not devices. The figure falls as n grows, so n
must never be overstated. The statement uses a *lower confidence bound*

    n_low(T) = min{ n ≥ 1 : Pr[S_n ≥ T] > β },
    S_n = n_h + Bin(n_h·m, q) + (n − n_h)(1 + m),   n_h = floor(h·n),

the largest report total n devices can produce when a share h of them
(``honest_fraction``) follows the protocol (1 + Binomial(m, q) reports) and the
rest send the most the shuffler lets one call carry (1 + m each). S_n grows
stochastically with n (one more device adds an honest device or 1 + m
reports), so Pr[S_n ≥ T] is non-decreasing in n and, for the true n,

    Pr[n_low(T) > n] ≤ Pr[ Pr[S_n ≥ t]|_{t=T} ≤ β ] ≤ β

(the survival function of the observed total is a valid p-value; S_n
dominates the true total stochastically). So with probability ≥ 1 − β over
the fakes n_low ≤ n, and then the stated ε, computed for n_low, is at least
the true one (δ(ε) is non-increasing in the crowd). β is charged to δ: the
accounting runs at δ − β and the statement prints δ. β = ``DEVICE_BOUND_SHARE``·δ.

What it assumes: every report counted comes from a device in the crowd
(someone who injects reports without being a device, e.g. a shuffler
operator, is outside the model, as under every shuffle bound here), devices
beyond the honest share send at most 1 + m reports (the shuffler's per-call
cap, ``crowdmix.shuffler.validation``), and each device reports once per window.

Batches, not the window, are the crowd. The shuffler forwards a window in
batches and the aggregator sees each batch's histogram on its own, so the fakes
that hide a device's real report are those of its own batch. Batches are formed
by report count, independently of the values, and every other batch is then
independent of the target's value; so the statement is that of the smallest
batch (its size is recorded at ingest; unknown sizes fall back to the metric's
``min_batch``, below which the shuffler releases nothing). A device's reports
are stored contiguously (one call). Let K be the devices whose reports meet a
batch of T_b reports: they are a run of consecutive devices, the first of which
straddles the batch's start (chosen by count, so size-biased, but of at most
1 + m reports) and the others fresh, so T_b ≤ (1 + m) + S_{K−1} ≤ S_{K+m}
(every device sends at least one report) and Pr[K + m < n_low(T_b)] ≤ β. At most
two of the K straddle an edge: the crowd is n_low(T_b) − (m + 2) devices whose
whole report set lies in the batch (``edge_devices``). β is split over the
batches (a union bound).

A call stored twice (a shuffler retry after DEADLINE_EXCEEDED, ``store_not_replicated`` or
an unknown outcome whose first attempt was stored: allowed by design) reaches the
aggregator as repeated report ids; it drops the repeats, but it has seen which reports
came together, i.e. that device's whole report set, which holds its real report. Without
k-RR that is its value (δ at any ε is then at least (1 − q)^m), so no central figure holds
for that window. The aggregator therefore counts the repeated ids per window, atomically
with the counts (``crowdmix.aggregator.store.base.CountStore.duplicate_reports``), and a release
with any (or with no record of them: unknown is not zero) states no central figure, only
ε_L, the figure of a colluding shuffler and aggregator, which is what a linking
aggregator is (``HistogramRelease.linked``).

A release is stated per collection window: merging R windows would need each
window's own report total for the device bound, so it is refused. Releases of
several windows compose (basic composition: (R·ε, R·δ), R·ε_L colluding);
``HistogramRelease.rounds`` is kept for that and is 1 today.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from crowdmix.aggregator.accounting.histogram import format_g_up, format_up, histogram_guarantee
from crowdmix.core.histogram import HistogramParams

if TYPE_CHECKING:
    from crowdmix.aggregator.accounting.histogram_plan import HistogramPlan

__all__ = [
    "ASSUMPTIONS",
    "DEVICE_BOUND_SHARE",
    "HistogramRelease",
    "devices_lower_bound",
    "edge_devices",
    "histogram_release",
    "plan_release",
]

#: Share of δ charged for the device-count lower bound failing.
DEVICE_BOUND_SHARE = 0.1

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


def edge_devices(params: HistogramParams) -> int:
    """Devices not counted per batch: m + 2 (see the module docstring)."""
    return params.fake_slots + 2


def _tail(n: int, total: int, params: HistogramParams, honest_fraction: float) -> float:
    """Pr[S_n ≥ total] (see the module docstring)."""
    from scipy import stats

    n_h = math.floor(honest_fraction * n)
    need = total - n_h - (n - n_h) * params.max_messages  # from the honest fakes
    trials = n_h * params.fake_slots
    if need <= 0:
        return 1.0
    if need > trials:
        return 0.0
    return float(stats.binom.sf(need - 1, trials, params.fake_probability))


def devices_lower_bound(
    total_reports: int, params: HistogramParams, *, failure: float, honest_fraction: float = 1.0
) -> int:
    """n_low(T): at most the true device count except with probability ``failure``."""
    if isinstance(total_reports, bool) or not isinstance(total_reports, int) or total_reports < 1:
        raise ValueError(f"total_reports must be a positive integer, got {total_reports!r}")
    if not 0.0 < failure < 1.0:
        raise ValueError(f"failure must be in (0, 1), got {failure!r}")
    lo, hi = 1, total_reports  # S_T ≥ T always: n = T devices send at least T reports
    if _tail(lo, total_reports, params, honest_fraction) > failure:
        return lo
    while hi - lo > 1:  # invariant: tail(lo) ≤ failure < tail(hi)
        mid = (lo + hi) // 2
        if _tail(mid, total_reports, params, honest_fraction) > failure:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True, slots=True, kw_only=True)
class HistogramRelease:
    """One release's statement: both figures, the device bound and its cost."""

    metric: str
    total_reports: int
    smallest_batch: int
    devices_lower: int
    device_failure: float
    rounds: int
    epsilon: float  # central, per window (analyst; shuffler not colluding)
    delta: float  # per window, β included
    local_epsilon: float  # per window, colluding shuffler + aggregator (inf: none)
    honest_fraction: float
    n_honest: int
    params: HistogramParams
    sealed: bool | None = None
    #: report ids seen twice in the window (None: not recorded, unknown)
    duplicate_reports: int | None = 0

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

        return {
            "encoding": "shuffled-histogram",
            "metric": self.metric,
            "total_reports": self.total_reports,
            "smallest_batch": self.smallest_batch,
            "devices_lower_bound": self.devices_lower,
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
            "bound": "exact fake-report pair (crowdmix.aggregator.accounting.histogram) at a lower "
            "confidence bound on the device count (aggregator.accounting.histogram_release)",
        }

    def render(self) -> str:
        if self.linked:
            return self._render_linked()
        central = format_up(self.epsilon) if math.isfinite(self.epsilon) else "∞ (no guarantee)"
        local = (
            f"{format_up(self.local_epsilon)}-LDP per report set (k-RR on the real report)"
            if math.isfinite(self.local_epsilon)
            else "no guarantee (ε = ∞: the real value is among the device's reports)"
        )
        lines = [
            f"Privacy ({self.metric}, shuffled histogram, {self.total_reports:,} reports): "
            f"the analyst's histogram is (ε = {central}, δ = {format_g_up(self.delta)})-DP for one "
            f"device's value in this collection window (a device reporting in R windows: "
            f"R·ε, R·δ by basic composition), counting as cover only the fakes of "
            f"{self.n_honest:,} honest "
            f"devices besides it in its batch (honest fraction {self.honest_fraction:g} of at "
            f"least {self.devices_lower:,} devices in the smallest batch, "
            f"{self.smallest_batch:,} reports: a lower bound that fails with probability "
            f"{format_g_up(self.device_failure)}, charged to δ).",
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


def histogram_release(
    metric: str,
    params: HistogramParams,
    total_reports: int,
    *,
    delta: float = 1e-6,
    honest_fraction: float = 1.0,
    rounds: int = 1,
    sealed: bool | None = None,
    batch_sizes: tuple[int, ...] | None = None,
    min_batch: int | None = None,
    duplicate_reports: int | None = 0,
) -> HistogramRelease:
    """The statement of a release of ``total_reports`` reports of one window, forwarded
    in batches of ``batch_sizes`` reports (None: unknown, each at least ``min_batch``).

    ``duplicate_reports``: report ids the aggregator saw twice in the window (None: not
    recorded); anything but 0 withdraws the central figure (``HistogramRelease.linked``).
    0 is the default for plans and what-ifs; the report job passes the store's count."""
    if duplicate_reports is not None and (
        isinstance(duplicate_reports, bool)
        or not isinstance(duplicate_reports, int)
        or duplicate_reports < 0
    ):
        raise ValueError(
            f"duplicate_reports must be a non-negative integer or None, got {duplicate_reports!r}"
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
    n_low = devices_lower_bound(
        smallest, params, failure=failure / batches, honest_fraction=honest_fraction
    )
    n_low = max(1, n_low - edge_devices(params))
    g = histogram_guarantee(params, n_low, delta - failure, honest_fraction=honest_fraction)
    return HistogramRelease(
        metric=metric,
        total_reports=total_reports,
        smallest_batch=smallest,
        devices_lower=n_low,
        device_failure=failure,
        rounds=rounds,
        # linked (or unknown): no central figure, not even in the value object
        epsilon=g.epsilon if duplicate_reports == 0 else math.inf,
        delta=delta,
        local_epsilon=g.local_epsilon,
        honest_fraction=float(honest_fraction),
        n_honest=g.n_honest,
        params=params,
        sealed=sealed,
        duplicate_reports=duplicate_reports,
    )


def plan_release(
    epsilon: float,
    delta: float,
    n: int,
    domain_size: int,
    *,
    max_messages: int,
    honest_fraction: float = 1.0,
    local_epsilon: float | Literal["auto"] | None = None,
) -> tuple[HistogramPlan, HistogramRelease]:
    """A plan whose *stated* figure meets (ε, δ): ``plan_histogram`` at δ − β and at
    the device count the statement will count (the lower bound from the expected
    report total, one batch), re-planned until the statement of that total meets ε.

    Raises ``PlanError`` when no plan within the cap does.
    """
    from crowdmix.aggregator.accounting.histogram_plan import plan_histogram
    from crowdmix.aggregator.accounting.planner import PlanError

    n_plan = n
    for _ in range(6):
        plan = plan_histogram(
            epsilon,
            (1.0 - DEVICE_BOUND_SHARE) * delta,
            n_plan,
            domain_size,
            max_messages=max_messages,
            honest_fraction=honest_fraction,
            local_epsilon=local_epsilon,
        )
        total = max(1, round(n * plan.params.expected_messages))
        stated = histogram_release(
            "plan", plan.params, total, delta=delta, honest_fraction=honest_fraction
        )
        if stated.epsilon <= epsilon:
            return plan, stated
        n_plan = max(1, stated.devices_lower)
    raise PlanError(
        f"no plan within {max_messages} reports per device states ε ≤ {epsilon} at n = {n}"
    )
