"""Per-report privacy figures of RAPPOR (crowdmix.core.privacy) against exact computations."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from crowdmix.core.params import RapporParams
from crowdmix.core.privacy import epsilon_inf, epsilon_one, p_star, q_star


def test_known_values() -> None:
    # google/rappor's demo parameters: p* = 9/16, q* = 11/16,
    # ε_1 = 2 ln((11/16 · 7/16) / (9/16 · 5/16)) = 2 ln(77/45), ε_∞ = 4 ln 3.
    params = RapporParams(k=16, h=2, m=64, f=0.5, p=0.5, q=0.75)
    assert p_star(params) == 9 / 16 and q_star(params) == 11 / 16
    assert epsilon_one(params) == pytest.approx(2 * math.log(77 / 45), rel=1e-14)
    assert epsilon_inf(params) == pytest.approx(4 * math.log(3), rel=1e-14)


def test_tiny_probabilities_do_not_underflow() -> None:
    # q = 5e-324: p* and q* underflow to 0.0 as floats, yet q*/p* = (1-f/2)/(f/2).
    params = RapporParams(f=0.5, p=0.0, q=5e-324, h=1)
    assert epsilon_one(params) == pytest.approx(math.log(3), rel=1e-12)


def test_degenerate_parameters_are_infinite() -> None:
    assert epsilon_inf(RapporParams(f=0.0)) == math.inf
    assert epsilon_one(RapporParams(f=0.0, p=0.0, q=0.5)) == math.inf
    assert epsilon_one(RapporParams(f=0.0, p=0.5, q=1.0)) == math.inf
    assert math.isfinite(epsilon_one(RapporParams(f=0.1, p=0.0, q=1.0)))


@pytest.mark.parametrize(("k", "h"), [(4, 1), (6, 2), (8, 3)])
def test_epsilon_one_is_the_exact_worst_log_ratio(k: int, h: int) -> None:
    # One report's bits are independent given the Bloom filter: bit i is 1 w.p. q*
    # if Bloom bit i is 1, else p*. Enumerate every output for two values with
    # disjoint Bloom filters (the worst neighbours) and take the largest log-ratio.
    params = RapporParams(k=k, h=h, m=1, f=0.375, p=0.25, q=0.75)
    ps, qs = p_star(params), q_star(params)
    bx = [1] * h + [0] * (k - h)
    by = [0] * h + [1] * h + [0] * (k - 2 * h)

    def prob(bloom: list[int], out: tuple[int, ...]) -> float:
        return math.prod(
            (qs if b else ps) if o else (1 - qs if b else 1 - ps)
            for b, o in zip(bloom, out, strict=True)
        )

    worst = max(
        math.log(prob(bx, out) / prob(by, out)) for out in itertools.product((0, 1), repeat=k)
    )
    assert worst == pytest.approx(epsilon_one(params), rel=1e-12)


probs = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)


@given(f=st.floats(min_value=0.01, max_value=0.99), p=probs, q=probs, h=st.integers(1, 4))
def test_one_report_never_reveals_more_than_the_prr(f: float, p: float, q: float, h: int) -> None:
    # A report is a post-processing of the PRR, so ε_1 <= ε_∞ always.
    p, q = min(p, q), max(p, q)
    assume(p < q)
    params = RapporParams(k=16, h=h, f=f, p=p, q=q)
    assert 0 <= p_star(params) <= q_star(params) <= 1
    assert epsilon_one(params) <= epsilon_inf(params) * (1 + 1e-12)
