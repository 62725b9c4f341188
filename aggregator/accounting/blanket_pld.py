"""Privacy-loss distributions of the blanket bounds, for composing fresh rounds.

``blanket.mixture`` reveals m, the other users' blanket draws, and bins it
(``blanket.bins``): the pair is Σ_i w_i·(P_{m_i}, Q_{m_i}) with the bin revealed,
plus, with the mass of m under the first bin, a pair of disjoint points
(infinite loss). It dominates the round: every m in bin i is a post-processing
of m_i (more blanket draws), every m below the bins one of the disjoint points,
and revealing which case holds is allowed. Given m the pair
is exact: k-ary RR's (N0, N1) (``pairs.ClonePair``, via ``pld.pair_loss_counts``),
OLH's κ-mixture (``randomizers.LocalHashing.profile``) and a one-bit vector's
product (column counts N0 ~ A, N1 ~ B under P, swapped under Q). Losses are
rounded up to the grid, masses up by their float error, and a bound on the mass left
out (from binomial tails, not 1 − a float sum) is charged as infinite loss.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from crowdmix.aggregator.accounting.blanket import TAIL_FRACTION, bins
from crowdmix.aggregator.accounting.pairs import ClonePair, binom_logpmf, binom_window, pmf_error
from crowdmix.aggregator.accounting.pld import GRID, MAX_PLD_N, pair_loss_counts
from crowdmix.aggregator.accounting.randomizers import BitVector, KaryRR, LocalHashing, Randomizer

__all__ = ["blanket_pld"]

# Bins of m (each a whole pair's PMF): many where crowds are small and cheap.
_SMALL = 20_000
_PLD_BINS_SMALL = 16
_PLD_BINS_LARGE = 4


def _binned_counts(
    others: int, gamma: float, tail: float, given: Callable[[int], tuple[dict[int, float], float]]
) -> tuple[dict[int, float], float, float]:
    """Σ_i w_i·(loss PMF given m_i) over ``blanket.bins``, the mass they hold, and
    the mass of m under the first bin (charged as infinite loss)."""
    if others == 0 or gamma >= 1.0:
        counts, kept = given(others)
        return counts, kept, 0.0
    max_bins = _PLD_BINS_SMALL if others <= _SMALL else _PLD_BINS_LARGE
    edges, weights, below = bins(others, gamma, tail / TAIL_FRACTION, max_bins)
    total: dict[int, float] = {}
    kept = 0.0
    for m, w in zip(edges, weights, strict=True):
        counts, k = given(m)
        for key, v in counts.items():
            total[key] = total.get(key, 0.0) + w * v
        kept += w * k
    return total, kept, below


def _bit_counts(p: float, q: float, m: int, tail: float) -> tuple[dict[int, float], float]:
    """Loss PMF (under P) of the one-bit product pair given m blanket draws, and 1 − a
    bound on the mass left out:
    loss(x, y) = ℓ(x) − ℓ(y), ℓ = ln(A/B), x ~ A = Bern(q) + Bin(m, p), y ~ B =
    Bern(p) + Bin(m, p); ⌈ℓ(x)/g⌉ + ⌈−ℓ(y)/g⌉ ≥ ⌈loss/g⌉ (rounded up)."""
    import numpy as np
    from scipy import stats

    lo, hi = binom_window(m, p, tail / 4.0)
    k = np.arange(max(0, lo), min(m, hi) + 2, dtype=np.float64)  # counts incl. the victim
    b_k = np.exp(binom_logpmf(k, m, p))
    b_km1 = np.exp(binom_logpmf(k - 1.0, m, p))
    a = q * b_km1 + (1.0 - q) * b_k
    b = p * b_km1 + (1.0 - p) * b_k
    ok = (a > 0.0) & (b > 0.0)
    a, b = a[ok], b[ok]
    ell = np.log(a) - np.log(b)
    ix = np.ceil(ell / GRID).astype(np.int64)
    iy = np.ceil(-ell / GRID).astype(np.int64)
    counts: dict[int, float] = {}
    for start in range(0, len(ix), 512):
        block = ix[start : start + 512]
        wa = a[start : start + 512]
        idx = (block[:, None] + iy[None, :]).ravel()
        mass = (wa[:, None] * b[None, :]).ravel()
        base = int(idx.min())
        summed = np.bincount(idx - base, weights=mass)
        for i in np.nonzero(summed)[0]:
            key = int(i) + base
            counts[key] = counts.get(key, 0.0) + float(summed[i])
    # Masses raised by their float error bound (two pmfs from log-gammas); the mass
    # left out bounded by the tails of Bin(m, p) outside the window, once for A and
    # once for B (A's and B's points outside it are Bin's points outside it).
    rel = 2.0 * pmf_error(max(m, 1), min(max(p, 1e-300), 0.5)) + 8.0 * math.ulp(1.0)
    wlo, whi = max(0, lo), min(m, hi)
    outside = float(stats.binom.cdf(wlo - 1, m, p)) if wlo > 0 else 0.0
    outside += float(stats.binom.sf(whi, m, p)) if whi < m else 0.0
    left_out = 2.0 * outside * (1.0 + rel) + 1e-15
    return {key: v * (1.0 + rel) for key, v in counts.items()}, 1.0 - left_out


def blanket_pld(randomizer: Randomizer, n: int, *, tail: float = 1e-12) -> Any | None:
    """dp_accounting PLD of one shuffled round of n reports of ``randomizer`` (module
    docstring), or None where no blanket pair is implemented or n > MAX_PLD_N."""
    from dp_accounting.pld import privacy_loss_distribution as pld_mod

    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PLD_N:
        return None
    scale, zero = 1.0, 0.0
    if isinstance(randomizer, KaryRR | LocalHashing):
        d = randomizer.domain if isinstance(randomizer, KaryRR) else randomizer.buckets
        gamma = randomizer.blanket_mass
        if isinstance(randomizer, LocalHashing):
            from crowdmix.aggregator.accounting.randomizers import olh_collision

            kappa = olh_collision(randomizer.buckets, randomizer.prime)
            scale, zero, gamma = 1.0 - kappa, kappa, gamma * (1.0 - kappa)
        e = math.exp(randomizer.epsilon0)
        pair = ClonePair(p=e, alpha=1.0 / (e + d - 1.0), r=1.0 / d)
        counts, kept, below = _binned_counts(
            n - 1, gamma, tail, lambda m: pair_loss_counts(pair, m + 1, tail=tail)
        )
    elif isinstance(randomizer, BitVector) and randomizer.bits == 1:
        rand = randomizer
        counts, kept, below = _binned_counts(
            n - 1, rand.blanket_mass, tail, lambda m: _bit_counts(rand.p, rand.q, m, tail)
        )
    else:
        return None
    scaled = {key: scale * v for key, v in counts.items()}
    if zero > 0.0:
        scaled[0] = scaled.get(0, 0.0) + zero
    infinity = scale * (below + max(0.0, 1.0 - below - kept)) + 1e-14
    return pld_mod.PrivacyLossDistribution.create_from_rounded_probability(
        scaled, min(1.0, infinity), GRID, pessimistic_estimate=True, symmetric=True
    )
