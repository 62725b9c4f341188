"""Lower bounds: the exact privacy of concrete shuffled mechanisms on concrete data sets.

Each function returns an ε the real shuffled mechanism certainly needs at δ (rounded
down): the hockey-stick divergence of a projection of the shuffled output onto a few
counts, for one pair of neighbouring data sets, evaluated exactly with every left-out
(non-negative) term dropped and grids rounded the other way from the upper bounds. No
valid upper bound may be below any of them; ``bench/tightness.py`` prints the ratio.
k-RR: victim x0 vs x1, everyone else x2 (d ≥ 3) or 0 (d = 2). Bit vectors (OUE, a RAPPOR
report, the PRR): everyone else a value whose bits avoid the victim's, projected three
ways (one bit: (c) is ``lower_labelled``). Constructions: docs/design.md, "Aggregator:
accounting", lower bounds.
"""

from __future__ import annotations

import math
from typing import Any

from crowdmix.aggregator.accounting.lower_labelled import labelled_one_bit
from crowdmix.aggregator.accounting.pairs import (
    ClonePair,
    binom_window,
    symmetric_hockey_lower,
)

__all__ = [
    "bit_vector_lower",
    "krr_lower",
]

# Binary RR's lower bound sums every count up to here, a window of counts beyond.
_BINARY_ALL_N = 1_000_000
# Left-out mass of every window here (dropped: only lowers the figure).
_TAIL = 1e-18
# (c): label counts holding all but this much mass are summed (the rest dropped),
# on grids of this many points; skipped past _LABEL_MAX_N others.
_LABEL_DROP = 1e-4
_LABEL_GRID = 384
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
        return (
            _binary(epsilon0, n, delta)
            if n > _BINARY_ALL_N
            else (shuffled_rr_lower_bound(epsilon0, n, delta, domain=2))
        )
    e = math.exp(epsilon0)
    pair = ClonePair(p=e, alpha=1.0 / (e + domain - 1.0), r=1.0 / (e + domain - 1.0))
    return _lower_root(pair.evaluate(n, delta, tail=_TAIL), delta, epsilon0)


def _binary(epsilon0: float, n: int, delta: float) -> float:
    """Binary RR, everyone else 0: the count of ones, summed over a window of
    counts only (the terms left out are ≥ 0)."""
    from crowdmix.aggregator.accounting.amplification import _binary_rr_counts

    lo, hi = binom_window(n - 1, 1.0 / (math.exp(epsilon0) + 1.0), 1e-30)
    p, q, rel = _binary_rr_counts(epsilon0, n, lo, hi + 1)  # rel: float error, taken off

    def at(eps: float) -> float:
        e = math.exp(eps)
        return symmetric_hockey_lower(p, q, e, rel)

    return _root_down(_Kept(at), delta, epsilon0)


def _columns(p: float, q: float, bits: int, n: int, delta: float, upper: float) -> float:
    from crowdmix.aggregator.accounting.blanket import bit_sum_law, positive_part_mean

    # X rounded down and Y up: the opposite of the upper bound, so this only drops.
    x = bit_sum_law(bits, p, q, n, _TAIL / 1e-6, up=False)
    y = bit_sum_law(bits, p, q, n, _TAIL / 1e-6, up=True)
    low = 1.0 - x.rel_error - y.rel_error  # the points' float error, taken off
    kept = _Kept(lambda eps: low * positive_part_mean(x, y.values, y.probs, math.exp(eps)) / n)
    return _root_down(kept, delta, upper)


def _filtered(p: float, q: float, n: int, delta: float, upper: float) -> float:
    from crowdmix.aggregator.accounting.amplification import _lower_root

    pair = ClonePair(
        p=q * (1.0 - p) / ((1.0 - q) * p),
        alpha=(1.0 - p) * (1.0 - q) * p,
        r=(1.0 - q) * p * (1.0 - p),
    )
    return _lower_root(pair.evaluate(n, delta, tail=_TAIL), delta, upper)


