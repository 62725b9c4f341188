"""Empirical-Bayes denoising of many noisy frequencies (the "distribution" answer).

Given unbiased estimates β̂_v ~ N(β_v, s_v²) of frequencies β_v ≥ 0, the prior G is
estimated by nonparametric maximum likelihood on a grid 0 = u_0 < … < u_L (Kiefer &
Wolfowitz 1956; EM of Jiang & Zhang 2009; Koenker & Mizera 2014)::

    w ← mean_v [ w_l φ((β̂_v − u_l)/s_v) / Σ_l' w_l' φ((β̂_v − u_l')/s_v) ]

and each β_v is estimated by its posterior mean under Ĝ, with a (1 − a) posterior
interval: non-negative, shrunk towards what the other candidates look like. Errors are
treated as independent, so intervals are approximate (bench/accuracy.py measures their
coverage). With ``cutoff_z`` (only values that passed β̂_v/s_v > z_c) the likelihood is
truncated, φ((β̂_v − u_l)/s_v) / Φ̄((z_c·s_v − u_l)/s_v) (Lee, Sun, Sun & Taylor 2016),
correcting the winner's curse (Efron, JASA 2011). Why: docs/design.md, "Aggregator: decode".
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.special import log_ndtr

__all__ = ["Posterior", "npmle_posterior"]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Posterior:
    """Posterior mean, median and equal-tailed interval of every β_v under the fitted prior Ĝ."""

    mean: FloatArray
    median: FloatArray
    low: FloatArray
    high: FloatArray
    prior_grid: FloatArray
    prior_weights: FloatArray


def npmle_posterior(
    estimate: npt.ArrayLike,
    std_error: npt.ArrayLike,
    *,
    level: float = 0.95,
    grid_size: int = 300,
    iterations: int = 100,
    cutoff_z: float | None = None,
) -> Posterior:
    """Fit the prior on [0, max β̂ + 3 s] by EM and return the posteriors (see module docstring).

    ``cutoff_z``: the estimates were selected because β̂/s > cutoff_z; the
    prior is fitted with the truncated likelihood (see the module docstring).
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level}")
    x = np.asarray(estimate, dtype=np.float64)
    s = np.asarray(std_error, dtype=np.float64)
    if x.shape != s.shape or x.ndim != 1 or x.size == 0:
        raise ValueError("estimate and std_error must be equal-length non-empty vectors")
    if np.any(~np.isfinite(s)) or np.any(s <= 0) or np.any(~np.isfinite(x)):
        raise ValueError("standard errors must be positive and finite, estimates finite")
    top = max(float(np.max(x + 3 * s)), float(np.max(s)))
    # dense near 0, where most frequencies are: a quadratic grid
    grid = top * np.linspace(0.0, 1.0, grid_size) ** 2
    # Likelihoods scaled by each row's maximum (the scale cancels in every
    # posterior), so EM is two matrix-vector products per iteration.
    log_lik = -0.5 * ((x[:, None] - grid[None, :]) / s[:, None]) ** 2
    if cutoff_z is not None:
        # − log P(β̂/s > z_c | β = u_l): the selection's truncation
        log_lik -= log_ndtr((grid[None, :] - cutoff_z * s[:, None]) / s[:, None])
    lik = np.exp(log_lik - log_lik.max(axis=1, keepdims=True))  # (C, L)
    w = np.full(grid_size, 1.0 / grid_size)
    for _ in range(iterations):
        w = w * (lik.T @ (1.0 / np.maximum(lik @ w, 1e-300))) / x.size
        w /= w.sum()
    post = lik * np.maximum(w, 1e-300)  # no row is left without a posterior
    post /= post.sum(axis=1, keepdims=True)
    mean = post @ grid
    cdf = np.cumsum(post, axis=1)
    tail = (1.0 - level) / 2.0
    median = grid[np.argmax(cdf >= 0.5, axis=1)]
    low_idx = np.argmax(cdf >= tail, axis=1)
    high_idx = np.argmax(cdf >= 1.0 - tail, axis=1)
    low = np.minimum(grid[low_idx], mean)
    high = np.maximum(grid[high_idx], mean)
    return Posterior(mean, median, low, high, grid, w)
