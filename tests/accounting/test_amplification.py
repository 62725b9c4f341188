"""Amplification by shuffling: exactness of the pair evaluation, reference values,
safe-side root search and the invariants (Hypothesis)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crowdmix.aggregator.accounting.amplification import (
    amplify,
    epsilon_from_pair,
    fmt21_closed_form,
    shuffled_rr_lower_bound,
)
from crowdmix.aggregator.accounting.local import epsilon_one
from crowdmix.aggregator.accounting.pairs import ClonePair
from crowdmix.core.params import RapporParams

DELTA = 1e-6


def _brute_force_delta(pair: ClonePair, n: int, eps: float) -> float:
    """D_{e^ε}(P‖Q) by enumerating every (N0, N1) with multinomial weights."""
    r, g = pair.r, pair.gamma
    others: dict[tuple[int, int], float] = {}
    m = n - 1
    for a in range(m + 1):
        for b in range(m + 1 - a):
            coef = math.factorial(m) / (
                math.factorial(a) * math.factorial(b) * math.factorial(m - a - b)
            )
            others[(a, b)] = coef * r**a * r**b * (1 - 2 * r) ** (m - a - b)
    victim_p = {(1, 0): pair.p * pair.alpha, (0, 1): pair.alpha, (0, 0): g}
    victim_q = {(1, 0): pair.alpha, (0, 1): pair.p * pair.alpha, (0, 0): g}
    pdist: dict[tuple[int, int], float] = {}
    qdist: dict[tuple[int, int], float] = {}
    for (a, b), w in others.items():
        for (da, db), v in victim_p.items():
            pdist[(a + da, b + db)] = pdist.get((a + da, b + db), 0.0) + w * v
        for (da, db), v in victim_q.items():
            qdist[(a + da, b + db)] = qdist.get((a + da, b + db), 0.0) + w * v
    e = math.exp(eps)
    d_pq = sum(max(0.0, pdist[o] - e * qdist.get(o, 0.0)) for o in pdist)
    d_qp = sum(max(0.0, qdist[o] - e * pdist.get(o, 0.0)) for o in qdist)
    return max(d_pq, d_qp)


@pytest.mark.parametrize(
    "pair",
    [
        ClonePair.stronger_clone(1.0),
        ClonePair.stronger_clone(3.0),
        ClonePair.clones_fmt21(2.0),
        # γ > 0 (victim may land in neither bucket): evaluation only, no claim it dominates
        ClonePair(p=math.exp(1.2), alpha=0.2 / (math.exp(1.2) - 1), r=0.2 / (math.exp(1.2) - 1)),
        ClonePair(p=math.exp(2.0), alpha=1 / (math.exp(2.0) + 2), r=1 / (math.exp(2.0) + 2)),
    ],
)
@pytest.mark.parametrize("n", [1, 2, 7, 25])
def test_pair_evaluation_is_exact(pair: ClonePair, n: int) -> None:
    ev = pair.evaluate(n, DELTA)
    assert ev.tail <= 1e-3 * DELTA  # mass of C outside the window, charged to δ
    for eps in (0.0, 0.1, 0.5, 1.0, math.log(pair.p) * 0.9):
        exact = _brute_force_delta(pair, n, eps)
        # Between the lower and the upper bound, which differ by the charged tail and
        # float error only.
        assert ev.delta_lower(eps) - 1e-13 <= exact <= ev.delta(eps) + 1e-13
        assert ev.delta(eps) - ev.delta_lower(eps) <= ev.tail + 8 * ev._rel * (1 + math.exp(eps))


def test_a_lower_root_takes_pairs_only() -> None:
    """A profile's δ charges its float error upward (and a mixture's adds
    FLOAT_SLACK), so δ less its tail can sit above the exact δ: no lower bound."""
    from crowdmix.aggregator.accounting.amplification import _lower_root
    from crowdmix.aggregator.accounting.blanket import mixture

    pair = ClonePair.stronger_clone(1.0)
    n, eps = 25, 0.1
    profile = mixture(0, 0.0, lambda _m: pair.evaluate(n, DELTA), DELTA)
    exact = _brute_force_delta(pair, n, eps)
    assert profile.delta(eps) - profile.tail > exact + 1e-12
    assert pair.evaluate(n, DELTA).delta_lower(eps) <= exact + 1e-13
    with pytest.raises(TypeError, match="EvaluatedPair"):
        _lower_root(profile, DELTA, 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize("n", [0, 1, 2, 7, 400, 10**5, 3 * 10**6])
@pytest.mark.parametrize("p", [0.0, 1e-7, 0.125, 0.5, 0.9999, 1.0])
def test_binom_logpmf_is_scipys_bit_for_bit(n: int, p: float) -> None:
    # The float error the bounds charge (pmf_error) is that of scipy's log-gamma sum:
    # the faster form must be that sum exactly, −inf outside the support included.
    import numpy as np
    from scipy import stats

    from crowdmix.aggregator.accounting.pairs import binom_logpmf

    mid = round(n * p)
    k = np.unique(np.concatenate([np.arange(-2, 4), np.arange(mid - 40, mid + 40), [n, n + 1]]))
    k = k.astype(np.float64)
    assert np.array_equal(binom_logpmf(k, n, p), stats.binom.logpmf(k, n, p))
    rest = np.arange(max(0, n - 3), n + 1, dtype=np.float64)  # broadcast over n too
    assert np.array_equal(
        binom_logpmf(k[None, :], rest[:, None], p), stats.binom.logpmf(k[None, :], rest[:, None], p)
    )


def test_pair_tail_is_charged_at_large_n() -> None:
    ev = ClonePair.stronger_clone(1.0).evaluate(10**6, DELTA)
    assert 0.0 < ev.tail <= 1e-3 * DELTA


def _half_tail(t: int, a: int) -> float:
    """P(Bin(t, ½) ≥ a) to 40 digits: the pmf at a from log-gammas (50 digits), then
    the terms by their ratio (t − k)/(k + 1) until they stop adding anything, relative
    to the first in fixed point (integers in units of 2^-256 of it: each step
    truncates under one unit, so the ~10⁴ steps here are off by < 2^-200 of the sum)."""
    import mpmath

    with mpmath.workdps(50):
        first = mpmath.exp(
            mpmath.loggamma(t + 1) - mpmath.loggamma(a + 1) - mpmath.loggamma(t - a + 1)
            - t * mpmath.log(2)
        )  # fmt: skip
    one = 1 << 256
    term, total, k = one, 0, a
    while k <= t and (term * 10**45 > total or k < t // 2):
        total += term
        term = term * (t - k) // (k + 1)
        k += 1
    with mpmath.workdps(50):
        return float(first * mpmath.mpf(total) / one)


@pytest.mark.parametrize(("n", "epsilon0"), [(10**5, 4.0), (10**7, 1.0)])
def test_float_error_of_the_pair_is_within_what_is_charged(n: int, epsilon0: float) -> None:
    """The weights Bin(n−1, 2r) and the tails and terms of Bin(t, ½) that δ is summed from,
    against 40- and 50-digit values: each within the relative error charged to δ."""
    import mpmath
    from scipy import stats

    from crowdmix.aggregator.accounting.pairs import half_tail_error, pmf_error

    pair = ClonePair.stronger_clone(epsilon0)
    m, prob = n - 1, 2.0 * pair.r
    sd = math.sqrt(m * prob * (1 - prob))
    worst, worst_tail = 0.0, 0.0
    for z in (-8.0, -3.0, 0.0, 2.5, 8.0):
        k = round(m * prob + z * sd)
        got = math.exp(stats.binom.logpmf(k, m, prob))
        with mpmath.workdps(50):
            exact = mpmath.exp(
                mpmath.loggamma(m + 1) - mpmath.loggamma(k + 1) - mpmath.loggamma(m - k + 1)
                + k * mpmath.log(prob) + (m - k) * mpmath.log1p(-prob)
            )  # fmt: skip
        worst = max(worst, float(abs(got / exact - 1)))
        t = k + 1  # the victim's bucket adds one: a tail of Bin(t, ½) at a cutoff near t/2
        for a in (t // 2 - round(2 * math.sqrt(t)), t // 2 + 1):
            tail = stats.binom.sf(a - 1, t, 0.5)
            exact_tail = _half_tail(t, a)
            worst_tail = max(worst_tail, float(abs(tail / exact_tail - 1)))
            point = stats.binom.pmf(a - 1, t - 1, 0.5)  # the cutoff's own term
            with mpmath.workdps(50):
                exact_point = mpmath.exp(
                    mpmath.loggamma(t) - mpmath.loggamma(a) - mpmath.loggamma(t - a + 1)
                    - (t - 1) * mpmath.log(2)
                )  # fmt: skip
            worst_tail = max(worst_tail, float(abs(point / exact_point - 1)))
    charged = pair.evaluate(n, DELTA)._rel
    weights = pmf_error(m, min(prob, 0.5))  # as charged: k·|ln p| ≤ n·ln 2 either way
    assert worst <= weights
    assert worst_tail <= half_tail_error(n + 1)
    assert weights + half_tail_error(n + 1) <= charged
    assert charged <= 1e-5  # and the charge stays far below anything that moves ε


def test_reference_values_and_the_order_of_the_bounds() -> None:
    # Computed with independent code, δ = 1e-6.
    generic = amplify(4.0, 10**5, DELTA).epsilon
    fmt21 = amplify(4.0, 10**5, DELTA, bound="fmt21").epsilon
    closed = amplify(4.0, 10**5, DELTA, bound="fmt21-closed").epsilon
    lower = shuffled_rr_lower_bound(4.0, 10**5, DELTA)
    assert generic == pytest.approx(0.11815, abs=5e-6)
    assert fmt21 == pytest.approx(0.16977, abs=5e-6)
    assert closed == pytest.approx(0.5346, abs=5e-5)
    assert lower == pytest.approx(0.117, abs=5e-4)
    assert lower <= generic < fmt21 < closed
    assert shuffled_rr_lower_bound(4.0, 10**5, DELTA, domain=2) <= generic
    eps1 = epsilon_one(RapporParams())
    assert amplify(eps1, 10**6, DELTA).epsilon == pytest.approx(0.003872, abs=5e-7)


def test_root_is_on_the_safe_side_and_tight() -> None:
    pair = ClonePair.stronger_clone(2.0)
    ev = pair.evaluate(20_000, DELTA)
    eps = epsilon_from_pair(pair, 20_000, DELTA, 2.0)
    assert ev.delta(eps) <= DELTA
    assert ev.delta(eps * (1 - 1e-6)) > DELTA


def test_no_amplification_for_tiny_batches() -> None:
    result = amplify(4.0, 50, DELTA)
    assert not result.amplified
    assert result.epsilon == 4.0
    assert amplify(4.0, 10**5, DELTA).amplified
    assert fmt21_closed_form(4.0, 1000, DELTA) is None  # outside its regime
    closed = amplify(4.0, 1000, DELTA, bound="fmt21-closed")
    assert not closed.amplified and closed.epsilon == 4.0


def test_huge_epsilon0_is_not_amplified_and_does_not_overflow() -> None:
    for bound in ("generic", "fmt21", "fmt21-closed"):
        result = amplify(800.0, 10**6, DELTA, bound=bound)
        assert result.epsilon == 800.0 and not result.amplified


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"epsilon0": -1.0, "n": 10, "delta": DELTA}, "epsilon0"),
        ({"epsilon0": 1.0, "n": 0, "delta": DELTA}, "n must"),
        ({"epsilon0": 1.0, "n": 10, "delta": 0.0}, "delta"),
        ({"epsilon0": 1.0, "n": 10, "delta": DELTA, "bound": "nope"}, "bound"),
        # removed: the (p, β, q) pair is not a dominating pair (pairs.py)
        ({"epsilon0": 1.0, "n": 10, "delta": DELTA, "bound": "rappor"}, "not a dominating pair"),
    ],
)
def test_bad_input_is_rejected(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        amplify(**kwargs)  # type: ignore[arg-type]


def test_pair_params_are_validated() -> None:
    with pytest.raises(ValueError, match="p must"):
        ClonePair(p=1.0, alpha=0.1, r=0.1)
    with pytest.raises(ValueError, match="alpha"):
        ClonePair(p=2.0, alpha=0.5, r=0.1)
    with pytest.raises(ValueError, match="r must"):
        ClonePair(p=2.0, alpha=0.2, r=0.6)


# Invariants. Kept to n ≤ 2e4 and few examples: the timing targets live in bench/.
EPS0 = st.floats(0.05, 6.0)
N = st.integers(2, 20_000)


@settings(max_examples=12, deadline=None)
@given(eps0=EPS0, n=N)
def test_never_above_epsilon0_never_below_rr(eps0: float, n: int) -> None:
    generic = amplify(eps0, n, DELTA).epsilon
    assert generic <= eps0
    assert generic >= shuffled_rr_lower_bound(eps0, n, DELTA) * (1 - 1e-9)


@settings(max_examples=10, deadline=None)
@given(eps0=EPS0, n=N)
def test_monotone_in_n(eps0: float, n: int) -> None:
    assert amplify(eps0, 2 * n, DELTA).epsilon <= amplify(eps0, n, DELTA).epsilon * (1 + 1e-8)


@settings(max_examples=10, deadline=None)
@given(eps0=EPS0, n=N, factor=st.floats(1.05, 2.0))
def test_monotone_in_epsilon0(eps0: float, n: int, factor: float) -> None:
    low = amplify(eps0, n, DELTA).epsilon
    assert low <= amplify(eps0 * factor, n, DELTA).epsilon * (1 + 1e-8)
