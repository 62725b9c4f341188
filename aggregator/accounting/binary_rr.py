"""Shuffled binary randomized response: a proved (ε, δ) over every data set. Pure math.

Each report is the true bit w.p. p = e^ε0/(e^ε0+1), else its flip (q = 1 − p). With a
others holding 1 and b holding 0, the shuffled batch is the count of ones V + N, N =
Bin(a, p) + Bin(b, q), the victim's V ~ Bern(p) or Bern(q). Dropping others is a
post-processing in reverse (their reports are independent noise added to V + N), so
δ(a, b) ≤ δ(a1, n−1−a2) for every a in [a1, a2]: cells of a cover all data sets, split
until each cell's bound is below δ. N is log-concave (a sum of Bernoullis), so the
hockey stick's positive set is a tail: δ = max_s c1·P(N ≥ s−1) − c2·P(N ≥ s), c1 = p −
e^ε q, c2 = e^ε p − q, one tail per cell. Flipping every bit maps (a, b) to (b, a) and
swaps the two directions, so one direction over a ∈ [0, n−1] covers both. Float and
window errors are charged upward. Derivation: docs/design.md, "Aggregator: accounting",
binary randomized response.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from crowdmix.aggregator.accounting.pairs import (
    binom_logpmf,
    binom_window,
    check_shuffle_args,
    pmf_error,
)

__all__ = ["binary_rr_delta", "binary_rr_epsilon", "config_delta"]

_ULP = math.ulp(1.0)
# Each window leaves out at most this fraction of δ (charged in full).
_TAIL_FRACTION = 1e-7
# Initial cells of a; a certified crossing bracket wider than _MAX_SPAN falls back.
_CELLS_START = 64
_MAX_SPAN = 64
# Relative steps above the extreme data sets' ε tried, smallest first; each check
# gives up (the step fails) past _BUDGET cells. The extremes' ε to _EXTREME_XTOL.
_STEPS = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3, 1.0)
_BUDGET = 400
_EXTREME_XTOL = 1e-4
# Probabilities below this are read as 0 (their error charged): no subnormal products.
_FLUSH = 1e-150
# Above this ε0 nothing is computed (ε0 is returned), as for the generic bound.
_NO_BOUND = 50.0


def _flip(epsilon0: float) -> tuple[float, float]:
    q = 1.0 / (math.exp(epsilon0) + 1.0)
    return 1.0 - q, q


def config_delta(epsilon: float, epsilon0: float, ones: int, zeros: int, tail: float) -> float:
    """An upper bound on D_{e^ε}(P‖Q) with P = Bern(p) + N, Q = Bern(q) + N and
    N = Bin(ones, p) + Bin(zeros, q): the victim holds 1 under P, 0 under Q. Each
    binomial window leaves out at most ``tail`` of its mass (charged)."""
    import numpy as np
    from numpy.lib.stride_tricks import sliding_window_view
    from scipy import stats

    p, q = _flip(epsilon0)
    e = math.exp(epsilon)
    c1, c2 = p - e * q, e * p - q
    if c1 <= 0.0:
        # c1 ≤ 0 up to its rounding: the bound is at most that rounding's share.
        return max(0.0, c1 + 4.0 * _ULP * (p + e * q))
    # S is summed over its window, L read as a pmf and a tail: S has fewer draws.
    if ones <= zeros:
        s_n, s_p, l_n, l_p = ones, p, zeros, q
    else:
        s_n, s_p, l_n, l_p = zeros, q, ones, p
    s_lo, s_hi = binom_window(s_n, s_p, tail) if s_n > 0 else (0, 0)
    s_out = 0.0
    if s_lo > 0:
        s_out += float(stats.binom.cdf(s_lo - 1, s_n, s_p))
    if s_hi < s_n:
        s_out += float(stats.binom.sf(s_hi, s_n, s_p))
    j = np.arange(s_lo, s_hi + 1, dtype=np.float64)
    w = _flushed(np.exp(binom_logpmf(j, s_n, s_p))) if s_n > 0 else np.ones(1)
    # Relative error of a window sum: S's and L's pmf or tail (``pmf_error``), the
    # roundings of a running sum and a dot product over the window; 1.01× for products.
    rel = 1.01 * (pmf_error(max(s_n, 1), s_p) + pmf_error(max(l_n, 1), l_p))
    rel += 8.0 * _ULP * (j.size + 64)
    s_out *= 1.0 + rel
    w_rev = w[::-1].copy()
    # Factors below _FLUSH are set to 0 (subnormal products are slow): each product
    # of a window sum is then off by at most _FLUSH, or by underflow far below it.
    tiny = 2.0 * _FLUSH * (j.size + 2)
    mean = s_n * s_p + l_n * l_p
    var = max((s_n + l_n) * p * q, 1e-12)
    top = s_n + l_n + 1  # f(top − 1) > 0 = f(top): h(top) > 0 in exact arithmetic

    def h_signs(t0: int, t1: int) -> Any:
        """The signs of h(t) = c1 f(t−1) − c2 f(t) for t in [t0, t1] (1 ≤ t0) where
        certain, else 0: f over the block is L's pmf convolved with S's window
        (sums of terms ≥ 0)."""
        u = np.arange(t0 - 1 - s_hi, t1 - s_lo + 1, dtype=np.float64)
        pl = _flushed(np.exp(binom_logpmf(u, l_n, l_p)))
        f = sliding_window_view(pl, w.size) @ w_rev  # f(t0 − 1), …, f(t1)
        f_prev, f_t = f[:-1], f[1:]
        val = c1 * f_prev - c2 * f_t
        err = rel * (c1 * f_prev + c2 * f_t) + c2 * s_out + (c1 + c2) * tiny
        err += 8.0 * _ULP * (1.0 + e) * (f_prev + f_t)
        return np.where(val - err > 0.0, 1, np.where(val + err <= 0.0, -1, 0))

    def h_sign(t: int) -> int:
        return -1 if t <= 0 else int(h_signs(t, t)[0])  # t ≤ 0: f(t − 1) = 0

    # h changes sign once (f is log-concave): s* = min{t: h(t) > 0} ≤ top; a t with
    # h(t) certainly ≤ 0 is below s*, one with h(t) certainly > 0 is not. First a
    # block around a normal guess of the crossing f(t−1)/f(t) = c2/c1.
    guess = min(max(round(mean - 0.5 + var * math.log(c2 / c1)), 1), top)
    b0, b1 = max(1, guess - _MAX_SPAN // 2), min(top, guess + _MAX_SPAN // 2)
    signs = h_signs(b0, b1)
    negs, poss = np.flatnonzero(signs == -1), np.flatnonzero(signs == 1)
    if negs.size and poss.size:
        t_neg, t_pos = b0 + int(negs[-1]), b0 + int(poss[0])
    else:
        t_neg, t_pos = _bracket(h_sign, guess, round(mean), top)

    def tails(t: int) -> tuple[float, float]:
        """P(N ≥ t − 1), P(N ≥ t) over S's window: Σ_j w_j·P(L ≥ t − j), L's tail
        from scipy at the top and L's pmf summed down from it (all terms ≥ 0)."""
        u = np.arange(t - 1 - s_hi, t - s_lo + 1, dtype=np.float64)
        pl = _flushed(np.exp(binom_logpmf(u, l_n, l_p)))
        g = np.empty_like(pl)
        g[-1] = float(stats.binom.sf(u[-1] - 1.0, l_n, l_p))
        g[:-1] = g[-1] + np.cumsum(pl[:-1][::-1])[::-1]
        return float(g[-2::-1] @ w), float(g[:0:-1] @ w)

    if t_pos <= t_neg:  # certified signs out of order: only the trivial bound holds
        return c1 + 4.0 * _ULP * (p + e * q)
    # δ = Σ_{t ≥ s*} h(t) = g(s*) ≤ c1·P(N ≥ s* − 1) ≤ c1·P(N ≥ t_neg).
    if t_pos - t_neg > _MAX_SPAN:
        return c1 * (tails(t_neg + 1)[0] * (1.0 + rel) + s_out) + tiny
    best = 0.0
    for t in range(t_neg + 1, t_pos + 1):  # δ = g(s*), s* in (t_neg, t_pos]
        f_prev, f_t = tails(t)
        g_t = c1 * f_prev - c2 * f_t
        g_t += rel * (c1 * f_prev + c2 * f_t) + 8.0 * _ULP * (1.0 + e) * (f_prev + f_t)
        best = max(best, g_t)
    return best + c1 * s_out + tiny


