"""Planner for shuffled histograms: target central (ε, δ), n, d and a cap on
messages per device → fake slots m, fill probability q and local ε_L. Pure math.

Each step is monotone (δ(ε) of ``crowdmix.aggregator.accounting.histogram`` falls as m, q
or the honest crowd grow) and the answer is re-checked by ``central_epsilon``, so a plan
that misses its target is never returned. m: the fewest slots for which q = 1 meets the
target (within the cap); q: the smallest multiple of 2^-20 that meets it (dyadic: at most
20 coin words on the device); ε_L: given, or ``"auto"``, the smallest (to 0.01, rounded
up) whose k-RR noise at most doubles the fakes' per-bucket variance. Expected error: the
exact standard deviation of an empty bucket's unbiased count
(``crowdmix.aggregator.decode.histogram.count_variance``, n known), over n for
proportions. Why each step: docs/design.md, "Aggregator: accounting".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from crowdmix.aggregator.accounting.histogram import central_epsilon, histogram_delta
from crowdmix.aggregator.accounting.histogram_crowd import dishonest_share, honest_others
from crowdmix.aggregator.accounting.planner import PlanError
from crowdmix.core.histogram import MAX_FAKE_SLOTS, HistogramParams

__all__ = ["HistogramPlan", "plan_histogram"]

_Q_BITS = 20
_AUTO_VARIANCE_FACTOR = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class HistogramPlan:
    """A proposed shuffled-histogram configuration and what it delivers."""

    params: HistogramParams
    target_epsilon: float
    delta: float
    n: int
    honest_fraction: float | None  # None: the dishonest count was given
    dishonest: int  # D: dishonest devices, all assumed in the target's batch
    n_honest: int  # honest others counted as cover (planned for)
    central_epsilon: float  # achieved (≤ target), analyst not colluding
    expected_messages: float  # per device
    max_messages: int  # per device, enforced by the shuffler
    expected_fakes_per_value: float  # n·m·q/d
    std_error_count: float  # one bucket's count, no device holding it
    std_error: float  # the same on the proportion scale (÷ n)

    def to_dict(self) -> dict[str, object]:
        p = self.params
        return {
            "encoding": "shuffled-histogram",
            "domain_size": p.domain_size,
            "fake_slots": p.fake_slots,
            "fake_probability": p.fake_probability,
            "local_epsilon": p.local_epsilon,
            "target_epsilon": self.target_epsilon,
            "central_epsilon": self.central_epsilon,
            "delta": self.delta,
            "n": self.n,
            "honest_fraction": self.honest_fraction,
            "dishonest_devices": self.dishonest,
            "n_honest": self.n_honest,
            "expected_messages": self.expected_messages,
            "max_messages": self.max_messages,
            "expected_fakes_per_value": self.expected_fakes_per_value,
            "std_error_count": self.std_error_count,
            "std_error": self.std_error,
        }


def _check(epsilon: float, delta: float, n: int, d: int, max_messages: int) -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        raise ValueError(f"epsilon must be a number, got {epsilon!r}")
    if not math.isfinite(epsilon) or epsilon <= 0.0:
        raise ValueError(f"epsilon must be positive and finite, got {epsilon!r}")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    if isinstance(d, bool) or not isinstance(d, int) or d < 2:
        raise ValueError(f"domain size must be an integer >= 2, got {d!r}")
    if (
        isinstance(max_messages, bool)
        or not isinstance(max_messages, int)
        or not 2 <= max_messages <= 1 + MAX_FAKE_SLOTS
    ):
        raise ValueError(
            f"max_messages must be an integer in [2, {1 + MAX_FAKE_SLOTS}], got {max_messages!r}"
        )


def _auto_local_epsilon(n: int, d: int, m: int, q: float) -> float:
    """Smallest ε_L (0.01 grid, rounded up) with total variance ≤ 2 × the fakes' alone."""
    from crowdmix.aggregator.decode.histogram import count_variance

    base = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q)
    target = _AUTO_VARIANCE_FACTOR * float(count_variance(base, n, 0.0))

    def ok(eps: float) -> bool:
        p = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q, local_epsilon=eps)
        return float(count_variance(p, n, 0.0)) <= target

    lo, hi = 0, 3000  # hundredths
    if not ok(hi / 100.0):
        return 30.0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid / 100.0):
            hi = mid
        else:
            lo = mid
    return hi / 100.0


