"""Mechanism-specific shuffle bounds: the privacy blanket, evaluated exactly. Pure math.

If every report satisfies R(x) ≥ γ·W for one distribution W (the blanket), each other
user's report is independently a draw from W w.p. γ, and the victim's hides among those
(Balle, Bell, Gascón, Nissim, CRYPTO 2019, §3; best of all clone-style decompositions:
Su, Cheng, Wang 2025). ``blanket_profile`` returns δ(ε) of n shuffled reports as

    δ(ε) ≤ Σ_m Bin(m; n−1, γ)·δ_m(ε),
    δ_m(ε) = E_{Y_0..Y_m ~ W}[((1/(m+1))·Σ_j (g0 − e^ε·g1)(Y_j))_+],  g_b = dR(x_b)/dW,

for k-ary RR, OLH and bit-vector mechanisms (OUE, one RAPPOR report, the PRR); the
argument is in ``mixture``'s docstring and each ``*_given`` function's. Every figure is
rounded up: left-out mass is charged, bins use their smallest m, ``FLOAT_SLACK`` covers
float rounding.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from crowdmix.aggregator.accounting.pairs import (
    FLOAT_SLACK,
    binom_logpmf,
    binom_window,
    pmf_error,
)

__all__ = [
    "FLOAT_SLACK",
    "MAX_BINS",
    "BitLaw",
    "Profile",
    "bins",
    "bit_vector_given",
    "exceeds",
    "krr_given",
    "mixture",
    "positive_part_mean",
]

# Share of δ that the windows over binomials may leave out (charged to δ).
TAIL_FRACTION = 1e-6
# Bins of the mixture over m: each uses δ at its smallest m (δ_m falls with m).
MAX_BINS = 32
# Up to this many values of m in the window, every m is its own bin (exact).
_EXACT_BINS = 160
# Absolute slack for masses computed as 1 − (a sum close to 1).
_SUM_SLACK = 1e-13
# Sum-of-draws laws kept on at most this many points (X rounded up, Y down).
_GRID = 8192
# Largest support enumerated for one law of a sum over two-bit patterns.
_MAX_POINTS = 600_000
# Standard deviations kept around a binomial's mean before the exact tail check.
_SD = 9.0


class Profile(Protocol):
    """δ(ε) of one pair of neighbouring data sets, an upper bound for every ε ≥ 0."""

    @property
    def tail(self) -> float: ...

    def delta(self, epsilon: float) -> float: ...


@dataclass(frozen=True, slots=True)
class _Mixed:
    """Σ_i w_i·δ_{m_i}(ε) + ``below`` (the mass of m under the first bin); each
    δ_{m_i} = ``given(edges[i])`` is built when first read."""

    weights: tuple[float, ...]
    edges: tuple[int, ...]
    given: Callable[[int], Profile]
    below: float
    scale: float
    built: dict[int, Profile] = field(default_factory=dict, compare=False, repr=False)

    def part(self, i: int) -> Profile:
        if i not in self.built:
            self.built[i] = self.given(self.edges[i])
        return self.built[i]

    @property
    def tail(self) -> float:
        tails = (w * self.part(i).tail for i, w in enumerate(self.weights))
        return self.scale * (self.below + sum(tails))

    def surrogate(self) -> Profile:
        """One bin near the median of m: cheap, with a root close to this profile's."""
        acc, median = 0.0, len(self.weights) - 1
        for i, w in enumerate(self.weights):
            acc += w
            if acc >= 0.5:
                median = i
                break
        return _Mixed(
            weights=(1.0,),
            edges=(self.edges[median],),
            given=lambda _m: self.part(median),
            below=0.0,
            scale=self.scale,
        )

    def delta(self, epsilon: float) -> float:
        total = math.fsum(w * self.part(i).delta(epsilon) for i, w in enumerate(self.weights))
        return min(1.0, self.scale * (self.below + total) * (1.0 + FLOAT_SLACK))

    def exceeds(self, epsilon: float, level: float) -> bool:
        """Whether delta(ε) > level, building the heaviest bins first and stopping
        once their part of the sum (every term is ≥ 0) is above level."""
        acc = 0.0
        for i in sorted(range(len(self.weights)), key=lambda j: -self.weights[j]):
            acc += self.weights[i] * self.part(i).delta(epsilon)
            if self.scale * (self.below + acc) > level:
                return True
        return self.delta(epsilon) > level


