"""Central δ(ε) of a shuffled histogram whose devices apply k-RR to their real report,
counting the other honest devices' k-RR noise as cover beside their fakes. Pure math.

An honest device's real report is, with probability γ = d·r (r = 1/(e^ε_L + d − 1)), a
uniform draw independent of its value — the "privacy blanket" of Balle, Bell, Gascón and
Nissim (CRYPTO 2019) — and otherwise its value. Revealing every other device's value and
blanket coin to the analyst (a post-processing superset of its view) leaves f uniform cover
items: the filled fake slots and the blanket reports, F = Bin(n_h·m, q) + Bin(n_h, γ).
Given f the view is computed exactly (``uniform_cover_delta``), the target's own k-RR
included; ``blanket_delta`` takes the mixture over F. Without k-RR the figure is
``histogram.fake_delta``; with it, this one is never above the old (1 − γ)·fake_delta
(that one also reveals the target's coin and drops the blanket).
"""

from __future__ import annotations

import functools
import math
from typing import Any

__all__ = ["blanket_delta", "cover_grid", "uniform_cover_delta"]

_FLOAT_MARGIN = 1e-9  # relative error allowed per pmf/sf term (boost: ~1e-10)
_ABS_MARGIN = 1e-300
#: Cells of one block of pmf/sf evaluations: bounds memory, not the figure.
_BLOCK_CELLS = 1 << 18


def _rates(domain_size: int, local_epsilon: float) -> tuple[float, float]:
    """(p, r) of k-RR: p = e^ε_L r, r = 1/(e^ε_L + d − 1)."""
    r = 1.0 / (math.exp(local_epsilon) + domain_size - 1)
    return math.exp(local_epsilon) * r, r


def _spans(f: Any, prob: float) -> tuple[Any, Any]:
    """Row windows [lo, hi] of Bin(f, prob) for an array of f: μ ± (9.5 sd + 40), a speed
    choice only (the mass outside is computed and bounded by the callers)."""
    import numpy as np

    mu = f * prob
    width = 9.5 * np.sqrt(mu * (1.0 - prob)) + 40.0
    lo = np.clip(np.floor(mu - width), 0, f).astype(np.int64)
    hi = np.clip(np.ceil(mu + width), 0, f).astype(np.int64)
    return lo, hi


def _rows(epsilon: float, items: Any, domain_size: int, local_epsilon: float) -> Any:
    """δ_f(ε) for an array of f (see ``uniform_cover_delta``), upper bounds; the f go in
    blocks of at most ``_BLOCK_CELLS`` window cells (one f at least)."""
    import numpy as np

    f = np.atleast_1d(np.asarray(items, dtype=np.int64))
    lo, hi = _spans(f, min(1.0, 2.0 / domain_size))
    ends = np.cumsum(hi - lo + 1)
    out = np.empty(f.shape, dtype=float)
    start = 0
    while start < f.size:
        before = int(ends[start - 1]) if start > 0 else 0
        stop = max(start + 1, int(np.searchsorted(ends, before + _BLOCK_CELLS, side="right")))
        out[start:stop] = _rows_block(epsilon, f[start:stop], domain_size, local_epsilon)
        start = stop
    return out


def _rows_block(epsilon: float, f: Any, domain_size: int, local_epsilon: float) -> Any:
    """``_rows`` for one block of f."""
    import numpy as np
    from scipy import stats

    d = domain_size
    p, r = _rates(d, local_epsilon)
    e = math.exp(epsilon)
    a1, a2, a3 = p - e * r, r - e * p, -(d - 2) * r * math.expm1(epsilon)
    s2 = min(1.0, 2.0 / d)
    lo, hi = _spans(f, s2)
    sizes = hi - lo + 1
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    ff = np.repeat(f, sizes)
    v = np.repeat(lo - starts, sizes) + np.arange(int(sizes.sum()), dtype=np.int64)
    u = v + 1  # v: cover items in {x, x'}; u: with the target's report
    pi_v = stats.binom.pmf(v, ff, s2)
    pi_u = stats.binom.pmf(u, ff, s2)
    theta = math.expm1(epsilon) * (ff + 1) / math.expm1(local_epsilon)
    k0 = np.floor((theta + e * u) / (1.0 + e)).astype(np.int64) + 1
    s = stats.binom.sf(k0 - 1, v, 0.5)  # Pr[Bin(u − 1, ½) ≥ k0]
    b = stats.binom.pmf(k0 - 1, v, 0.5)  # Pr[Bin(u − 1, ½) = k0 − 1]
    t1 = a1 * pi_v * (s + b)
    t2 = a2 * pi_v * s
    t3 = a3 * pi_u * (s + 0.5 * b)
    row = np.maximum(t1 + t2 + t3, 0.0)  # each row is a sum of non-negative terms
    slack = _FLOAT_MARGIN * (np.abs(t1) + np.abs(t2) + np.abs(t3))
    total = np.add.reduceat(row + slack, starts)
    # rows whose v lies outside the window: each at most a1·π(v)
    below = np.where(lo > 0, stats.binom.cdf(lo - 1, f, s2), 0.0)
    above = np.where(hi < f, stats.binom.sf(hi, f, s2), 0.0)
    return np.minimum(1.0, total + a1 * (below + above) + _ABS_MARGIN)


