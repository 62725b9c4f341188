"""Bounds for seeded statistical tests.

Every check here fails with probability at most ``alpha`` when the tested
property holds, by exact binomial tails (Clopper–Pearson) or Hoeffding, so a
test that makes N checks at ``alpha`` states a false-failure probability of
at most N·alpha (union bound).
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import stats

# Per-check false-failure probability; tests make at most a few hundred checks
# per test (so <= 1e-6 per test by the union bound; each test states its N).
ALPHA = 1e-9


def binomial_ok(count: int | npt.NDArray[np.int64], n: int, p: float, alpha: float = ALPHA) -> bool:
    """Whether every count is consistent with Binomial(n, p) at two-sided level alpha.

    Fails if count is below the alpha/2 quantile or above the 1 - alpha/2
    quantile of the exact binomial distribution.
    """
    counts = np.atleast_1d(np.asarray(count))
    lo = stats.binom.ppf(alpha / 2, n, p)
    hi = stats.binom.isf(alpha / 2, n, p)
    return bool(np.all((counts >= lo) & (counts <= hi)))


def clopper_pearson(
    count: npt.NDArray[np.int64], n: int, alpha: float = ALPHA
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """One-sided-alpha lower and upper confidence bounds on a binomial p, per count."""
    c = np.asarray(count, dtype=np.float64)
    lo = np.where(c > 0, stats.beta.ppf(alpha, c, n - c + 1), 0.0)
    hi = np.where(c < n, stats.beta.isf(alpha, c + 1, n - c), 1.0)
    return lo, hi


def chi_square_ok(observed: npt.NDArray[np.int64], alpha: float = ALPHA) -> bool:
    """Uniformity of counts over categories at level alpha (chi-square, df = cells - 1)."""
    obs = np.asarray(observed, dtype=np.float64)
    expected = obs.sum() / obs.size
    chi2 = float(((obs - expected) ** 2 / expected).sum())
    return chi2 <= float(stats.chi2.isf(alpha, obs.size - 1))


def log_ratio_lower_bound(
    counts_x: npt.NDArray[np.int64],
    n_x: int,
    counts_y: npt.NDArray[np.int64],
    n_y: int,
    alpha: float = ALPHA,
) -> float:
    """max over outputs of a lower confidence bound on ln(P(o|x) / P(o|y)).

    Uses the Clopper–Pearson lower bound for P(o|x) and upper bound for P(o|y):
    if every true ratio is at most e^ε, the result exceeds ε with probability at
    most 2·alpha·(number of outputs).
    """
    lo_x, _ = clopper_pearson(counts_x, n_x, alpha)
    _, hi_y = clopper_pearson(counts_y, n_y, alpha)
    with np.errstate(divide="ignore"):
        ratios = np.where(lo_x > 0, np.log(lo_x) - np.log(hi_y), -math.inf)
    return float(ratios.max())