def mixture(
    others: int,
    gamma: float,
    given: Callable[[int], Profile],
    delta: float,
    *,
    scale: float = 1.0,
    max_bins: int | None = None,
    max_m: int | None = None,
) -> Profile:
    """δ(ε) ≤ scale·Σ_m Bin(m; others, γ)·δ_m(ε), with δ_m = ``given(m)``.

    Why it holds (the blanket argument). Each other user i draws Z_i ~ Bern(γ)
    and reports a draw from W if Z_i = 1, else from (R(x_i) − γW)/(1 − γ): the
    same law R(x_i). Reveal Z and the Z_i = 0 reports with their owners: the
    shuffled output is a post-processing of that and of the multiset H of the
    victim's report and the m = ΣZ blanket draws, and none of the revealed part
    depends on the victim's value, so δ ≤ E_m[δ(H)]. As a uniformly shuffled
    sequence, H has density (1/(m+1))·Σ_j g_b(Y_j) w.r.t. W^{m+1}, which gives
    δ_m above. δ_m does not grow with m: H_{m+1} is H_m plus one independent W
    draw, a post-processing. So each bin [m_i, m_{i+1}) may use δ_{m_i}; m above
    ``max_m`` uses δ_{max_m}; the mass of m under the first bin is charged whole.
    """
    if others == 0 or gamma >= 1.0:
        m = others if max_m is None else min(others, max_m)
        return _Mixed(weights=(1.0,), edges=(m,), given=given, below=0.0, scale=scale)
    if gamma <= 0.0:
        return _Mixed(weights=(1.0,), edges=(0,), given=given, below=0.0, scale=scale)
    edges, weights, below = bins(
        others, gamma, delta, MAX_BINS if max_bins is None else max_bins, max_m
    )
    return _Mixed(weights=tuple(weights), edges=tuple(edges), given=given, below=below, scale=scale)


def bins(
    others: int, gamma: float, delta: float, max_bins: int, max_m: int | None = None
) -> tuple[list[int], list[float], float]:
    """The bins of ``mixture``: their smallest m, P(m in the bin) (the last bin runs
    to ``others``), and P(m below the first bin)."""
    from scipy import stats

    if isinstance(max_bins, bool) or not isinstance(max_bins, int) or max_bins < 1:
        raise ValueError(f"max_bins must be a positive integer, got {max_bins!r}")
    lo, hi = binom_window(others, gamma, TAIL_FRACTION * delta)
    below = float(stats.binom.cdf(lo - 1, others, gamma)) if lo > 0 else 0.0
    if max_m is not None:
        lo, hi = min(lo, max_m), min(hi, max_m)
    if hi - lo + 1 <= max(max_bins, _EXACT_BINS):
        edges = list(range(lo, hi + 1))  # every m: exact, and cheap at small crowds
    else:
        # δ_m falls with m, so the bins above the mean + 3 sd carry little: one bin.
        mean, sd = others * gamma, math.sqrt(others * gamma * (1.0 - gamma))
        top = min(hi, int(mean + 3.0 * sd))
        edges = sorted({round(x) for x in _sinh_space(lo, max(lo, top), max_bins, mean, sd)})
    below_edge = stats.binom.cdf([e - 1 for e in edges], others, gamma).tolist()  # one call
    cdf = [float(c) if e > 0 else 0.0 for e, c in zip(edges, below_edge, strict=True)]
    weights = [max(0.0, b - a) for a, b in itertools.pairwise(cdf)]
    weights.append(float(stats.binom.sf(edges[-1] - 1, others, gamma)) if edges[-1] > 0 else 1.0)
    return edges, weights, below