def uniform_cover_delta(
    epsilon: float, items: int, *, domain_size: int, local_epsilon: float
) -> float:
    """δ_f(ε) = D_{e^ε}(P ‖ Q) for the target's k-RR report among f cover items, each
    i.i.d. uniform over the d buckets (an upper bound only by float margins).

    The view is the histogram H of f + 1 reports: the f items and the target's report Y,
    which is x w.p. p = e^ε_L·r and each other value w.p. r = 1/(e^ε_L + d − 1), under P
    (value x) and with x' in place of x under Q. 0 for ε ≥ ε_L.

    (i) (H_x, H_x') is sufficient: given (H_x, H_x') = (i, j), the other f + 1 − i − j
    reports are i.i.d. uniform over the d − 2 other buckets under P and Q alike (a cover
    item outside {x, x'} is uniform there, and so is Y given Y ∉ {x, x'}).
    (ii) With T(i, j) the cover's trinomial law (f; 1/d, 1/d) of (C_x, C_x'):
    P(i, j) = p·T(i−1, j) + r·T(i, j−1) + (d−2)·r·T(i, j), and Q with p and r swapped.
    (iii) T(i−1, j)/T(i, j) = i(d−2)/(f−i−j+1) and T(i, j−1)/T(i, j) = j(d−2)/(f−i−j+1), so
    P − e^ε Q has the sign of (p − r)(i − e^ε j) − (e^ε − 1)·r·(f + 1): positive exactly
    when i − e^ε j > θ = (e^ε − 1)(f + 1)/(e^ε_L − 1) (on the edge i + j = f + 1, where
    T(i, j) = 0, the same sign follows from T(i−1, j)/T(i, j−1) = i/j).
    (iv) With u = i + j, π = Bin(f, 2/d), B_t = Bin(t, ½), S = Pr[B_{u−1} ≥ k0],
    b = Pr[B_{u−1} = k0 − 1] and k0 = ⌊(θ + e^ε u)/(1 + e^ε)⌋ + 1 (the region's first i),

        δ_f(ε) = Σ_{u≥1} (p − e^ε r)·π(u−1)·(S + b) + (r − e^ε p)·π(u−1)·S
                        − (d−2)·r·(e^ε − 1)·π(u)·(S + b/2),

    each row the sum of the non-negative terms of its region (Pr[B_u ≥ k0] = S + b/2:
    B_u is B_{u−1} plus a fair coin). Rows are computed from boost's binomial pmf and
    sf (relative error ~1e-10), each allowed 1e-9 of its terms' absolute sum; rows outside
    π's window (mass ≤ 2e-30) are bounded by (p − e^ε r)·π and added.

    Without k-RR (p = 1, r = 0) this is the shift pair of ``histogram.fake_delta`` given
    M = u − 1; ``tests/histogram`` checks both against enumeration of the histogram.
    """
    _check(epsilon, domain_size, local_epsilon)
    if isinstance(items, bool) or not isinstance(items, int) or items < 0:
        raise ValueError(f"items must be a non-negative integer, got {items!r}")
    if epsilon >= local_epsilon:
        return 0.0
    return float(_rows(epsilon, [items], domain_size, local_epsilon)[0])


def _check(epsilon: float, domain_size: int, local_epsilon: float) -> None:
    if not math.isfinite(epsilon) or epsilon < 0.0:
        raise ValueError(f"epsilon must be finite and non-negative, got {epsilon!r}")
    if isinstance(domain_size, bool) or not isinstance(domain_size, int) or domain_size < 2:
        raise ValueError(f"domain_size must be an integer >= 2, got {domain_size!r}")
    if not math.isfinite(local_epsilon) or local_epsilon <= 0.0:
        raise ValueError(f"local_epsilon must be positive and finite, got {local_epsilon!r}")


#: The fixed grid of cover counts: f_b = ⌊(κ·b/2)²⌋, spacing ≈ κ·√f (every integer below
#: 1/κ²). Fixed, so the figure is monotone in the crowd (see ``blanket_delta``).
_GRID_KAPPA = 0.2


def _grid(lo: int, hi: int) -> Any:
    """The fixed grid's points in [lo, hi] (never empty: spacing ≤ 1 + κ·√hi)."""
    import numpy as np

    b0 = math.floor(2.0 * math.sqrt(lo) / _GRID_KAPPA)
    b1 = math.ceil(2.0 * math.sqrt(hi) / _GRID_KAPPA) + 1
    pts = np.floor((_GRID_KAPPA * np.arange(b0, b1 + 1) / 2.0) ** 2).astype(np.int64)
    return np.unique(pts[(pts >= lo) & (pts <= hi)])