def plan_histogram(
    epsilon: float,
    delta: float,
    n: int,
    domain_size: int,
    *,
    max_messages: int,
    honest_fraction: float = 1.0,
    dishonest_devices: int | None = None,
    local_epsilon: float | Literal["auto"] | None = None,
    n_honest: int | None = None,
) -> HistogramPlan:
    """The cheapest (fewest expected messages) configuration meeting central (ε, δ) for
    one batch of n devices, at most D of them dishonest (``dishonest_devices``, or
    D = ⌈(1 − h)·n⌉): n − 1 − D honest others, or ``n_honest`` if given (a smaller
    crowd, e.g. the one a statement will count; n then only sets the expected error)."""
    from crowdmix.aggregator.decode.histogram import count_variance

    _check(epsilon, delta, n, domain_size, max_messages)
    if dishonest_devices is None:
        dishonest, fraction = dishonest_share(n, honest_fraction), float(honest_fraction)
    else:
        dishonest, fraction = dishonest_devices, None
    crowd = honest_others(n, dishonest)
    if n_honest is not None:
        if isinstance(n_honest, bool) or not isinstance(n_honest, int) or n_honest < 0:
            raise ValueError(f"n_honest must be a non-negative integer, got {n_honest!r}")
        crowd = min(crowd, n_honest)
    d = domain_size
    fixed = None if local_epsilon == "auto" else local_epsilon

    def meets(m: int, q: float) -> bool:
        p = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q, local_epsilon=fixed)
        return histogram_delta(epsilon, p, n_honest=crowd) <= delta

    top = max_messages - 1
    if not meets(top, 1.0):
        raise PlanError(
            f"central ε = {epsilon} at δ = {delta} needs more than {max_messages} messages per "
            f"device for n = {n:,} ({crowd:,} honest besides the target) and d = {d:,}: "
            "raise the cap, n or ε"
        )
    lo_m, hi_m = 0, top  # meets(hi_m, 1) holds
    while hi_m - lo_m > 1:
        mid = (lo_m + hi_m) // 2
        if meets(mid, 1.0):
            hi_m = mid
        else:
            lo_m = mid
    m = hi_m
    scale = 1 << _Q_BITS
    lo_k, hi_k = 0, scale
    while hi_k - lo_k > 1:
        mid = (lo_k + hi_k) // 2
        if meets(m, mid / scale):
            hi_k = mid
        else:
            lo_k = mid
    q = hi_k / scale
    eps_l: float | None
    if local_epsilon == "auto":
        eps_l = _auto_local_epsilon(n, d, m, q)
    elif local_epsilon is None:
        eps_l = None
    else:
        eps_l = float(local_epsilon)
    params = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q, local_epsilon=eps_l)
    achieved = central_epsilon(params, delta, n_honest=crowd)
    if not achieved <= epsilon:  # cannot happen (monotone); never return a plan that misses
        raise PlanError(f"internal: planned configuration gives ε = {achieved} > {epsilon}")
    var0 = float(count_variance(params, n, 0.0))
    return HistogramPlan(
        params=params,
        target_epsilon=float(epsilon),
        delta=float(delta),
        n=n,
        honest_fraction=fraction,
        dishonest=dishonest,
        n_honest=crowd,
        central_epsilon=achieved,
        expected_messages=params.expected_messages,
        max_messages=params.max_messages,
        expected_fakes_per_value=n * m * q / d,
        std_error_count=math.sqrt(var0),
        std_error=math.sqrt(var0) / n,
    )
