"""Lower bounds: the exact privacy of concrete shuffled mechanisms on concrete data sets.

Each function returns an ε that the real shuffled mechanism certainly needs at
δ (rounded down): the hockey-stick divergence of a post-processing of the
shuffled output (a projection onto a few counts) for one pair of neighbouring
data sets, evaluated exactly with every left-out term dropped (all terms are
≥ 0) and grids rounded the other way from the upper bounds. No valid upper
bound may be below any of them; ``bench/tightness.py`` prints ours ÷ these.

- k-ary RR, d ≥ 3: victim x0 vs x1, everyone else x2; the counts (N0, N1)
  (``pairs.ClonePair`` with p = e^ε0, α = r = 1/(e^ε0+d−1)). d = 2: everyone
  else 0; the count of ones (``amplification.shuffled_rr_lower_bound``).
- bit vectors (OUE, a RAPPOR report, the PRR): everyone else a value whose
  bits avoid the victim's; (a) the column counts over B0 and B1 (exactly the
  blanket's δ_m at m = n − 1, every other user cover); (b) h = 1: only the
  reports whose bit of the others' value is 0, counting (1, 0) and (0, 1) on
  (x0, x1) (a ClonePair); (c) h = 1: all four counts of those columns within
  each value of that bit, the exact likelihood ratio of the three columns.
"""

from __future__ import annotations

import math
from typing import Any

from crowdmix.aggregator.accounting.pairs import ClonePair, binom_window

__all__ = [
    "bit_vector_lower",
    "krr_lower",
]

# Left-out mass of every window here (dropped: only lowers the figure).
_TAIL = 1e-18
# Standard deviations of the others' label count kept in (c) (the rest dropped).
_LABEL_SD = 5.0
# (c) is summed over every label count: skipped past this many others.
_LABEL_MAX_N = 20_000


class _Kept:
    """δ(ε) from a function that already leaves terms out (a lower bound)."""

    tail = 0.0

    def __init__(self, fn: Any) -> None:
        self._fn = fn

    def delta(self, epsilon: float) -> float:
        return float(self._fn(epsilon))


def _root_down(profile: Any, delta: float, upper: float) -> float:
    """Largest ε in [0, upper] with δ(ε) > δ, by bisection, rounded down (0 if none)."""
    if profile.delta(0.0) <= delta:
        return 0.0
    lo, hi = 0.0, upper
    if profile.delta(hi) > delta:
        return hi
    while hi - lo > 1e-7 * max(lo, 1e-9):
        mid = 0.5 * (lo + hi)
        if profile.delta(mid) > delta:
            lo = mid
        else:
            hi = mid
    return lo


def krr_lower(epsilon0: float, domain: int, n: int, delta: float) -> float:
    """ε that shuffled k-ary RR needs (module docstring)."""
    from crowdmix.aggregator.accounting.amplification import _lower_root, shuffled_rr_lower_bound

    if domain == 2:
        return shuffled_rr_lower_bound(epsilon0, n, delta, domain=2)
    e = math.exp(epsilon0)
    pair = ClonePair(p=e, alpha=1.0 / (e + domain - 1.0), r=1.0 / (e + domain - 1.0))
    return _lower_root(pair.evaluate(n, delta, tail=_TAIL), delta, epsilon0)


def _columns(p: float, q: float, bits: int, n: int, delta: float, upper: float) -> float:
    from crowdmix.aggregator.accounting.blanket import bit_sum_law, positive_part_mean

    # X rounded down and Y up: the opposite of the upper bound, so this only drops.
    x = bit_sum_law(bits, p, q, n, _TAIL / 1e-6, up=False)
    y = bit_sum_law(bits, p, q, n, _TAIL / 1e-6, up=True)
    kept = _Kept(lambda eps: positive_part_mean(x, y.values, y.probs, math.exp(eps)) / n)
    return _root_down(kept, delta, upper)


def _filtered(p: float, q: float, n: int, delta: float, upper: float) -> float:
    from crowdmix.aggregator.accounting.amplification import _lower_root

    pair = ClonePair(
        p=q * (1.0 - p) / ((1.0 - q) * p),
        alpha=(1.0 - p) * (1.0 - q) * p,
        r=(1.0 - q) * p * (1.0 - p),
    )
    return _lower_root(pair.evaluate(n, delta, tail=_TAIL), delta, upper)


