"""Statistics shared by the decoders: normal tails, confidence intervals and
multiple-testing corrections.

- One-sided z-test of H0: frequency = 0 against > 0: p = Φ̄(β/se).
- Bonferroni (default): reject when p ≤ α/C (family-wise error ≤ α).
- Benjamini–Hochberg: reject the first r with p_(r) ≤ r·α/C (FDR ≤ α under independence
  or positive dependence; Benjamini & Hochberg, JRSS B 1995).
- Wald intervals β ± z·se, the lower end raised to 0 but never above the estimate.
- Selection-adjusted intervals for values that passed β̂/se > z_c: β̂ ~ N(β, se²)
  truncated to (z_c·se, ∞), interval {β : a/2 ≤ F_β(β̂) ≤ 1 − a/2} with
  F_β(x) = 1 − Φ̄((x−β)/se)/Φ̄((z_c·se−β)/se) (Lee, Sun, Sun, Taylor, Ann. Statist.
  2016); returned as the hull of (interval ∩ [0, ∞)) and β̂, a superset, so its
  conditional coverage is at least the level (docs/design.md, "Aggregator: decode").

Every interval these functions return satisfies low ≤ estimate ≤ high.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.special import log_ndtr, ndtr, ndtri

__all__ = [
    "CORRECTIONS",
    "INTERVALS",
    "Correction",
    "IntervalMethod",
    "confidence_interval",
    "critical_z",
    "normal_sf",
    "one_sided_p_values",
    "report_intervals",
    "selection_cutoff",
    "selective_interval",
    "significant",
]

Correction = Literal["bonferroni", "bh", "none"]
CORRECTIONS: tuple[str, ...] = ("bonferroni", "bh", "none")
#: ``wald``: β̂ ± z·se for every row; ``selective``: detected rows get the
#: selection-adjusted interval (the rest keep Wald).
IntervalMethod = Literal["wald", "selective"]
INTERVALS: tuple[str, ...] = ("wald", "selective")
FloatArray = npt.NDArray[np.float64]


def normal_sf(z: npt.ArrayLike) -> FloatArray:
    """Φ̄(z) = P(Z > z) for a standard normal Z (no cancellation in the upper tail)."""
    return np.asarray(ndtr(-np.asarray(z, dtype=np.float64)), dtype=np.float64)


def critical_z(tail_probability: float) -> float:
    """z with Φ̄(z) = tail_probability."""
    if not 0.0 < tail_probability < 1.0:
        raise ValueError(f"tail probability must be in (0, 1), got {tail_probability}")
    return float(-ndtri(tail_probability))


def one_sided_p_values(estimate: npt.ArrayLike, std_error: npt.ArrayLike) -> FloatArray:
    """p = Φ̄(β/se) for H0: β = 0 vs β > 0; 1 where se is not positive or β <= 0."""
    est = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(std_error, dtype=np.float64)
    out = np.ones(est.shape, dtype=np.float64)
    ok = (se > 0) & (est > 0)
    out[ok] = normal_sf(est[ok] / se[ok])
    return out


def significant(
    p_values: npt.ArrayLike,
    *,
    alpha: float = 0.05,
    correction: Correction = "bonferroni",
    num_tests: int | None = None,
) -> npt.NDArray[np.bool_]:
    """Which hypotheses are rejected at level ``alpha`` after the correction.

    ``num_tests`` (default: len(p_values)) is the number of hypotheses in the
    family, which may exceed the p-values given (untested candidates count).
    """
    p = np.asarray(p_values, dtype=np.float64)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    c = p.size if num_tests is None else num_tests
    if c < p.size:
        raise ValueError(f"num_tests ({c}) must be at least the number of p-values ({p.size})")
    if correction == "none":
        return p <= alpha
    if correction == "bonferroni":
        return p <= alpha / max(c, 1)
    if correction == "bh":
        order = np.argsort(p, kind="stable")
        ranks = np.arange(1, p.size + 1)
        passed = p[order] <= ranks * alpha / max(c, 1)
        out = np.zeros(p.size, dtype=bool)
        if passed.any():
            last = int(np.flatnonzero(passed)[-1])
            out[order[: last + 1]] = True
        return out
    raise ValueError(f"correction must be one of {', '.join(CORRECTIONS)}, got {correction!r}")


def confidence_interval(
    estimate: npt.ArrayLike, std_error: npt.ArrayLike, level: float = 0.95
) -> tuple[FloatArray, FloatArray]:
    """Wald interval β ± z·se at ``level``; the lower end is raised to 0 but
    never past the estimate (so a negative estimate keeps its plain interval)."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    z = critical_z((1.0 - level) / 2.0)
    est = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(std_error, dtype=np.float64)
    low = est - z * se
    return np.where(est >= 0, np.maximum(low, 0.0), low), est + z * se


