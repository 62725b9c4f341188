"""Composition of k releases: pure math.

- ``basic``: k mechanisms each (ε, δ)-DP are (kε, kδ)-DP.
- ``advanced`` (Dwork, Rothblum, Vadhan, FOCS 2010, Thm III.3): for any δ'' > 0,
  (ε·sqrt(2k·ln(1/δ'')) + k·ε·(e^ε − 1), k·δ + δ'')-DP, with δ'' = δ' − kδ for a target δ'.
- ``optimal`` (Kairouz, Oh, Viswanath, ICML 2015, Thm 3.3): k-fold adaptive composition
  is (ε_g, 1 − (1−δ)^k·(1 − H(ε_g)))-DP for any ε_g, with

      H(ε_g) = Σ_{l : (k−2l)ε > ε_g} C(k,l)·(e^{(k−l)ε} − e^{ε_g + lε}) / (1+e^ε)^k,

  the hockey-stick divergence of k-fold binary randomized response, summed in log space
  (logsumexp, so k in the millions is safe); the smallest ε_g meeting δ' is found by
  bisection, rounded up.
- ``pld``: compose the per-round dominating pair's privacy-loss distribution
  (``crowdmix.aggregator.accounting.pld``) rather than per-round (ε, δ).
"""

from __future__ import annotations

import math
from typing import Literal, get_args

__all__ = [
    "METHODS",
    "CompositionMethod",
    "compose",
    "compose_advanced",
    "compose_basic",
    "compose_optimal",
    "optimal_delta",
]

CompositionMethod = Literal["basic", "advanced", "optimal"]
METHODS: tuple[str, ...] = get_args(CompositionMethod)


def _check(epsilon: float, delta: float, k: int) -> None:
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        raise ValueError(f"epsilon must be a number, got {epsilon!r}")
    if not 0.0 <= epsilon < math.inf:
        raise ValueError(f"epsilon must be finite and non-negative, got {epsilon!r}")
    if isinstance(delta, bool) or not isinstance(delta, int | float) or not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")


def _check_target(target_delta: float) -> None:
    if (
        isinstance(target_delta, bool)
        or not isinstance(target_delta, int | float)
        or not 0.0 < target_delta < 1.0
    ):
        raise ValueError(f"target_delta must be in (0, 1), got {target_delta!r}")


def compose_basic(epsilon: float, delta: float, k: int) -> tuple[float, float]:
    """(kε, kδ)."""
    _check(epsilon, delta, k)
    return k * epsilon, min(1.0, float(k * delta))


def compose_advanced(epsilon: float, delta: float, k: int, target_delta: float) -> float:
    """DRV10 advanced composition: ε_total for total δ = target_delta."""
    _check(epsilon, delta, k)
    _check_target(target_delta)
    slack = target_delta - k * delta
    if slack <= 0.0:
        raise ValueError(
            f"target_delta ({target_delta}) must exceed k·delta ({k * delta}) for advanced "
            "composition"
        )
    return epsilon * math.sqrt(2.0 * k * math.log(1.0 / slack)) + k * epsilon * math.expm1(epsilon)


def _log_h(epsilon: float, k: int, eps_g: float) -> float:
    """log H(ε_g) for k-fold composition of ε-DP binary randomized response."""
    import numpy as np
    from scipy.special import gammaln, logsumexp

    if epsilon == 0.0:
        return -math.inf
    # Terms with (k − 2l)ε > ε_g, i.e. l < (k − ε_g/ε)/2.
    l_max = math.ceil((k - eps_g / epsilon) / 2.0) - 1
    if l_max < 0:
        return -math.inf
    ls = np.arange(0, min(l_max, k) + 1, dtype=np.float64)
    gap = eps_g - (k - 2.0 * ls) * epsilon  # < 0 on these terms
    gap = np.minimum(gap, -1e-300)
    log_terms = (
        gammaln(k + 1.0)
        - gammaln(ls + 1.0)
        - gammaln(k - ls + 1.0)
        + (k - ls) * epsilon
        + np.log(-np.expm1(gap))
        - k * float(np.logaddexp(0.0, epsilon))  # k·log(1 + e^ε) without overflow
    )
    return float(logsumexp(log_terms))


def optimal_delta(epsilon: float, delta: float, k: int, eps_g: float) -> float:
    """δ_g such that k-fold composition of (ε, δ)-DP is (ε_g, δ_g)-DP, exactly (KOV15)."""
    _check(epsilon, delta, k)
    h = math.exp(_log_h(epsilon, k, eps_g))
    # 1 − (1−δ)^k (1 − H), with (1−δ)^k = exp(k·log1p(−δ)).
    return -math.expm1(k * math.log1p(-delta) + math.log1p(-min(h, 1.0)))


def compose_optimal(epsilon: float, delta: float, k: int, target_delta: float) -> float:
    """Smallest ε_g with optimal_delta(ε_g) ≤ target_delta (KOV15), rounded up."""
    _check(epsilon, delta, k)
    _check_target(target_delta)
    # Need H(ε_g) ≤ 1 − (1−δ')/(1−δ)^k.
    log_rest = math.log1p(-target_delta) - k * math.log1p(-delta)
    if log_rest >= 0.0:
        raise ValueError(
            f"target_delta ({target_delta}) must exceed 1-(1-delta)^k "
            f"({-math.expm1(k * math.log1p(-delta))})"
        )
    log_target = math.log(-math.expm1(log_rest))
    lo, hi = 0.0, k * epsilon
    if _log_h(epsilon, k, 0.0) <= log_target:
        return 0.0
    while hi - lo > 1e-10 * max(hi, 1e-9):
        mid = 0.5 * (lo + hi)
        if _log_h(epsilon, k, mid) <= log_target:
            hi = mid
        else:
            lo = mid
    return hi


def compose(
    epsilon: float, delta: float, k: int, target_delta: float, method: str = "optimal"
) -> tuple[float, float]:
    """(ε, δ) of k releases each (ε, δ)-DP; δ is target_delta except for ``basic`` (kδ)."""
    if method == "basic":
        return compose_basic(epsilon, delta, k)
    if method == "advanced":
        return compose_advanced(epsilon, delta, k, target_delta), target_delta
    if method == "optimal":
        return compose_optimal(epsilon, delta, k, target_delta), target_delta
    raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