def _sinh_space(lo: float, hi: float, k: int, centre: float, scale: float) -> list[float]:
    """k points from lo to hi, even in asinh((x − centre)/scale): dense within a
    ``scale`` of ``centre`` where the mass of m is (a bin's loss grows with its
    mass times its width), sparse in the tails. Any edges are sound."""
    if k == 1:
        return [lo]
    a, b = math.asinh((lo - centre) / scale), math.asinh((hi - centre) / scale)
    out = [centre + scale * math.sinh(a + (b - a) * i / (k - 1)) for i in range(k)]
    out[0], out[-1] = lo, hi
    return out


def krr_given(epsilon0: float, domain: int, m: int, delta: float) -> Profile:
    """δ_m for k-ary RR over ``domain`` values (blanket: uniform, γ = d/(e^ε0+d−1)).

    g0 = d·R(x0)/1: d·e^ε0/s on x0, d/s elsewhere (s = e^ε0+d−1), so the likelihood
    ratio of H depends only on (N0, N1), the draws equal to x0 and x1: with the
    victim drawn from R(x0) and m uniform draws this is ``pairs.ClonePair`` with
    p = e^ε0, α = 1/s (the victim lands on neither value w.p. (d−2)/s) and
    r = 1/d, at n = m+1, evaluated exactly there (``EvaluatedPair``).
    """
    from crowdmix.aggregator.accounting.pairs import ClonePair

    e = math.exp(epsilon0)
    s = e + domain - 1.0
    pair = ClonePair(p=e, alpha=1.0 / s, r=1.0 / domain)
    return pair.evaluate(m + 1, delta)


@dataclass(frozen=True, slots=True)
class BitLaw:
    """The law of X = Σ_j Π_{i∈B} r(y_ji) over m+1 draws of i.i.d. Bern(p) bits
    (|B| = ``bits``), on sorted points with suffix sums; ``tilted_missing`` is the
    mass the victim-tilted law (density X/(m+1)) puts outside them, ``missing``
    the W-mass outside them; ``rel_error`` bounds the relative float error of
    each point's probability."""

    values: Any  # np.ndarray, ascending
    probs: Any
    s0: Any  # s0[i] = Σ_{k≥i} probs[k]; one extra 0 at the end
    s1: Any  # s1[i] = Σ_{k≥i} probs[k]·values[k]
    missing: float
    tilted_missing: float
    rel_error: float = 0.0


def _sort_points(values: Any, probs: Any) -> tuple[Any, Any]:
    import numpy as np

    order = np.argsort(values, kind="stable")
    return values[order], probs[order]


@dataclass(frozen=True, slots=True)
class _Points:
    """A sum law's points before the grid, sorted by value (``bit_sum_points``)."""

    values: Any
    probs: Any
    missing: float
    # The tilted mass outside the points in closed form, or None: then 1 − the
    # tilted mass kept (whose float deficit is charged too).
    tilted_missing: float | None
    rel_error: float


def _finish_sorted(points: _Points, draws: int, up: bool) -> BitLaw:
    """A ``BitLaw`` of points sorted by value: merged onto at most _GRID cells (each
    cell's points become its largest value if ``up`` else its smallest: both only
    raise E[(X − cY)_+]), with suffix sums."""
    import numpy as np

    values, probs = points.values, points.probs
    if points.tilted_missing is None:
        tilted_kept = float(np.sum(probs * values)) / draws
        tilted_missing = max(0.0, 1.0 - tilted_kept) + _SUM_SLACK
    else:
        tilted_missing = points.tilted_missing
    if len(values) > _GRID:
        lo, hi = float(values[0]), float(values[-1])
        cell = np.floor((values - lo) / ((hi - lo) / _GRID)).astype(np.int64)
        starts = np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
        ends = np.concatenate((starts[1:], [len(values)]))
        probs = np.add.reduceat(probs, starts)
        values = values[ends - 1] if up else values[starts]
    s0 = np.concatenate((np.cumsum(probs[::-1])[::-1], [0.0]))
    s1 = np.concatenate((np.cumsum((probs * values)[::-1])[::-1], [0.0]))
    return BitLaw(
        values=values,
        probs=probs,
        s0=s0,
        s1=s1,
        missing=max(0.0, points.missing) + _SUM_SLACK,
        tilted_missing=tilted_missing,
        rel_error=points.rel_error,
    )


