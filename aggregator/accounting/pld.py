"""Privacy-loss-distribution composition of per-round shuffle pairs.

When every round uses fresh randomness (a basic mechanism, or RAPPOR with f = 0), R
shuffled releases compose by composing the per-round dominating pair's PLD (Koskela,
Jälkö, Honkela 2020; Doroshenko, Ghazi, Kamath, Kumar, Manurangsi 2022, as in Google's
``dp_accounting``): much tighter than composing per-round (ε, δ). Over (a, t) =
(N0, N0 + N1) of ``pairs``, the loss is ln(L_P(a)/L_Q(a)) with
L_P(a) = 2pα·a + 2α·(t−a) + γρ(n−t), L_Q(a) = 2α·a + 2pα·(t−a) + γρ(n−t) (0 at t = 0).
Losses are rounded up to a 1e-5 grid, masses up by their float error bound, and the
mass left out, bounded from C's binomial tails, is infinite loss. n ≤ ``MAX_PLD_N``
(cost grows like n); above it use ``compose_optimal``. Figures: docs/design.md.
"""

from __future__ import annotations

import math
from typing import Any

from crowdmix.aggregator.accounting.pairs import ClonePair, pmf_error

__all__ = [
    "GRID",
    "MAX_PLD_N",
    "exact_sum",
    "pair_loss_counts",
    "pld_epsilon",
    "pld_lower_epsilon",
    "shuffle_pld",
]

# ~2 s at 3e5 (14 s at 1e6): above it callers fall back to optimal composition.
MAX_PLD_N = 300_000
# Standard deviations of Bin(t, ½) kept around t/2 (mass outside: < 1e-15 per t).
_A_WIDTH = 8.5
_CHUNK_POINTS = 4_000_000
_ULP = math.ulp(1.0)
# Loss grid of every PLD built here (one grid, so PLDs of different rounds compose).
GRID = 1e-5


def shuffle_pld(
    pair: ClonePair, n: int, *, tail: float = 1e-12, grid: float = GRID, pessimistic: bool = True
) -> Any:
    """dp_accounting PrivacyLossDistribution of one shuffled round.

    ``pessimistic`` (the default, for upper bounds): losses rounded up, all mass
    left out charged as infinite loss. ``pessimistic=False`` (for lower bounds
    of a concrete mechanism whose exact pair this is): losses rounded down and
    the mass left out dropped, so the composed ε is at most the true one.
    """
    from dp_accounting.pld import privacy_loss_distribution as pld_mod

    counts, kept = pair_loss_counts(pair, n, tail=tail, grid=grid, pessimistic=pessimistic)
    # The bound on the mass left out (C's tails, a's tails) is charged as infinite loss
    # (pessimistic) or dropped (optimistic).
    infinity_mass = min(1.0, max(0.0, 1.0 - kept) + 1e-14) if pessimistic else 0.0
    return pld_mod.PrivacyLossDistribution.create_from_rounded_probability(
        counts, infinity_mass, grid, pessimistic_estimate=pessimistic, symmetric=True
    )