@functools.lru_cache(maxsize=64)
def cover_grid(
    fake_slots: int, fake_probability: float, others: int, blanket_probability: float
) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """Points f_0 < … < f_B and c_b ≥ Pr[F < f_b] for F = Bin(fake_slots, q) +
    Bin(others, γ), the uniform cover items.

    The points are those of a fixed grid (``_GRID_KAPPA``) inside F's window (μ ± (9.5 sd
    + 40) per component): a speed choice, since ``blanket_delta`` charges each bin the
    figure of its left end and 1 below f_0. c_b sums pmf × cdf over
    the component with the shorter window, plus that component's mass outside it (so c_b
    is an upper bound), times (1 + 1e-9).
    """
    import numpy as np
    from scipy import stats

    comps = [(fake_slots, fake_probability), (others, blanket_probability)]
    wins = []
    for n, p in comps:
        lo_, hi_ = _spans(np.asarray([n]), p)
        wins.append((int(lo_[0]), int(hi_[0])))
    points = _grid(wins[0][0] + wins[1][0], wins[0][1] + wins[1][1])
    # outer sum over the component with the shorter window
    inner, outer = (0, 1) if wins[1][1] - wins[1][0] <= wins[0][1] - wins[0][0] else (1, 0)
    (n_in, p_in), (n_out, p_out) = comps[inner], comps[outer]
    k = np.arange(wins[outer][0], wins[outer][1] + 1, dtype=np.int64)
    w = stats.binom.pmf(k, n_out, p_out) if n_out > 0 else np.ones(1)
    if n_out == 0:
        k = np.zeros(1, dtype=np.int64)
    left_out = 0.0
    if n_out > 0:
        left_out = float(stats.binom.cdf(k[0] - 1, n_out, p_out) if k[0] > 0 else 0.0) + float(
            stats.binom.sf(k[-1], n_out, p_out)
        )
    total = np.empty(points.shape, dtype=float)
    rows = max(1, _BLOCK_CELLS // k.size)  # blocks of points: bounds memory only
    for start in range(0, points.size, rows):
        arg = points[start : start + rows, None] - 1 - k[None, :]
        c = stats.binom.cdf(arg, n_in, p_in) if n_in > 0 else (arg >= 0).astype(float)
        total[start : start + rows] = c @ w + left_out
    cdfs = np.minimum(1.0, total * (1.0 + _FLOAT_MARGIN) + _ABS_MARGIN)
    return tuple(int(x) for x in points), tuple(cdfs)


def blanket_delta(
    epsilon: float,
    *,
    n_honest: int,
    domain_size: int,
    fake_slots: int,
    fake_probability: float,
    local_epsilon: float,
) -> float:
    """Upper bound on δ(ε) of one device's value in the shuffled histogram, counting
    as cover the fakes and the k-RR noise of ``n_honest`` honest devices besides it.

    Reduction. Reveal to the analyst the reports of everyone but the target and the
    honest others (dishonest devices, the target's own fakes: all independent of its
    value), each honest other's value and k-RR coin — its real report is, w.p. γ = d·r, a
    uniform draw independent of its value (the blanket decomposition of Balle, Bell,
    Gascón and Nissim, "The privacy blanket of the shuffle model", CRYPTO 2019,
    arXiv:1903.02837, §3; for k-RR, d·r is the mass common to all its output laws) and
    otherwise its value — and which fake slots are filled. The view is a function of this
    larger one, whose laws under P and Q are mixtures, with the same weights, over F = f,
    the number of uniform cover items (F = Bin(n_h·m, q) + Bin(n_h, γ)), of the views of
    ``uniform_cover_delta``. D_{e^ε} is an f-divergence, so it does not grow under
    post-processing and is jointly convex (Liese and Vajda, IEEE Trans. Inf. Theory 52,
    2006): δ(ε) ≤ E[δ_F(ε)].

    δ_f is non-increasing in f (one more independent uniform item is the same
    post-processing under P and Q), so with the grid of ``cover_grid`` and g_b the
    running maximum from the right of δ_{f_b}, E[δ_F] ≤ g_B + Σ_b (g_{b−1} − g_b)·c_b
    (g_{−1} = 1), every term non-negative. The same argument with the fakes alone and
    the target's coin revealed gives the older (1 − γ)·``fake_delta``: this is never
    above it (up to the grid, which the caller covers by taking the smaller).
    """
    import numpy as np

    _check(epsilon, domain_size, local_epsilon)
    if epsilon >= local_epsilon:
        return 0.0
    d = domain_size
    gamma = d / (math.exp(local_epsilon) + d - 1)
    points, cdf = cover_grid(n_honest * fake_slots, fake_probability, n_honest, gamma)
    g = _rows(epsilon, points, d, local_epsilon)
    g = np.maximum.accumulate(g[::-1])[::-1]
    prev = np.concatenate(([1.0], g[:-1]))
    total = float(g[-1]) + float(np.sum((prev - g) * np.asarray(cdf)))
    return min(1.0, total * (1.0 + _FLOAT_MARGIN) + _ABS_MARGIN)