def bit_sum_law(bits: int, p: float, q: float, draws: int, delta: float, *, up: bool) -> BitLaw:
    """``BitLaw`` of X = Σ_{j<draws} Π_{i∈B} r(y_ji), r(1) = q/p, r(0) = (1−q)/(1−p),
    |B| = ``bits`` ∈ {1, 2}, the bits i.i.d. Bern(p) (the blanket W)."""
    return _finish_sorted(bit_sum_points(bits, p, q, draws, delta), draws, up)


def bit_sum_points(bits: int, p: float, q: float, draws: int, delta: float) -> _Points:
    """The points of ``bit_sum_law`` before its grid, sorted by value, and the mass
    left out (one enumeration serves both roundings).

    One bit: X = r0·draws + (r1 − r0)·K, K ~ Bin(draws, p), kept on a window of K.
    The tilted mass outside it, E[X·1{K ∉ window}]/draws, is in closed form by
    k·Bin(k; n, p) = n·p·Bin(k − 1; n − 1, p): binomial tails, not 1 − a sum (whose
    float deficit, ~1e-9 at 10⁶ draws, would be charged to δ)."""
    import numpy as np
    from scipy import stats

    r1, r0 = q / p, (1.0 - q) / (1.0 - p)
    tau = TAIL_FRACTION * delta
    if bits == 1:
        lo, hi = binom_window(draws, p, tau)
        k = np.arange(lo, hi + 1, dtype=np.float64)
        probs = np.exp(binom_logpmf(k, draws, p))
        values = r0 * draws + (r1 - r0) * k
        # One call each for the two tails of K and of K' (element by element the
        # same values as one call per tail: a call's fixed cost was most of this).
        below = stats.binom.cdf([lo - 1, lo - 2], [draws, draws - 1], p)
        above = stats.binom.sf([hi, hi - 1], [draws, draws - 1], p)
        missing = (float(below[0]) if lo > 0 else 0.0) + (float(above[0]) if hi < draws else 0.0)
        # E[K·1{K ≤ lo − 1}] = n·p·P(K' ≤ lo − 2), E[K·1{K ≥ hi + 1}] = n·p·P(K' ≥ hi),
        # K' ~ Bin(n − 1, p); cdf and sf are accurate to a few ulps (slack 1e-6).
        k_low = float(below[1]) if lo >= 2 else 0.0
        k_high = float(above[1]) if hi < draws else 0.0
        out_k = draws * p * (k_low + k_high)
        tilted = (r0 * draws * missing + (r1 - r0) * out_k) / draws
        sorted_values, sorted_probs = _sort_points(values, probs)
        return _Points(
            values=sorted_values,
            probs=sorted_probs,
            missing=missing,
            tilted_missing=max(0.0, tilted) * (1.0 + 1e-6) + 1e-300,
            rel_error=pmf_error(draws, p),
        )
    if bits != 2:
        raise ValueError(f"bits must be 1 or 2, got {bits!r}")
    # Counts (N1, N2) of draws with one and with two ones: N2 ~ Bin(draws, p²) and,
    # given N2, N1 ~ Bin(draws − N2, 2p(1−p)/(1−p²)); one rectangle of (N2, N1).
    p2, p1 = p * p, 2.0 * p * (1.0 - p)
    cond = p1 / (1.0 - p2)
    lo2, hi2 = binom_window(draws, p2, tau / 2.0)
    lo1, _ = binom_window(draws - hi2, cond, tau / 2.0)
    _, hi1 = binom_window(draws - lo2, cond, tau / 2.0)
    n2 = np.arange(lo2, hi2 + 1, dtype=np.float64)
    n1 = np.arange(lo1, hi1 + 1, dtype=np.float64)
    if len(n2) * len(n1) > _MAX_POINTS:
        raise ValueError(f"two-bit law over {draws} draws needs {len(n2) * len(n1)} points")
    rest = draws - n2
    w2 = np.exp(binom_logpmf(n2, draws, p2))
    missing = (float(stats.binom.cdf(lo2 - 1, draws, p2)) if lo2 > 0 else 0.0) + (
        float(stats.binom.sf(hi2, draws, p2)) if hi2 < draws else 0.0
    )
    out1 = (stats.binom.cdf(lo1 - 1, rest, cond) if lo1 > 0 else 0.0) + stats.binom.sf(
        hi1, rest, cond
    )
    missing += float(np.sum(w2 * out1))
    grid2, grid1 = np.meshgrid(n2, n1, indexing="ij")
    probs = (w2[:, None] * np.exp(_grid_logpmf(n1, rest, cond, draws))).ravel()
    n2a, n1a = grid2.ravel(), grid1.ravel()
    n0a = draws - n1a - n2a
    ok = (n0a >= 0.0) & (probs > 0.0)
    probs, n0a, n1a, n2a = probs[ok], n0a[ok], n1a[ok], n2a[ok]
    values = r0 * r0 * n0a + r0 * r1 * n1a + r1 * r1 * n2a
    sorted_values, sorted_probs = _sort_points(values, probs)
    rel = pmf_error(draws, p2) + pmf_error(draws, cond)
    return _Points(sorted_values, sorted_probs, missing, None, rel)