def _flushed(x: Any) -> Any:
    """``x`` (probabilities in [0, 1]) with every value below _FLUSH set to 0."""
    import numpy as np

    return np.where(x < _FLUSH, 0.0, x)


def _bracket(h_sign: Callable[[int], int], guess: int, mean: int, top: int) -> tuple[int, int]:
    """(t_neg, t_pos) with t_neg < s* ≤ t_pos: h certainly ≤ 0 at t_neg, found by
    galloping right from the guess (or the mean, or 0) and bisecting; then the first
    certain h > 0 within _MAX_SPAN (else t_pos is set past it; top needs no check)."""
    t_neg = 0
    for start in (guess, min(max(mean, 1), top)):
        if h_sign(start) == -1:
            t_neg = start
            break
    step, t_hi = 1, top
    while t_neg + step < top:
        if h_sign(t_neg + step) != -1:
            t_hi = t_neg + step
            break
        t_neg, step = t_neg + step, 2 * step
    while t_hi - t_neg > 1:  # h_sign(t_hi) != -1 or t_hi = top
        mid = (t_neg + t_hi) // 2
        if h_sign(mid) == -1:
            t_neg = mid
        else:
            t_hi = mid
    t_pos = t_neg + 1
    while t_pos < min(top, t_neg + _MAX_SPAN) and h_sign(t_pos) != 1:
        t_pos += 1
    if t_pos < top and h_sign(t_pos) != 1:  # no certain crossing nearby
        t_pos = t_neg + _MAX_SPAN + 1
    return t_neg, t_pos


