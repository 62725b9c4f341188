"""Local guarantees: ε_k and β against reference values and brute-force enumeration."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crowdmix.aggregator.accounting.local import (
    basic_total_variation,
    epsilon_k,
    generic_total_variation,
    total_variation,
)
from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams
from crowdmix.core.privacy import epsilon_inf, epsilon_one, p_star, q_star

DEFAULTS = RapporParams()  # k=16, h=2, f=.5, p=.5, q=.75


def test_reference_values_for_defaults() -> None:
    assert epsilon_k(DEFAULTS, 1) == pytest.approx(1.074286, abs=5e-7)
    assert epsilon_k(DEFAULTS, 10) == pytest.approx(4.2993, abs=5e-5)
    assert epsilon_inf(DEFAULTS) == pytest.approx(4 * math.log(3), abs=1e-12)
    assert total_variation(DEFAULTS) == pytest.approx(0.190430, abs=5e-7)
    assert generic_total_variation(epsilon_one(DEFAULTS)) == pytest.approx(0.490822, abs=5e-7)


def _bit_prob_k(prr_keep: float, q: float, p: float, ones: int, k: int) -> float:
    """P(k reports of one Bloom bit show ``ones`` given ones) for Bloom bit value via prr_keep."""
    # PRR bit = 1 w.p. prr_keep; then k IRR draws with P(1|1)=q, P(1|0)=p (a fixed sequence).
    seq1 = q**ones * (1 - q) ** (k - ones)
    seq0 = p**ones * (1 - p) ** (k - ones)
    return prr_keep * seq1 + (1 - prr_keep) * seq0


def _brute_force_epsilon_k(params: RapporParams, k: int) -> float:
    """max over every observable sequence of log P(obs|x)/P(obs|x'), x, x' with disjoint bits."""
    h, f = params.h, params.f
    on, off = 1 - f / 2, f / 2  # P(PRR bit = 1) for Bloom bit 1 / 0
    worst = 0.0
    # Each of 2h bits shows k report bits; enumerate all 2^(2hk) observations.
    for obs in itertools.product((0, 1), repeat=2 * h * k):
        px = py = 1.0
        for bit in range(2 * h):
            chunk = obs[bit * k : (bit + 1) * k]
            ones = sum(chunk)
            x_has = bit < h  # x sets bits 0..h-1, x' sets h..2h-1
            px *= _bit_prob_k(on if x_has else off, params.q, params.p, ones, k)
            py *= _bit_prob_k(off if x_has else on, params.q, params.p, ones, k)
        worst = max(worst, math.log(px / py), math.log(py / px))
    return worst


@pytest.mark.parametrize(
    ("h", "k", "f", "p", "q"),
    [
        (1, 1, 0.5, 0.5, 0.75),
        (1, 3, 0.5, 0.5, 0.75),
        (2, 2, 0.5, 0.5, 0.75),
        (1, 4, 0.25, 0.3, 0.9),
        (2, 1, 0.0, 0.25, 0.75),
        (2, 2, 0.75, 0.1, 0.6),
    ],
)
def test_epsilon_k_matches_brute_force(h: int, k: int, f: float, p: float, q: float) -> None:
    params = RapporParams(k=16, h=h, f=f, p=p, q=q)
    assert epsilon_k(params, k) == pytest.approx(_brute_force_epsilon_k(params, k), rel=1e-10)


def test_epsilon_k_starts_at_epsilon_one_and_rises_to_epsilon_inf() -> None:
    assert epsilon_k(DEFAULTS, 0) == 0.0
    assert epsilon_k(DEFAULTS, 1) == pytest.approx(epsilon_one(DEFAULTS), rel=1e-12)
    values = [epsilon_k(DEFAULTS, k) for k in (1, 2, 5, 10, 100, 10**6)]
    assert values == sorted(values)
    assert epsilon_k(DEFAULTS, 10**9) == pytest.approx(epsilon_inf(DEFAULTS), rel=1e-8)
    assert epsilon_k(DEFAULTS, 10**9) <= epsilon_inf(DEFAULTS)


@settings(max_examples=40, deadline=None)
@given(
    h=st.integers(1, 4),
    f=st.floats(0.05, 0.95),
    p=st.floats(0.0, 0.9),
    gap=st.floats(0.01, 1.0),
    k=st.integers(1, 10**5),
)
def test_epsilon_k_between_epsilon_one_and_epsilon_inf(
    h: int, f: float, p: float, gap: float, k: int
) -> None:
    q = min(1.0, p + gap * (1 - p))
    if not p < q:
        return
    params = RapporParams(k=16, h=h, f=f, p=p, q=q)
    ek = epsilon_k(params, k)
    assert epsilon_one(params) * (1 - 1e-12) <= ek <= epsilon_inf(params) * (1 + 1e-12)
    # ε_k takes a log-space path: a few ulps of 1 absolute (seen: 7e-15 at ε_1 = 0.0038)
    assert ek <= k * epsilon_one(params) * (1 + 1e-12) + 1e-13


def test_epsilon_k_rejects_bad_k() -> None:
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="k must be"):
            epsilon_k(DEFAULTS, bad)  # type: ignore[arg-type]


def _brute_force_tv(params: RapporParams) -> float:
    h, ps, qs = params.h, p_star(params), q_star(params)
    total = 0.0
    for obs in itertools.product((0, 1), repeat=2 * h):
        px = py = 1.0
        for bit, b in enumerate(obs):
            x_has = bit < h
            px *= (qs if x_has else ps) if b else (1 - (qs if x_has else ps))
            py *= (ps if x_has else qs) if b else (1 - (ps if x_has else qs))
        total += abs(px - py)
    return total / 2


@pytest.mark.parametrize("h", [1, 2, 3, 4])
def test_total_variation_matches_enumeration(h: int) -> None:
    params = RapporParams(k=32, h=h, f=0.3, p=0.35, q=0.8)
    assert total_variation(params) == pytest.approx(_brute_force_tv(params), abs=1e-14)
    # β never exceeds what any ε_1-LDP randomizer can have.
    assert total_variation(params) <= generic_total_variation(epsilon_one(params)) + 1e-15


def test_basic_total_variation() -> None:
    krr = BasicParams(mechanism="krr", epsilon=2.0, domain_size=5)
    e = math.exp(2.0)
    assert basic_total_variation(krr) == pytest.approx((e - 1) / (e + 4))
    # OUE's exact β is half the generic one.
    oue = BasicParams(mechanism="oue", epsilon=2.0, domain_size=5)
    assert basic_total_variation(oue) == pytest.approx(0.5 * math.tanh(1.0))
    assert round(basic_total_variation(oue), 3) == 0.381
    olh = BasicParams(mechanism="olh", epsilon=2.0, domain_size=5)
    assert basic_total_variation(olh) == pytest.approx((e - 1) / (e + olh.olh_buckets - 1))


def test_basic_epsilon_covers_what_the_float_probabilities_realise() -> None:
    """The ε a statement amplifies is at least the ε of the float probabilities the SDKs
    draw with, computed exactly (Fractions, 50-digit logs), over 20,000 random params;
    and it exceeds the configured ε by no more than float noise (≤ 1e-9 up to ε = 10; at
    ε near 29, 1 − keep ≈ 1e-13 and one ulp of keep moves ε by up to ~1e-4)."""
    import random
    from fractions import Fraction

    import mpmath

    from crowdmix.aggregator.accounting.local import basic_epsilon
    from crowdmix.core.basic import BasicParams

    rng = random.Random(20261126)
    above = 0
    with mpmath.workdps(50):
        for _ in range(20_000):
            mech = rng.choice(["krr", "binary-rr", "oue", "olh"])
            eps = rng.uniform(0.01, 12.0 if mech == "olh" else 29.0)
            d = 2 if mech == "binary-rr" else rng.randint(2, 4096)
            params = BasicParams(mechanism=mech, epsilon=eps, domain_size=d)
            if mech == "oue":
                q = Fraction(params.oue_q)
                ratio = (1 - q) / q
            else:
                n = params.olh_buckets if mech == "olh" else d
                keep = Fraction(params.keep_probability)
                ratio = keep * (n - 1) / (1 - keep)
            exact = mpmath.log(mpmath.mpf(ratio.numerator) / ratio.denominator)
            stated = basic_epsilon(params)
            assert mpmath.mpf(stated) >= exact, (mech, eps, d)
            # an ulp of keep is large against 1 − keep only where ε is large
            assert stated - params.epsilon <= (1e-9 if eps <= 10.0 else 1e-3), (mech, eps, d)
            above += stated > params.epsilon
    assert above  # float probabilities do realise more than the configured ε somewhere