def _grid_logpmf(k: Any, n: Any, p: float, top: int) -> Any:
    """``binom_logpmf(k[None, :], n[:, None], p)`` (−inf where k > n) for integer-valued
    0 ≤ k, n ≤ ``top``: each term read from a table of it over 0..top when that is
    smaller than the grid (the same terms at the same arguments: bit for bit)."""
    import numpy as np
    from scipy import special

    if top + 1 >= len(k) * len(n):
        with np.errstate(invalid="ignore"):
            return binom_logpmf(k[None, :], n[:, None], p)
    i = np.arange(top + 1, dtype=np.float64)
    log_fact, log_p, log_q = special.gammaln(i + 1), special.xlogy(i, p), special.xlog1py(i, -p)
    ki, ni = k.astype(np.int64), n.astype(np.int64)
    rest = ni[:, None] - ki[None, :]
    inside = rest >= 0
    rest = np.where(inside, rest, 0)
    comb = log_fact[ni][:, None] - (log_fact[ki][None, :] + log_fact[rest])
    out = comb + log_p[ki][None, :] + log_q[rest]
    out[~inside] = -np.inf
    return out


def two_bit_points(draws: int, p: float, delta: float) -> int:
    """How many points ``bit_sum_law(2, ...)`` would enumerate (its cost)."""
    p2 = p * p
    sd2 = math.sqrt(max(draws * p2 * (1.0 - p2), 1.0))
    sd1 = math.sqrt(max(draws * 2.0 * p * (1.0 - p), 1.0))
    return int((2.0 * _SD * sd2 + 3.0) * (2.0 * _SD * sd1 + 3.0))


def positive_part_mean(x: BitLaw, y_values: Any, y_probs: Any, c: float) -> float:
    """Σ_y P(y)·E[(X − c·y)_+] over Y's points (X's suffix sums, one search per y)."""
    import numpy as np

    thresholds = c * y_values
    idx = np.searchsorted(x.values, thresholds, side="right")
    terms = y_probs * (x.s1[idx] - thresholds * x.s0[idx])
    return float(np.sum(np.maximum(terms, 0.0)))