def _delta_cells(
    epsilon: float, epsilon0: float, n: int, delta: float, budget: int | None = None
) -> tuple[float, bool]:
    """Cells of a split until each cell's bound (``config_delta``) is at most δ or a
    single a: (the largest bound of those cells — an upper bound on every data set's
    δ(ε) — and whether it is at most δ). With a ``budget`` the check stops (False)
    at the first single a above δ or past ``budget`` cells read."""
    tail = _TAIL_FRACTION * delta
    last = n - 1
    # The extreme data sets first (usually the worst): a failure shows early.
    todo = [(0, 0), (last, last)] if last > 0 else [(0, 0)]
    size = max(1, -(-(last - 1) // _CELLS_START))
    todo = [(a, min(a + size - 1, last - 1)) for a in range(1, last, size)] + todo
    worst, read = 0.0, 0
    while todo:
        a1, a2 = todo.pop()
        # Every a in [a1, a2]: δ(a, n−1−a) ≤ δ(a1, n−1−a2) (fewer others).
        bound = config_delta(epsilon, epsilon0, a1, last - a2, tail)
        read += 1
        if bound <= delta or a1 == a2:
            worst = max(worst, bound)
            if bound > delta and budget is not None:
                return worst, False
            continue
        if budget is not None and read >= budget:
            return max(worst, bound), False
        mid = (a1 + a2) // 2
        todo += [(a1, mid), (mid + 1, a2)]  # the upper half first: δ(a) rises with a
    return worst, worst <= delta


def binary_rr_delta(epsilon: float, epsilon0: float, n: int, delta: float) -> float:
    """An upper bound on δ(ε) over every pair of neighbouring data sets of n shuffled
    binary RR reports: cells refined until each is below ``delta`` or a single a."""
    _check(epsilon0, n, delta)
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float) or not epsilon >= 0.0:
        raise ValueError(f"epsilon must be a non-negative number, got {epsilon!r}")
    return _delta_cells(float(epsilon), float(epsilon0), n, float(delta))[0]


def binary_rr_epsilon(epsilon0: float, n: int, delta: float) -> float:
    """The smallest ε of a ladder above the two extreme data sets' ε (everyone else
    holding 0, or 1) whose every cell is checked below δ; ε0 if none is below it.
    Cached; a few CPU seconds at most (n = 1e7)."""
    _check(epsilon0, n, delta)
    return _epsilon(float(epsilon0), n, float(delta))


@lru_cache(maxsize=256)
def _epsilon(epsilon0: float, n: int, delta: float) -> float:
    if epsilon0 == 0.0 or epsilon0 > _NO_BOUND:
        return epsilon0
    tail = _TAIL_FRACTION * delta

    def extremes(eps: float) -> float:
        return max(
            config_delta(eps, epsilon0, 0, n - 1, tail),
            config_delta(eps, epsilon0, n - 1, 0, tail),
        )

    if extremes(epsilon0) > delta:
        return epsilon0
    # Bisection: hi always has extremes(hi) ≤ δ; lo the other side (or 0).
    lo, hi = 0.0, epsilon0
    while hi - lo > _EXTREME_XTOL * hi:
        mid = 0.5 * (lo + hi)
        if extremes(mid) > delta:
            lo = mid
        else:
            hi = mid
    for step in _STEPS:
        eps = hi * (1.0 + step)
        if eps >= epsilon0:
            break
        if _delta_cells(eps, epsilon0, n, delta, _BUDGET)[1]:
            return eps
    return epsilon0


_check = check_shuffle_args