def _labelled(p: float, q: float, bits: int, n: int, delta: float, upper: float) -> float:
    """(c): the others hold one value whose h bits (the labels) avoid the victim's.

    Against a reference where all n reports follow the others' law, P has density
    X/n with X = Σ_j w(c_j)·ρ(s_j): s_j the victim-x0 bits of report j, c_j the
    ones among its label bits, ρ(s) = Π r(s_i), w(c) = r(1)^−c·r(0)^−(h−c) with
    r(1) = q/p, r(0) = (1−q)/(1−p); Q the same with the x1 bits. Given the label
    counts G = (g_0..g_h), X and Y are independent copies of Σ_c w(c)·S_c (S_c
    the ρ-sum over the g_c reports with c label ones), so δ = Σ_G P(G)·
    E[(X_G − e^ε Y_G)_+]/n. Only the most likely G (all but _LABEL_DROP of the
    mass) are summed, X is rounded down and Y up onto grids: all lower it."""
    import numpy as np

    from crowdmix.aggregator.accounting.blanket import bit_sum_law, positive_part_mean

    r1, r0 = q / p, (1.0 - q) / (1.0 - p)
    label = [math.comb(bits, c) * q**c * (1.0 - q) ** (bits - c) for c in range(bits + 1)]
    weight = [r1 ** (-c) * r0 ** (-(bits - c)) for c in range(bits + 1)]
    configs = _likely_counts(n, label)
    grid = _LABEL_GRID
    sums: dict[tuple[int, int, bool], tuple[Any, Any]] = {}
    errors = [0.0]

    def group(c: int, g: int, up: bool) -> tuple[Any, Any]:
        key = (c, g, up)
        if key not in sums:
            if g == 0:
                sums[key] = (np.zeros(1), np.ones(1))
            else:
                law = bit_sum_law(bits, p, q, g, _TAIL / 1e-6, up=up)
                errors.append(law.rel_error)
                v, pr = _coarse(law.values, law.probs, up, grid)
                sums[key] = (weight[c] * v, pr)
        return sums[key]

    laws = []
    for g, prob in configs:
        xs = [group(c, g[c], False) for c in range(bits + 1)]
        ys = [group(c, g[c], True) for c in range(bits + 1)]
        xv, xp = _convolve(xs, up=False, cells=grid)
        yv, yp = _convolve(ys, up=True, cells=grid)
        laws.append((prob, _law_down(xv, xp), yv, yp))

    # Float error of the points: each of X's and Y's (h+1) parts and the label
    # counts' probability, taken off.
    low = 1.0 - (2 * (bits + 1) + 2) * max(errors)

    def delta_at(eps: float) -> float:
        c = math.exp(eps)
        total = math.fsum(w * positive_part_mean(x, yv, yp, c) for w, x, yv, yp in laws)
        return low * total / n

    return _root_down(_Kept(delta_at), delta, upper)


def _likely_counts(n: int, probs: list[float]) -> list[tuple[tuple[int, ...], float]]:
    """The most likely count vectors of Multinomial(n, probs) holding all but
    _LABEL_DROP of the mass (two or three categories)."""
    import numpy as np
    from scipy import stats

    cand: list[tuple[tuple[int, ...], float]]
    if len(probs) == 2:
        lo, hi = binom_window(n, probs[1], _LABEL_DROP)
        g1 = np.arange(lo, hi + 1)
        pm = stats.binom.pmf(g1, n, probs[1])
        cand = [((n - int(a), int(a)), float(w)) for a, w in zip(g1, pm, strict=True)]
    else:
        p2 = probs[2]
        lo2, hi2 = binom_window(n, p2, _LABEL_DROP)
        cand = []
        for a2 in range(lo2, hi2 + 1):
            rest = n - a2
            cond = probs[1] / (1.0 - p2)
            lo1, hi1 = binom_window(rest, cond, _LABEL_DROP)
            a1 = np.arange(lo1, hi1 + 1)
            pm = stats.binom.pmf(a2, n, p2) * stats.binom.pmf(a1, rest, cond)
            cand += [((rest - int(b), int(b), a2), float(w)) for b, w in zip(a1, pm, strict=True)]
    cand.sort(key=lambda cw: -cw[1])
    kept: list[tuple[tuple[int, ...], float]] = []
    total = 0.0
    for g, w in cand:
        if total >= 1.0 - _LABEL_DROP:
            break
        kept.append((g, w))
        total += w
    return kept


def _coarse(values: Any, probs: Any, up: bool, cells: int) -> tuple[Any, Any]:
    """Sorted points merged onto ``cells`` cells, each at its largest value if
    ``up`` else its smallest."""
    import numpy as np

    order = np.argsort(values, kind="stable")
    v, pr = values[order], probs[order]
    if len(v) <= cells or v[-1] == v[0]:
        return v, pr
    cell = np.floor((v - v[0]) / ((v[-1] - v[0]) / cells)).astype(np.int64)
    starts = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
    ends = np.concatenate((starts[1:], [len(v)]))
    return (v[ends - 1] if up else v[starts]), np.add.reduceat(pr, starts)


def _convolve(parts: list[tuple[Any, Any]], up: bool, cells: int) -> tuple[Any, Any]:
    """The law of a sum of independent discrete parts, coarsened after each step."""
    v, pr = parts[0]
    for w, q in parts[1:]:
        v = (v[:, None] + w[None, :]).ravel()
        pr = (pr[:, None] * q[None, :]).ravel()
        v, pr = _coarse(v, pr, up, cells)
    return v, pr


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


def bit_vector_lower(
    p: float, q: float, bits: int, n: int, delta: float, *, labelled: bool = True
) -> dict[str, float]:
    """Lower bounds (a), (b), (c) of the module docstring, by name (h ≤ 2; (b) for
    h = 1; (c) only when ``labelled``: for h = 1 at every n (``lower_labelled``, the
    Jensen sum; left out when it certifies nothing above (a) and (b)), for h = 2 up to
    n = _LABEL_MAX_N/8)."""
    upper = bits * (math.log(q) + math.log1p(-p) - math.log(p) - math.log1p(-q))
    out = {"columns": _columns(p, q, bits, n, delta, upper)}
    if bits == 1:
        out["filtered"] = _filtered(p, q, n, delta, upper)
        if labelled:
            found = labelled_one_bit(p, q, n, delta, max(out.values()), upper)
            if found > 0.0:
                out["labelled"] = found
    elif labelled and n <= _LABEL_MAX_N // bits**3:
        out["labelled"] = _labelled(p, q, bits, n, delta, upper)
    return out