def pair_loss_counts(
    pair: ClonePair, n: int, *, tail: float = 1e-12, grid: float = GRID, pessimistic: bool = True
) -> tuple[dict[int, float], float]:
    """The pair's privacy-loss PMF under P on the loss grid (index → mass), and 1 − a
    bound on the mass left out (what the caller charges as infinite loss).

    Pessimistic: every mass is raised by its float error bound (weights Bin(m, 2r) and
    terms Bin(a; t, ½) from log-gammas: ``pmf_error`` each), so it is at least the true
    one, and the mass left out is bounded without a float sum: under P, t falls outside
    the window only when C does (``EvaluatedPair.tail``) or the victim lands in neither
    bucket with C at the window's low end (γ·Bin(c_lo)); a outside t/2 ± 8.5·√t/2 has
    mass ≤ 2·e^(−36.1) per t (Hoeffding), ≤ 2e-15 in all. Optimistic: masses lowered
    by the same bound and the rest dropped."""
    import numpy as np
    from scipy import special, stats

    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PLD_N:
        raise ValueError(f"n must be an integer in [1, {MAX_PLD_N}] for PLD accounting, got {n!r}")
    ev = pair.evaluate(n, 0.5, tail=tail)  # window leaving out at most ``tail`` of C's mass
    arr = ev._arrays()
    t_all, w1_all, ncoef_all = arr["t"], arr["w1"], arr["ncoef"]
    p, alpha = pair.p, pair.alpha
    # ln C(t, a) from one table of ln Γ(i + 1): the very terms binom.logpmf sums.
    log_fact = special.gammaln(np.arange(int(t_all[-1]) + 1, dtype=np.float64) + 1.0)
    log_half = float(special.xlogy(1.0, 0.5))  # = xlog1py(1, −½): ln ½ per trial
    parts: list[tuple[int, np.ndarray]] = []  # (first loss index, mass per index) per chunk
    kept_parts: list[float] = []
    zero_mass: float | None = None
    # t = 0 (C = 0 and the victim in neither bucket): P = Q there, loss 0.
    if n >= 1 and pair.gamma > 0.0 and t_all[0] == 1.0:
        m, prob = n - 1, min(1.0, 2.0 * pair.r)
        zero_mass = float(stats.binom.pmf(0, m, prob)) * pair.gamma
        kept_parts.append(zero_mass)
    start = 0
    while start < len(t_all):
        # Chunk over t so the (t, a) grid stays within memory.
        width = int(2 * _A_WIDTH * 0.5 * math.sqrt(t_all[start]) + 3)
        stop = min(len(t_all), start + max(1, _CHUNK_POINTS // max(width, 1)))
        t = t_all[start:stop]
        w1, ncoef = w1_all[start:stop], ncoef_all[start:stop]
        half = _A_WIDTH * 0.5 * np.sqrt(t)
        lo = np.maximum(0.0, np.floor(t / 2 - half))
        hi = np.minimum(t, np.ceil(t / 2 + half))
        sizes = (hi - lo + 1).astype(np.int64)
        rows = np.repeat(np.arange(len(t)), sizes)
        offs = np.arange(int(sizes.sum()))
        offs -= np.repeat(np.cumsum(sizes) - sizes, sizes)
        a = lo[rows]
        a += offs
        tt = t[rows]
        # The grid's arrays are tens of MB: each step writes into a few buffers (the
        # same float operations in the same order; fresh arrays cost more in page
        # faults than in arithmetic). lp = 2pα·a + 2α·(t − a) + γρ(n − t), lq swapped.
        rest = np.subtract(tt, a)
        neither = ncoef[rows]
        buf = np.multiply(2 * alpha, rest)
        lp = np.multiply(2 * p * alpha, a)
        lp += buf
        lp += neither
        lq = np.multiply(2 * alpha, a)
        np.multiply(2 * p * alpha, rest, out=buf)
        lq += buf
        lq += neither
        # binom.logpmf(a, tt, ½), term by term (bit for bit the same):
        # ln Γ(t+1) − (ln Γ(a+1) + ln Γ(t−a+1)) + a·ln ½ + (t − a)·ln ½
        ia, it = a.astype(np.int64), tt.astype(np.int64)
        log_pmf = log_fact[it]
        np.take(log_fact, ia, out=buf)
        np.subtract(it, ia, out=it)
        buf += log_fact[it]
        log_pmf -= buf
        np.multiply(a, log_half, out=buf)
        log_pmf += buf
        np.multiply(rest, log_half, out=buf)
        log_pmf += buf
        mass = w1[rows]
        mass *= np.exp(log_pmf, out=log_pmf)
        mass *= lp
        mass /= tt
        rounding = np.ceil if pessimistic else np.floor
        np.divide(lp, lq, out=lq)
        np.log(lq, out=lq)
        lq /= grid
        loss_idx = rounding(lq, out=lq).astype(np.int64)
        base = int(loss_idx.min())
        loss_idx -= base
        parts.append((base, np.bincount(loss_idx, weights=mass)))
        kept_parts.append(exact_sum(mass))
        start = stop
    kept = 0.0
    for k in kept_parts:  # in the order they were found, as the sum was always taken
        kept += k
    counts = _merge_counts(parts, zero_mass)
    m, prob = n - 1, min(1.0, 2.0 * pair.r)
    rel = _ULP * 16.0 + pmf_error(n + 1, 0.5)
    if m > 0:
        rel += pmf_error(m, min(max(prob, 1e-300), 0.5))
    if not pessimistic:
        return {key: v * (1.0 - rel) for key, v in counts.items()}, kept * (1.0 - rel)
    low_end = pair.gamma * float(w1_all[0]) * (1.0 + rel) if t_all[0] > 1.0 else 0.0
    # ``pair.gamma`` reads a γ ≤ 1e-12 as 0 (k-RR at ε0 ≳ 27.6), so the masses then sum
    # to α(1+p) < 1: the victim-in-neither mass they miss is charged too (a residual
    # below 1e-15 is float noise, within the 2e-15, of which Hoeffding needs < 5e-16).
    missed = 1.0 - pair.alpha * (1.0 + pair.p) if pair.gamma == 0.0 else 0.0
    left_out = ev.tail + low_end + (missed + 4.0 * _ULP if missed > 1e-15 else 0.0) + 2e-15
    return {key: v * (1.0 + rel) for key, v in counts.items()}, 1.0 - left_out


def _merge_counts(parts: list[tuple[int, Any]], zero_mass: float | None) -> dict[int, float]:
    """Loss index → mass, summed over the chunks in order; keys in the order they first
    hold mass (the t = 0 point first)."""
    import numpy as np

    if not parts:
        return {} if zero_mass is None else {0: zero_mass}
    low = min([b for b, _ in parts] + ([0] if zero_mass is not None else []))
    high = max([b + len(s) for b, s in parts] + ([1] if zero_mass is not None else []))
    total = np.zeros(high - low)
    seen = np.zeros(high - low, dtype=bool)
    order: list[Any] = []
    if zero_mass is not None:
        total[-low] = zero_mass
        seen[-low] = True
        order.append(np.array([-low]))
    for base, summed in parts:
        at = np.flatnonzero(summed) + (base - low)
        order.append(at[~seen[at]])
        seen[at] = True
        total[base - low : base - low + len(summed)] += summed
    keys = np.concatenate(order)
    return dict(zip((keys + low).tolist(), total[keys].tolist(), strict=True))


def exact_sum(values: Any) -> float:
    """Σ values (finite floats) correctly rounded, as ``math.fsum`` returns it; fast on
    large arrays: each is split exactly into two 27-bit integer halves of its
    mantissa, summed per binary exponent (exact: no partial sum reaches 2^53), and
    the few per-exponent sums are added as Python integers."""
    import numpy as np

    values = np.asarray(values, dtype=np.float64).ravel()
    if len(values) < 1024:
        return math.fsum(values.tolist())
    mant, expo = np.frexp(values)  # values = mant · 2^expo, |mant| in [½, 1) or 0
    whole = np.ldexp(mant, 53, out=mant)  # an integer of at most 53 bits
    high = np.floor_divide(whole, 2.0**27)  # floor also for negative values: low ≥ 0
    low = np.mod(whole, 2.0**27, out=whole)  # = whole − high·2^27, exactly
    emin = int(expo.min())
    e_all = expo.astype(np.intp)
    e_all -= emin
    total = 0
    for offset in range(0, len(values), 1 << 22):  # < 2^22 terms: sums stay below 2^53
        e = e_all[offset : offset + (1 << 22)]
        sum_high = np.bincount(e, weights=high[offset : offset + (1 << 22)])
        sum_low = np.bincount(e, weights=low[offset : offset + (1 << 22)])
        for k in np.flatnonzero((sum_high != 0) | (sum_low != 0)).tolist():
            total += ((int(sum_high[k]) << 27) + int(sum_low[k])) << k
    # total · 2^(emin − 53), rounded once (int / int is correctly rounded)
    shift = emin - 53
    return float(total * 2**shift) if shift >= 0 else total / 2**-shift


def pld_epsilon(pair: ClonePair, n: int, rounds: int, delta: float) -> float:
    """ε after ``rounds`` fresh shuffled rounds of n reports, composed by PLD."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    one = shuffle_pld(pair, n, tail=min(1e-12, delta * 1e-4 / rounds))
    composed = one.self_compose(rounds) if rounds > 1 else one
    return float(composed.get_epsilon_for_delta(delta))


def pld_lower_epsilon(pair: ClonePair, n: int, rounds: int, delta: float) -> float:
    """ε that ``rounds`` fresh rounds of a mechanism whose shuffled output *is* ``pair``
    certainly need (optimistic PLD: losses rounded down, tails dropped).

    A lower bound only for a concrete mechanism and data set realising the pair
    exactly (e.g. k-RR with every other user holding a third value; see
    ``amplification.shuffled_rr_lower_bound``); every valid upper bound must be ≥ it.
    """
    one = shuffle_pld(pair, n, tail=1e-14, pessimistic=False)
    composed = one.self_compose(rounds) if rounds > 1 else one
    return float(composed.get_epsilon_for_delta(delta))
