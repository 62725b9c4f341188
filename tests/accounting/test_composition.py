"""Composition: reference values, ordering of the methods, invariants, PLD."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crowdmix.aggregator.accounting.amplification import amplify
from crowdmix.aggregator.accounting.composition import (
    compose,
    compose_advanced,
    compose_basic,
    compose_optimal,
    optimal_delta,
)
from crowdmix.aggregator.accounting.pairs import ClonePair, pmf_error
from crowdmix.aggregator.accounting.pld import (
    MAX_PLD_N,
    exact_sum,
    pair_loss_counts,
    pld_epsilon,
    shuffle_pld,
)


def test_reference_values() -> None:
    # Kairouz-Oh-Viswanath optimal composition, δ' = 1e-6.
    assert compose_optimal(0.5, 0.0, 100, 1e-6) == pytest.approx(33.3198, abs=5e-5)
    assert compose_optimal(0.5, 0.0, 1000, 1e-6) == pytest.approx(193.504, abs=5e-4)
    assert compose_optimal(0.5, 1e-8, 100, 1e-6) == pytest.approx(42.6521, abs=5e-5)


def test_basic_and_advanced_formulas() -> None:
    eps, delta = compose_basic(0.5, 1e-8, 100)
    assert eps == 50.0 and delta == pytest.approx(1e-6)
    expected = 0.5 * math.sqrt(2 * 100 * math.log(1 / 1e-6)) + 100 * 0.5 * math.expm1(0.5)
    assert compose_advanced(0.5, 0.0, 100, 1e-6) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="target_delta"):
        compose_advanced(0.5, 1e-7, 100, 1e-6)  # kδ already exceeds the target


def test_optimal_is_exact_for_one_mechanism() -> None:
    # k = 1: the region of one ε-DP mechanism is (ε_g, (e^ε − e^ε_g)/(1+e^ε)).
    eps = 1.0
    for eps_g in (0.0, 0.3, 0.9):
        expected = (math.exp(eps) - math.exp(eps_g)) / (1 + math.exp(eps))
        assert optimal_delta(eps, 0.0, 1, eps_g) == pytest.approx(expected, rel=1e-12)


def test_optimal_root_is_safe() -> None:
    eps = compose_optimal(0.3, 1e-9, 50, 1e-6)
    assert optimal_delta(0.3, 1e-9, 50, eps) <= 1e-6
    assert optimal_delta(0.3, 1e-9, 50, eps * (1 - 1e-6)) > 1e-6


def test_compose_dispatch_and_errors() -> None:
    assert compose(0.5, 0.0, 10, 1e-6, "basic") == (5.0, 0.0)
    assert compose(0.5, 0.0, 10, 1e-6, "optimal")[1] == 1e-6
    with pytest.raises(ValueError, match="method"):
        compose(0.5, 0.0, 10, 1e-6, "magic")
    with pytest.raises(ValueError, match="k must"):
        compose_optimal(0.5, 0.0, 0, 1e-6)
    with pytest.raises(ValueError, match="target_delta"):
        compose_optimal(0.5, 1e-3, 1000, 1e-6)


@settings(max_examples=40, deadline=None)
@given(
    eps=st.floats(0.01, 3.0),
    delta=st.sampled_from([0.0, 1e-10, 1e-9]),
    k=st.integers(1, 300),
)
def test_composition_invariants(eps: float, delta: float, k: int) -> None:
    target = 1e-6
    optimal = compose_optimal(eps, delta, k, target)
    # Never below a single release, never above basic composition, non-decreasing in k.
    assert optimal >= compose_optimal(eps, delta, 1, target) * (1 - 1e-9)
    assert optimal <= k * eps * (1 + 1e-9)
    assert compose_optimal(eps, delta, k + 1, target) >= optimal * (1 - 1e-9)
    if target > k * delta:
        assert optimal <= compose_advanced(eps, delta, k, target) * (1 + 1e-9)
        assert compose_advanced(eps, delta, k, target) >= eps * (1 - 1e-9) or k == 1


@pytest.mark.slow  # heavy: the full check runs it, scripts/check --fast does not
def test_pld_matches_single_round_and_beats_per_round_composition() -> None:
    eps0, n = 1.074286, 100_000
    pair = ClonePair.stronger_clone(eps0)
    one_round = pld_epsilon(pair, n, 1, 1e-6)
    exact = amplify(eps0, n, 1e-6).epsilon
    # Pessimistic rounding: never below the exact figure, and close to it.
    assert exact <= one_round <= exact * 1.01
    # Reference: ≈0.56 over 1000 rounds, vs 3.20 (optimal) and 21.1 (basic).
    thousand = pld_epsilon(pair, n, 1000, 1e-6)
    assert thousand == pytest.approx(0.56, abs=0.01)
    per_delta = 1e-6 / 2000
    per_round = amplify(eps0, n, per_delta).epsilon
    optimal = compose_optimal(per_round, per_delta, 1000, 1e-6)
    assert optimal == pytest.approx(3.20, abs=0.01)
    assert compose_basic(per_round, per_delta, 1000)[0] == pytest.approx(21.1, abs=0.05)
    assert thousand < optimal


def test_pld_rejects_huge_n() -> None:
    with pytest.raises(ValueError, match="PLD"):
        shuffle_pld(ClonePair.stronger_clone(1.0), MAX_PLD_N + 1)


def _loss_counts_term_by_term(
    pair: ClonePair, n: int, tail: float, pessimistic: bool
) -> tuple[dict[int, float], float]:
    """pair_loss_counts the plain way: every (t, a) of the window one by one, through
    scipy's binomial law (pld's module docstring has the formulas)."""
    from scipy import stats

    arr = pair.evaluate(n, 0.5, tail=tail)._arrays()
    counts: dict[int, float] = {}
    masses = []
    if pair.gamma > 0.0 and arr["t"][0] == 1.0:
        zero = float(stats.binom.pmf(0, n - 1, min(1.0, 2.0 * pair.r))) * pair.gamma
        counts[0] = zero
        masses.append(zero)
    p, alpha = pair.p, pair.alpha
    for t, w1, ncoef in zip(arr["t"], arr["w1"], arr["ncoef"], strict=True):
        half = 8.5 * 0.5 * math.sqrt(t)
        for a in range(max(0, math.floor(t / 2 - half)), min(int(t), math.ceil(t / 2 + half)) + 1):
            lp = 2 * p * alpha * a + 2 * alpha * (t - a) + ncoef
            lq = 2 * alpha * a + 2 * p * alpha * (t - a) + ncoef
            mass = w1 * float(stats.binom.pmf(a, t, 0.5)) * lp / t
            key = (math.ceil if pessimistic else math.floor)(math.log(lp / lq) / 1e-5)
            counts[key] = counts.get(key, 0.0) + mass
            masses.append(mass)
    return {k: v for k, v in counts.items() if v > 0.0 or k == 0}, math.fsum(masses)


@pytest.mark.parametrize("pessimistic", [True, False])
@pytest.mark.parametrize(
    ("pair", "n"),
    [
        (ClonePair.stronger_clone(1.0), 40),
        (ClonePair.stronger_clone(3.0), 300),
        (ClonePair(p=math.exp(2.0), alpha=1 / (math.exp(2.0) + 4), r=1 / 5), 25),
        (ClonePair(p=math.exp(0.5), alpha=1 / (math.exp(0.5) + 1), r=1 / 2), 120),
    ],
)
def test_pld_loss_counts_are_the_sum_over_every_count(
    pair: ClonePair, n: int, pessimistic: bool
) -> None:
    counts, kept = pair_loss_counts(pair, n, tail=1e-12, pessimistic=pessimistic)
    plain, plain_kept = _loss_counts_term_by_term(pair, n, 1e-12, pessimistic)
    # Each mass moved by its float error bound: up for an upper bound, down for a lower.
    rel = 16 * math.ulp(1.0) + pmf_error(n + 1, 0.5) + pmf_error(n - 1, min(2 * pair.r, 0.5))
    scale = 1 + rel if pessimistic else 1 - rel
    assert counts.keys() == plain.keys()
    for key, mass in plain.items():
        assert counts[key] == pytest.approx(mass * scale, rel=1e-12, abs=1e-300), key
    if pessimistic:  # 1 − the bound on the mass left out, which is at least the true one
        assert 1 - kept >= 1 - plain_kept * scale - 1e-15
        assert 1 - kept <= 1e-9
    else:
        assert kept == pytest.approx(plain_kept * scale, rel=1e-13)


def test_exact_sum_is_the_correctly_rounded_sum() -> None:
    rng = np.random.default_rng(7)
    tiny = np.exp(rng.uniform(-745.0, 0.0, 200_000))  # subnormals to 1: thousands of binades
    signed = rng.standard_normal(50_000) * np.exp(rng.uniform(-60.0, 60.0, 50_000))
    cancelling = np.concatenate([signed, -signed[::-1], [1e-300, 5e-324]])
    for values in (tiny, signed, cancelling, np.full(3_000, 0.1), np.zeros(5_000)):
        assert exact_sum(values) == math.fsum(values.tolist())


def _exact_mass_left_out(pair: ClonePair, n: int, tail: float) -> float:
    """1 − the exact P-mass (40 digits) of every (t, a) point pair_loss_counts keeps:
    P(t, a) = pα·B(t−1)·b(a−1; t−1) + α·B(t−1)·b(a; t−1) + γ·B(t)·b(a; t), with
    B = Bin(n−1, 2r), b = Bin(·, ½) and γ = 1 − α(1+p) as the math has it."""
    import mpmath  # type: ignore[import-untyped]

    t_all = pair.evaluate(n, 0.5, tail=tail)._arrays()["t"]
    c_lo, c_hi = int(t_all[0]) - 1, int(t_all[-1]) - 1
    with mpmath.workdps(40):
        p, alpha, q = mpmath.mpf(pair.p), mpmath.mpf(pair.alpha), 2 * mpmath.mpf(pair.r)
        gamma, m = 1 - alpha * (1 + p), n - 1

        def big(c: int) -> Any:
            return mpmath.binomial(m, c) * q**c * (1 - q) ** (m - c) if 0 <= c <= m else 0

        def half(a: int, t: int) -> Any:
            return mpmath.binomial(t, a) / mpmath.mpf(2) ** t if 0 <= a <= t else 0

        kept = gamma * big(0) if c_lo == 0 and pair.gamma > 0.0 else mpmath.mpf(0)
        for t in range(c_lo + 1, c_hi + 2):
            width = 8.5 * 0.5 * math.sqrt(t)
            for a in range(max(0, math.floor(t / 2 - width)), min(t, math.ceil(t / 2 + width)) + 1):
                kept += big(t - 1) * (p * alpha * half(a - 1, t - 1) + alpha * half(a, t - 1))
                kept += gamma * big(t) * half(a, t)
        return float(1 - kept)


@pytest.mark.parametrize(
    ("pair", "n", "tail"),
    [
        (ClonePair(p=math.e**2, alpha=1 / (math.e**2 + 3), r=0.25), 25, 0.05),
        (ClonePair(p=math.e, alpha=1 / (math.e + 8), r=0.1), 30, 0.3),  # γ·Bin(c_lo) needed
        (ClonePair.stronger_clone(1.0), 30, 0.02),
        (ClonePair.stronger_clone(2.0), 1, 1e-12),
    ],
)
def test_pld_left_out_bound_covers_every_point_not_enumerated(
    pair: ClonePair, n: int, tail: float
) -> None:
    _, kept = pair_loss_counts(pair, n, tail=tail)
    assert 1 - kept >= _exact_mass_left_out(pair, n, tail)


def test_pld_charges_a_victim_in_neither_mass_read_as_zero() -> None:
    # k-RR (d = 3) at ε0 = 28: γ ≈ 6.9e-13 is read as 0, so the masses miss it
    e = math.exp(28.0)
    pair = ClonePair(p=e, alpha=1 / (e + 2), r=1 / 3)
    assert pair.gamma == 0.0
    _, kept = pair_loss_counts(pair, 20)
    assert 1 - kept >= 1 - pair.alpha * (1 + pair.p) > 6e-13
