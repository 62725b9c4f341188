"""Statistics shared by the decoders: normal tails, confidence intervals and
multiple-testing corrections.

- One-sided z-test of H0: frequency = 0 against > 0: p = Φ̄(β/se).
- Bonferroni (default): reject when p ≤ α/C for C candidates tested
  (family-wise error ≤ α).
- Benjamini–Hochberg: sort p ascending, reject the first r with
  p_(r) ≤ r·α/C (false discovery rate ≤ α under independence or positive
  dependence; Benjamini & Hochberg, JRSS B 1995).
- Two-sided (1 - level) Wald intervals β ± z_{1-(1-level)/2}·se, clipped at 0
  because a frequency cannot be negative.
- Selection-adjusted intervals for values reported *because* they passed a
  test β̂/se > z_c: conditional on selection β̂ follows N(β, se²) truncated to
  (z_c·se, ∞), so the interval is {β : a/2 ≤ F_β(β̂) ≤ 1 - a/2} with
  F_β(x) = 1 - Φ̄((x-β)/se) / Φ̄((z_c·se-β)/se) (Lee, Sun, Sun, Taylor, Ann.
  Statist. 2016, the one-dimensional case). Plain Wald intervals of detected
  values undercover (winner's curse); these keep their level given selection.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import numpy.typing as npt
from scipy.special import log_ndtr, ndtr, ndtri

__all__ = [
    "CORRECTIONS",
    "Correction",
    "confidence_interval",
    "critical_z",
    "normal_sf",
    "one_sided_p_values",
    "selective_interval",
    "significant",
]

Correction = Literal["bonferroni", "bh", "none"]
CORRECTIONS: tuple[str, ...] = ("bonferroni", "bh", "none")
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
    """Wald interval β ± z·se at ``level``, lower end clipped at 0."""
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    z = critical_z((1.0 - level) / 2.0)
    est = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(std_error, dtype=np.float64)
    return np.maximum(est - z * se, 0.0), est + z * se


def selective_interval(
    estimate: npt.ArrayLike, std_error: npt.ArrayLike, cutoff_z: float, level: float = 0.95
) -> tuple[FloatArray, FloatArray]:
    """Intervals for β given β̂ was selected because β̂/se > cutoff_z (see module docstring).

    Solved by bisection on β (F_β(β̂) decreases in β), in log space so far
    tails stay exact. The lower end is clipped at 0.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    x = np.asarray(estimate, dtype=np.float64)
    se = np.asarray(std_error, dtype=np.float64)
    if np.any(se <= 0) or np.any(~np.isfinite(se)):
        raise ValueError("standard errors must be positive and finite")
    c = cutoff_z * se
    tail = (1.0 - level) / 2.0

    def log_upper_tail(mu: FloatArray) -> FloatArray:
        # log P(X > x | X > c) under mean mu; equals log(1 - F_mu(x))
        return np.asarray(
            log_ndtr(-(x - mu) / se) - log_ndtr(-(c - mu) / se),
            dtype=np.float64,
        )

    def solve(target: float) -> FloatArray:
        # find mu with P(X > x | X > c; mu) = target; the tail grows with mu
        lo = np.minimum(x, c) - 40.0 * se
        hi = x + 40.0 * se
        log_t = np.log(target)
        for _ in range(80):
            mid = 0.5 * (lo + hi)
            above = log_upper_tail(mid) > log_t
            hi = np.where(above, mid, hi)
            lo = np.where(above, lo, mid)
        return 0.5 * (lo + hi)

    low = solve(tail)  # mu so small that x is in the upper tail
    high = solve(1.0 - tail)
    return np.maximum(low, 0.0), high