@dataclass(frozen=True, slots=True)
class _BitGiven:
    """δ_m(ε) = E_W[(X − e^ε·Y)_+]/(m+1) for independent X (|B0| bits), Y (|B1| bits)."""

    x: BitLaw
    y: BitLaw
    draws: int

    @property
    def tail(self) -> float:
        return self.x.tilted_missing + self.y.missing

    def delta(self, epsilon: float) -> float:
        kept = positive_part_mean(self.x, self.y.values, self.y.probs, math.exp(epsilon))
        kept *= 1.0 + self.x.rel_error + self.y.rel_error  # the points' float error
        return min(1.0, kept / self.draws + self.tail)


def bit_vector_given(
    p: float, q: float, sizes: tuple[int, int], m: int, delta: float, cache: dict[Any, Any]
) -> Profile:
    """δ_m for a bit-vector mechanism: value x sets a set B_x of at most h bits,
    every bit is Bern(q) if in B_x and Bern(p) otherwise (p < q), independently.

    Blanket: W = Bern(p)^k, γ = r(0)^h with r(1) = q/p, r(0) = (1−q)/(1−p) < 1
    (R(x)/W = Π_{i∈B_x} r(y_i) ≥ r(0)^h). g_b(y) = Π_{i∈B_b} r(y_i), so with
    X = Σ_j g0(Y_j), Y = Σ_j g1(Y_j) over the m+1 draws, δ_m = E[(X − e^ε Y)_+]/(m+1).

    Shared bits cost nothing: let B0 and B1 share bit i. Given all other bits,
    X and Y are independent and, coupling draws, rise with G = the draws whose
    bit i is 1: X_{G+1} = X_G + D, Y_{G+1} = Y_G + D′ with D, D′ ≥ 0. For convex
    ψ = (·)_+, ψ(t + D − cD′) − ψ(t + D) − ψ(t − cD′) + ψ(t) ≤ 0, so f(G, G′) =
    E[ψ(X_G − cY_{G′})] is submodular and E f(G, G) ≤ E f(G, G′) for an
    independent copy G′ (½E[f(G,G′) + f(G′,G) − f(G,G) − f(G′,G′)] ≥ 0). The
    right side is the same case with bit i replaced by a fresh bit on each side.
    By induction every pair (B0, B1) is bounded by disjoint sets of the same
    sizes, where X and Y are independent: ``sizes`` = (|B0|, |B1|). X is kept on a
    grid rounded up and Y rounded down, which only raises δ_m.
    """
    draws = m + 1

    def law(bits: int, up: bool) -> BitLaw:
        key = (bits, draws, up)
        if key not in cache:
            raw = (bits, draws)  # one enumeration for both roundings
            if raw not in cache:
                cache[raw] = bit_sum_points(bits, p, q, draws, delta)
            cache[key] = _finish_sorted(cache[raw], draws, up)
            if (bits, draws, not up) in cache:
                del cache[raw]
        found: BitLaw = cache[key]
        return found

    return _BitGiven(x=law(sizes[0], True), y=law(sizes[1], False), draws=draws)


@dataclass(frozen=True, slots=True)
class Worst:
    """The largest of several profiles (every case of a victim's pair of values)."""

    parts: Sequence[Profile]

    @property
    def tail(self) -> float:
        return max(p.tail for p in self.parts)

    def surrogate(self) -> Profile:
        return Worst([getattr(p, "surrogate", lambda p=p: p)() for p in self.parts])

    def delta(self, epsilon: float) -> float:
        return max(p.delta(epsilon) for p in self.parts)

    def exceeds(self, epsilon: float, level: float) -> bool:
        """Whether delta(ε) > level (each part's ``exceeds`` where it has one)."""
        return any(exceeds(p, epsilon, level) for p in self.parts)


def exceeds(profile: Profile, epsilon: float, level: float) -> bool:
    """Whether profile.delta(ε) > level, building as little of it as it can."""
    quick = getattr(profile, "exceeds", None)
    return bool(quick(epsilon, level)) if quick is not None else profile.delta(epsilon) > level
