"""Composition: reference values, ordering of the methods, invariants, PLD."""

from __future__ import annotations

import math

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
from crowdmix.aggregator.accounting.pairs import ClonePair
from crowdmix.aggregator.accounting.pld import MAX_PLD_N, pld_epsilon, shuffle_pld


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
