"""Privacy-loss distributions of the blanket bounds, for composing fresh rounds.

``blanket.mixture`` reveals m, the other users' blanket draws; for a PLD one
pair is needed, so m is cut at m_τ, the lower τ-quantile of its binomial: the
pair is (1 − τ′)·(P_{m_τ}, Q_{m_τ}) plus, with the mass τ′ = P(m < m_τ), a pair
of disjoint points (infinite loss). It dominates the round: every m ≥ m_τ is
a post-processing of m_τ (one more blanket draw), every m < m_τ one of the
disjoint points, and revealing which case holds is allowed. Given m the pair
is exact: k-ary RR's (N0, N1) (``pairs.ClonePair``, via ``pld.pair_loss_counts``),
OLH's κ-mixture (``randomizers.LocalHashing.profile``) and a one-bit vector's
product (column counts N0 ~ A, N1 ~ B under P, swapped under Q). Losses are
rounded up to the grid and mass left out is charged as infinite loss.
"""

from __future__ import annotations

import math
from typing import Any

from crowdmix.aggregator.accounting.pairs import ClonePair, binom_window
from crowdmix.aggregator.accounting.pld import GRID, MAX_PLD_N, pair_loss_counts
from crowdmix.aggregator.accounting.randomizers import BitVector, KaryRR, LocalHashing, Randomizer

__all__ = ["blanket_pld"]


def _cut(others: int, gamma: float, tail: float) -> tuple[int, float]:
    """m_τ and τ′ = P(Bin(others, γ) < m_τ)."""
    from scipy import stats

    if others == 0 or gamma >= 1.0:
        return others, 0.0
    lo, _ = binom_window(others, gamma, tail)
    return lo, (float(stats.binom.cdf(lo - 1, others, gamma)) if lo > 0 else 0.0)


def _bit_counts(p: float, q: float, m: int, tail: float) -> tuple[dict[int, float], float]:
    """Loss PMF (under P) of the one-bit product pair given m blanket draws:
    loss(x, y) = ℓ(x) − ℓ(y), ℓ = ln(A/B), x ~ A = Bern(q) + Bin(m, p), y ~ B =
    Bern(p) + Bin(m, p); ⌈ℓ(x)/g⌉ + ⌈−ℓ(y)/g⌉ ≥ ⌈loss/g⌉ (rounded up)."""
    import numpy as np
    from scipy import stats

    lo, hi = binom_window(m, p, tail / 4.0)
    k = np.arange(max(0, lo), min(m, hi) + 2, dtype=np.float64)  # counts incl. the victim
    b_k = np.exp(stats.binom.logpmf(k, m, p))
    b_km1 = np.exp(stats.binom.logpmf(k - 1.0, m, p))
    a = q * b_km1 + (1.0 - q) * b_k
    b = p * b_km1 + (1.0 - p) * b_k
    ok = (a > 0.0) & (b > 0.0)
    a, b = a[ok], b[ok]
    ell = np.log(a) - np.log(b)
    ix = np.ceil(ell / GRID).astype(np.int64)
    iy = np.ceil(-ell / GRID).astype(np.int64)
    counts: dict[int, float] = {}
    kept = 0.0
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
        kept += math.fsum(mass)
    return counts, kept


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
        m, below = _cut(n - 1, gamma, tail)
        e = math.exp(randomizer.epsilon0)
        pair = ClonePair(p=e, alpha=1.0 / (e + d - 1.0), r=1.0 / d)
        counts, kept = pair_loss_counts(pair, m + 1, tail=tail)
    elif isinstance(randomizer, BitVector) and randomizer.bits == 1:
        m, below = _cut(n - 1, randomizer.blanket_mass, tail)
        counts, kept = _bit_counts(randomizer.p, randomizer.q, m, tail)
    else:
        return None
    weight = scale * (1.0 - below)
    scaled = {key: weight * v for key, v in counts.items()}
    if zero > 0.0:
        scaled[0] = scaled.get(0, 0.0) + zero
    infinity = scale * below + weight * max(0.0, 1.0 - kept) + 1e-14
    return pld_mod.PrivacyLossDistribution.create_from_rounded_probability(
        scaled, min(1.0, infinity), GRID, pessimistic_estimate=True, symmetric=True
    )
