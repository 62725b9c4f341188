"""The one-bit labelled lower bound against the real shuffled OUE, exhaustively.

"Victim 0 vs 1, every other user 2": the real mechanism's shuffled output (every
d-bit report, d = 3 and 4) is enumerated exactly; the reduction to 3-bit patterns
(δ = E[(X − cY)_+]/n over n i.i.d. reports) must equal it, and the bound's δ must
never exceed it (a lower bound), while staying close to it. Deterministic: no
false failures.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from crowdmix.aggregator.accounting.amplification import best_amplification
from crowdmix.aggregator.accounting.lower_bounds import bit_vector_lower
from crowdmix.aggregator.accounting.lower_labelled import _Walks, labelled_one_bit
from crowdmix.aggregator.accounting.randomizers import BitVector
from tests.accounting.test_blanket_exact import hockey_stick, unary, victim_laws

GRID = (0.0, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0, 1.5)
# Float rounding of the enumeration (sums of ~1e4 products).
ROUNDING = 1e-12


def shuffled_delta(d: int, p: float, n: int, eps: list[float]) -> np.ndarray:
    """Exact δ(ε) of the real shuffled OUE (d bits, true bit ½, others p) for the
    data set: victim 0 vs 1, the n − 1 others 2."""
    rows = {x: np.asarray(unary(d, 0.5, p)(x), dtype=np.float64) for x in range(3)}
    laws = victim_laws(rows, [2] * (n - 1), (0, 1))
    return hockey_stick(laws[0], laws[1], eps)


def pattern_delta(p: float, q: float, n: int, eps: list[float]) -> np.ndarray:
    """E[(X − cY)_+]/n over n i.i.d. (b_u, b_v, label) patterns (the reduction)."""
    r = {1: q / p, 0: (1 - q) / (1 - p)}
    s = {1: p / q, 0: (1 - p) / (1 - q)}
    pats = list(itertools.product((0, 1), repeat=3))  # (b_u, b_v, label)
    prob = [(p if u else 1 - p) * (p if v else 1 - p) * (q if w else 1 - q) for u, v, w in pats]
    x = [s[w] * r[u] for u, v, w in pats]
    y = [s[w] * r[v] for u, v, w in pats]
    out = np.zeros(len(eps))
    for counts in itertools.product(range(n + 1), repeat=len(pats) - 1):
        if sum(counts) > n:
            continue
        full = (*counts, n - sum(counts))
        mult = math.factorial(n) * math.prod(
            pr**k / math.factorial(k) for pr, k in zip(prob, full, strict=True)
        )
        sx = sum(k * v for k, v in zip(full, x, strict=True))
        sy = sum(k * v for k, v in zip(full, y, strict=True))
        out += mult * np.maximum(sx - np.exp(np.asarray(eps)) * sy, 0.0) / n
    return out


@pytest.mark.parametrize(("d", "eps0", "n"), [(3, 1.0, 4), (3, 2.0, 5), (4, 0.5, 4), (3, 1.0, 6)])
def test_the_pattern_reduction_is_the_real_shuffled_mechanism(d: int, eps0: float, n: int) -> None:
    p = 1 / (math.exp(eps0) + 1)
    real = shuffled_delta(d, p, n, list(GRID))
    assert np.allclose(pattern_delta(p, 0.5, n, list(GRID)), real, rtol=1e-9, atol=ROUNDING)


@pytest.mark.parametrize(("d", "eps0", "n"), [(3, 1.0, 4), (3, 2.0, 5), (4, 0.5, 4), (3, 1.0, 6)])
def test_the_bound_never_exceeds_the_real_shuffled_mechanism(d: int, eps0: float, n: int) -> None:
    p = 1 / (math.exp(eps0) + 1)
    real = shuffled_delta(d, p, n, list(GRID))
    lower = _Walks(p, 0.5, n).jensen_sum(list(GRID)) / n
    assert np.all(lower <= real + ROUNDING), (lower, real)
    assert lower[0] > 0.5 * real[0]  # and it is not vacuous
    for delta in (1e-3, 0.05):
        eps = labelled_one_bit(p, 0.5, n, delta, 0.0, eps0)
        assert shuffled_delta(d, p, n, [eps])[0] > delta  # the mechanism needs ε


@pytest.mark.slow
@pytest.mark.parametrize(("eps0", "n"), [(1.0, 10), (0.5, 9), (2.0, 9)])
def test_the_bound_is_close_to_the_exact_delta_of_its_data_set(eps0: float, n: int) -> None:
    # The losses (Jensen over Y's spread given N1, M1, M0; the cut taking E[N0 | M0]
    # at its mean) grow far in the tail at tiny n; bench/tightness.py shows large n.
    p = 1 / (math.exp(eps0) + 1)
    eps = [0.05, 0.2]
    exact = pattern_delta(p, 0.5, n, eps)
    lower = _Walks(p, 0.5, n).jensen_sum(eps) / n
    assert np.all(lower <= exact + ROUNDING)
    assert np.all(lower >= 0.9 * exact), (lower, exact)


@pytest.mark.slow
@pytest.mark.parametrize(("eps0", "n", "delta"), [(1.0, 100_000, 1e-6), (0.25, 30_000, 1e-10)])
def test_oue_figure_stays_above_the_labelled_lower_bound(eps0: float, n: int, delta: float) -> None:
    oue = BitVector(p=1 / (math.exp(eps0) + 1), q=0.5, bits=1, label="OUE")
    lowers = bit_vector_lower(oue.p, oue.q, 1, n, delta)
    ours = best_amplification(eps0, n, delta, oue).result.epsilon
    assert lowers["labelled"] > max(lowers["columns"], lowers["filtered"])
    assert lowers["labelled"] <= ours <= 1.12 * lowers["labelled"]


@pytest.mark.slow  # seconds of exact δ: the full check runs it
@pytest.mark.parametrize(("eps0", "n", "delta"), [(1.0, 10_000, 1e-6), (0.25, 3_000, 1e-10)])
def test_the_search_returns_a_certified_epsilon_next_to_the_root(
    eps0: float, n: int, delta: float
) -> None:
    p = 1 / (math.exp(eps0) + 1)
    eps = labelled_one_bit(p, 0.5, n, delta, 0.0, eps0)
    below, above = _Walks(p, 0.5, n).jensen_sum([eps, eps * (1.0 + 2e-5)]) / n
    assert below > delta >= above  # certified, and within 2e-5 relative of the root


def label_split_delta(p: float, q: float, n: int, eps: list[float]) -> np.ndarray:
    """The same δ with the labels counted first: given L1 label-1 reports, X and Y are
    independent copies of s(1)·(r(0)·L1 + Δ·U1) + s(0)·(r(0)·L0 + Δ·U0), U_ℓ ~
    Bin(L_ℓ, p), so every (L1, U1, U0) is summed (no window: exact up to rounding)."""
    from scipy import stats

    r1, r0, s1, s0 = q / p, (1 - q) / (1 - p), p / q, (1 - p) / (1 - q)
    c = np.exp(np.asarray(eps))
    out = np.zeros(len(eps))
    for l1 in range(n + 1):
        u1, u0 = np.arange(l1 + 1), np.arange(n - l1 + 1)
        v = (s1 * (r0 * l1 + (r1 - r0) * u1))[:, None] + (s0 * (r0 * (n - l1) + (r1 - r0) * u0))
        w = stats.binom.pmf(u1, l1, p)[:, None] * stats.binom.pmf(u0, n - l1, p)[None, :]
        order = np.argsort(v, axis=None)
        v, w = v.ravel()[order], w.ravel()[order]
        tail0 = np.concatenate((np.cumsum(w[::-1])[::-1], [0.0]))
        tail1 = np.concatenate((np.cumsum((w * v)[::-1])[::-1], [0.0]))
        for i, ci in enumerate(c):
            idx = np.searchsorted(v, ci * v, side="right")
            kept = np.maximum(tail1[idx] - ci * v * tail0[idx], 0.0)
            out[i] += stats.binom.pmf(l1, n, q) * float(np.sum(w * kept))
    return out / n


def test_the_label_split_is_the_pattern_enumeration() -> None:
    for p, q, n in ((1 / (math.e + 1), 0.5, 5), (0.2, 0.7, 6)):
        exact = pattern_delta(p, q, n, list(GRID))
        assert np.allclose(label_split_delta(p, q, n, list(GRID)), exact, rtol=1e-9, atol=1e-13)


@pytest.mark.slow  # seconds of exact δ: the full check runs it
@pytest.mark.parametrize(("eps0", "q"), [(0.25, 0.5), (1.0, 0.5), (4.0, 0.5), (2.0, None)])
def test_the_bound_and_its_search_stay_below_the_exact_delta_at_a_moderate_crowd(
    eps0: float, q: float | None
) -> None:
    # q = None: a PRR-like pair (p, 1 − p) with the same ε0; n = 150 is past every
    # enumeration of the real mechanism but summed exactly by the label split.
    n = 150
    if q is None:
        p = 1 / (math.exp(eps0 / 2) + 1)
        q = 1 - p
    else:
        p = 1 / (math.exp(eps0) + 1)
    grid = [eps0 * i / 20 for i in range(20)]
    exact = label_split_delta(p, q, n, grid)
    lower = _Walks(p, q, n).jensen_sum(grid) / n
    assert np.all(lower <= exact * (1 + ROUNDING)), (lower, exact)
    for delta in (1e-3, 1e-6, 1e-10):
        eps = labelled_one_bit(p, q, n, delta, 0.0, eps0)
        assert eps > 0.0 and label_split_delta(p, q, n, [eps])[0] > delta