def selective_interval(
    estimate: npt.ArrayLike,
    std_error: npt.ArrayLike,
    cutoff_z: float | npt.ArrayLike,
    level: float = 0.95,
) -> tuple[FloatArray, FloatArray]:
    """Intervals for β given β̂ was selected because β̂/se > cutoff_z (see module docstring).

    ``cutoff_z`` may be one z per estimate (a truncation point cutoff_z·se each).
    Solved by bisection on β ∈ [0, β̂ + 40·se] (F_β(β̂) decreases in β), in
    log space so far tails stay exact; returned as the hull of the interval
    ∩ [0, ∞) and β̂ (see the module docstring), so low ≤ β̂ ≤ high always.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    x = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(std_error, dtype=np.float64)
    if np.any(se <= 0) or np.any(~np.isfinite(se)):
        raise ValueError("standard errors must be positive and finite")
    c = np.asarray(cutoff_z, dtype=np.float64) * se
    tail = (1.0 - level) / 2.0

    def log_upper_tail(mu: FloatArray) -> FloatArray:
        # log P(X > x | X > c) under mean mu; equals log(1 - F_mu(x))
        return np.asarray(
            log_ndtr(-(x - mu) / se) - log_ndtr(-(c - mu) / se),
            dtype=np.float64,
        )

    def solve(target: float) -> FloatArray:
        # find mu with P(X > x | X > c; mu) = target; the tail grows with mu
        # β < 0 is impossible: a root below 0 converges to 0 (the clip)
        lo = np.zeros_like(x)
        hi = np.maximum(x, 0.0) + 40.0 * se
        log_t = np.log(target)
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            above = log_upper_tail(mid) > log_t
            hi = np.where(above, mid, hi)
            lo = np.where(above, lo, mid)
        return 0.5 * (lo + hi)

    low = solve(tail)  # mu so small that x is in the upper tail
    low = np.where(log_upper_tail(np.zeros_like(x)) >= np.log(tail), 0.0, low)
    high = solve(1.0 - tail)
    return np.minimum(low, np.maximum(x, 0.0)), np.maximum(high, x)


def selection_cutoff(
    num_tests: int, num_significant: int, *, alpha: float, correction: Correction
) -> float:
    """The z a candidate's β̂/se had to pass to be reported under the test.

    For BH it is the data-dependent cutoff z_{rα/C} at the observed number r
    of rejections (conditioning on r as well is the usual approximation).
    """
    c = max(num_tests, 1)
    if correction == "bonferroni":
        return critical_z(alpha / c)
    if correction == "bh":
        return critical_z(max(num_significant, 1) * alpha / c)
    return critical_z(alpha)


def report_intervals(
    estimate: npt.ArrayLike,
    std_error: npt.ArrayLike,
    is_significant: npt.ArrayLike,
    *,
    method: IntervalMethod,
    alpha: float,
    correction: Correction,
    level: float = 0.95,
    width_error: npt.ArrayLike | None = None,
) -> tuple[FloatArray, FloatArray]:
    """The intervals a report prints: Wald for every row, or (``selective``)
    selection-adjusted for the significant rows. low ≤ estimate ≤ high holds
    for every row (a non-finite se gives the whole line, not NaN).

    ``width_error`` (default ``std_error``): the estimates' actual sd, when it is
    larger than the test's ``std_error`` (e.g. a robust one): the significant rows'
    intervals take their width from it, truncated where the test (on
    ``std_error``) selected them."""
    if method not in INTERVALS:
        raise ValueError(f"interval method must be one of {', '.join(INTERVALS)}, got {method!r}")
    est = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(std_error, dtype=np.float64)
    sig = np.asarray(is_significant, dtype=bool)
    finite = np.isfinite(se) & (se >= 0)
    low = np.full(est.shape, -np.inf)
    high = np.full(est.shape, np.inf)
    low[finite], high[finite] = confidence_interval(est[finite], se[finite], level)
    use = sig & finite & (se > 0)
    wide = se if width_error is None else np.maximum(np.asarray(width_error, np.float64), se)
    if width_error is not None and use.any():
        low[use], high[use] = confidence_interval(est[use], wide[use], level)
    if method == "selective" and use.any():
        cutoff = selection_cutoff(est.size, int(sig.sum()), alpha=alpha, correction=correction)
        # truncated at cutoff·se (the test's), in units of the wider sd
        z_c = cutoff * se[use] / wide[use]
        low[use], high[use] = selective_interval(est[use], wide[use], z_c, level)
    low = np.where(est >= 0, np.maximum(low, 0.0), low)
    return np.minimum(low, est), np.maximum(high, est)