def _labelled(p: float, q: float, n: int, delta: float, upper: float) -> float:
    """(c): others hold a value whose bit is column 2. Against a reference where all n
    reports follow the others' law, P has density X/n with X = Σ_j r(b0_j)·w(b2_j)
    (r(1) = q/p, r(0) = (1−q)/(1−p), w = 1/r), Q the same with b1. Given the count G
    of reports with b2 = 1, the column counts in each group are independent
    binomials, so X and Y are independent copies: δ = Σ_G P(G)·E[(X_G − e^ε Y_G)_+]/n."""
    import numpy as np
    from scipy import stats

    from crowdmix.aggregator.accounting.blanket import BitLaw, positive_part_mean

    r1, r0 = q / p, (1.0 - q) / (1.0 - p)
    w1, w0 = 1.0 / r1, 1.0 / r0
    mean, sd = n * q, math.sqrt(n * q * (1.0 - q))
    g_lo = max(0, math.floor(mean - _LABEL_SD * sd))
    g_hi = min(n, math.ceil(mean + _LABEL_SD * sd))
    laws: list[tuple[float, BitLaw, Any, Any]] = []
    for g1 in range(g_lo, g_hi + 1):
        g0 = n - g1
        weight = float(stats.binom.pmf(g1, n, q))
        lo0, hi0 = binom_window(g0, p, 1e-12)
        lo1, hi1 = binom_window(g1, p, 1e-12)
        a0 = np.arange(lo0, hi0 + 1, dtype=np.float64)
        a1 = np.arange(lo1, hi1 + 1, dtype=np.float64)
        p0 = np.exp(stats.binom.logpmf(a0, g0, p))
        p1 = np.exp(stats.binom.logpmf(a1, g1, p))
        base = r0 * (w0 * g0 + w1 * g1)
        values = (base + (r1 - r0) * (w0 * a0[:, None] + w1 * a1[None, :])).ravel()
        probs = (p0[:, None] * p1[None, :]).ravel()
        yv, yp = _up(values, probs)
        laws.append((weight, _law_down(values, probs), yv, yp))

    def delta_at(eps: float) -> float:
        c = math.exp(eps)
        total = 0.0
        for weight, x, yv, yp in laws:
            total += weight * positive_part_mean(x, yv, yp, c)
        return total / n

    return _root_down(_Kept(delta_at), delta, upper)


def _law_down(values: Any, probs: Any) -> Any:
    """A ``BitLaw`` of the points rounded down onto at most 4096 cells."""
    import numpy as np

    from crowdmix.aggregator.accounting.blanket import BitLaw

    order = np.argsort(values, kind="stable")
    v, pr = values[order], probs[order]
    if len(v) > 4096:
        cell = np.floor((v - v[0]) / ((v[-1] - v[0]) / 4096)).astype(np.int64)
        starts = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
        pr = np.add.reduceat(pr, starts)
        v = v[starts]
    s0 = np.concatenate((np.cumsum(pr[::-1])[::-1], [0.0]))
    s1 = np.concatenate((np.cumsum((pr * v)[::-1])[::-1], [0.0]))
    return BitLaw(values=v, probs=pr, s0=s0, s1=s1, missing=0.0, tilted_missing=0.0)


def _up(values: Any, probs: Any) -> tuple[Any, Any]:
    """Y's points rounded up onto at most 4096 cells (lowers E[(X − cY)_+])."""
    import numpy as np

    order = np.argsort(values, kind="stable")
    v, pr = values[order], probs[order]
    if len(v) <= 4096:
        return v, pr
    cell = np.floor((v - v[0]) / ((v[-1] - v[0]) / 4096)).astype(np.int64)
    starts = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
    ends = np.concatenate((starts[1:], [len(v)]))
    return v[ends - 1], np.add.reduceat(pr, starts)


def bit_vector_lower(
    p: float, q: float, bits: int, n: int, delta: float, *, labelled: bool = True
) -> dict[str, float]:
    """Lower bounds (a), (b), (c) of the module docstring, by name (h ≤ 2; (b) and
    (c) for h = 1; (c) only up to _LABEL_MAX_N and when ``labelled``)."""
    upper = bits * (math.log(q) + math.log1p(-p) - math.log(p) - math.log1p(-q))
    out = {"columns": _columns(p, q, bits, n, delta, upper)}
    if bits == 1:
        out["filtered"] = _filtered(p, q, n, delta, upper)
        if labelled and n <= _LABEL_MAX_N:
            out["labelled"] = _labelled(p, q, n, delta, upper)
    return out
