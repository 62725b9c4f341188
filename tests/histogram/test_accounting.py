"""aggregator.accounting.histogram: the δ(ε) figure against exact and empirical lower bounds."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from crowdmix.aggregator.accounting.histogram import (
    central_epsilon,
    fake_delta,
    format_up,
    histogram_delta,
    histogram_guarantee,
    shift_delta,
)
from crowdmix.aggregator.accounting.histogram_crowd import dishonest_share, honest_others
from crowdmix.core.histogram import HistogramParams


def brute_shift_delta(eps: float, t: int) -> float:
    b = stats.binom.pmf(np.arange(t + 2), t, 0.5)
    b[t + 1] = 0.0
    p = np.concatenate(([0.0], b[:-1]))  # 1 + Bin(t, 1/2)
    return float(np.maximum(p - math.exp(eps) * b, 0.0).sum())


@pytest.mark.parametrize("eps", [0.0, 0.3, 1.0, 2.5])
def test_shift_delta_is_the_exact_divergence(eps: float) -> None:
    t = np.arange(0, 40)
    ours = shift_delta(eps, t)
    brute = np.array([brute_shift_delta(eps, int(x)) for x in t])
    # float rounding only (fake_delta adds a 1e-9 relative margin on top)
    assert np.all(ours >= brute * (1 - 1e-12))
    assert np.allclose(ours, brute, rtol=1e-9, atol=1e-15)
    assert np.all(np.diff(ours) <= 1e-12 * ours[:-1])  # non-increasing in t


def full_histogram_delta(eps: float, d: int, trials: int, q: float, keep: float | None) -> float:
    """Exact D_{e^ε} of the whole histogram, by enumeration: a lower bound no figure may undercut.

    Fakes ~ Multinomial(trials; q/d each, 1 − q empty); the target holds 0 (P) or 1 (Q),
    optionally k-RR'd with P(keep) = ``keep``, each other value (1 − keep)/(d − 1).
    """
    s = q / d
    pmf: dict[tuple[int, ...], float] = {}
    for f in itertools.product(range(trials + 1), repeat=d):
        if sum(f) <= trials:
            rest = trials - sum(f)
            pmf[f] = float(stats.multinomial.pmf([*f, rest], trials, [s] * d + [1 - q]))
    keep_p = 1.0 if keep is None else keep
    other = (1.0 - keep_p) / (d - 1)

    def view(x: int) -> dict[tuple[int, ...], float]:
        out: dict[tuple[int, ...], float] = {}
        for f, pr in pmf.items():
            for y in range(d):
                w = keep_p if y == x else other
                if w:
                    h = tuple(f[j] + (j == y) for j in range(d))
                    out[h] = out.get(h, 0.0) + w * pr
        return out

    p, qv = view(0), view(1)
    e = math.exp(eps)
    return sum(max(0.0, pr - e * qv.get(h, 0.0)) for h, pr in p.items())


@pytest.mark.parametrize(
    ("d", "n_honest", "m", "q"), [(3, 4, 2, 0.6), (2, 9, 1, 0.9), (3, 5, 1, 1.0)]
)
@pytest.mark.parametrize("eps", [0.2, 0.8, 1.6])
def test_figure_equals_the_enumerated_full_histogram(
    d: int, n_honest: int, m: int, q: float, eps: float
) -> None:
    exact = full_histogram_delta(eps, d, n_honest * m, q, None)
    ours = fake_delta(eps, n_honest=n_honest, fake_slots=m, bucket_probability=q / d)
    assert exact - 1e-12 <= ours <= exact * (1 + 1e-6) + 1e-12


@functools.cache  # the same 81 pairs of views for every ε below: enumerated once
def _enumerated_views(
    params: HistogramParams, others: tuple[int, ...]
) -> tuple[dict[tuple[int, ...], float], dict[tuple[int, ...], float]]:
    from tests.histogram.test_statement_soundness import _mechanism

    return _mechanism(params, (0, *others)), _mechanism(params, (1, *others))


@pytest.mark.slow  # PLD accounting: seconds, left to the full check
@pytest.mark.parametrize("eps", [0.1, 0.5, 1.0])
def test_local_randomization_figure_bounds_the_enumerated_view(eps: float) -> None:
    """The target's k-RR report among the fakes of 4 honest others whose real reports are
    k-RR'd too: the whole histogram enumerated with tests/histogram/test_statement_soundness.py's
    brute force of the real mechanism (every value of the others)."""
    from tests.histogram.test_statement_soundness import _hockey

    params = HistogramParams(domain_size=3, fake_slots=2, fake_probability=0.7, local_epsilon=1.5)
    for others in itertools.product(range(3), repeat=4):
        p, q = _enumerated_views(params, others)
        exact = max(_hockey(p, q, eps), _hockey(q, p, eps))
        assert exact - 1e-12 <= histogram_delta(eps, params, n_honest=4)


def _audit(
    p_view: np.ndarray,
    q_view: np.ndarray,
    *,
    params: HistogramParams,
    n: int,
    delta: float,
    eps: float,
) -> float:
    """The audit both Monte Carlo tests run on the views (H_0, H_1) of two neighbouring
    values, one row a trial: K = 12 threshold sets S_c = {H_0 >= c·H_1 + 1}, each with
    Clopper–Pearson bounds at 1e-9 per side. Asserts that every certified δ gap at ε/2
    and ε stays under the figure; returns the largest ε the sets certify at ``delta``."""
    reps = len(p_view)
    alpha, best_eps = 1e-9, 0.0
    for c in np.exp(np.linspace(0.0, 3.0, 12)):
        kp = int(np.sum(p_view[:, 0] >= c * p_view[:, 1] + 1))
        kq = int(np.sum(q_view[:, 0] >= c * q_view[:, 1] + 1))
        p_lo = stats.beta.ppf(alpha, kp, reps - kp + 1) if kp else 0.0
        q_hi = stats.beta.ppf(1 - alpha, kq + 1, reps - kq) if kq < reps else 1.0
        # (ε, δ)-DP implies P(S) <= e^ε Q(S) + δ for every S:
        if p_lo > delta and q_hi > 0:
            best_eps = max(best_eps, math.log((p_lo - delta) / q_hi))
        for e_test in (0.5 * eps, eps):
            assert p_lo - math.exp(e_test) * q_hi <= histogram_delta(e_test, params, n_honest=n - 1)
    return best_eps


def test_monte_carlo_privacy_audit_of_the_analysts_view() -> None:
    """Empirical lower bounds from the simulated view never exceed the figures.

    The view (others' known reports removed) is e_target + fakes, fakes ~
    Multinomial(N; q/d each) — the encoder's law (tests/histogram/test_encoder.py).
    K = 12 threshold sets S_c = {H_0 >= c·H_1 + 1}, each with Clopper–Pearson bounds
    at 1e-9 per side: false-failure probability <= 2·12·1e-9 < 3e-8.
    """
    d, m, q, n = 3, 3, 1.0, 16
    params = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q)
    delta = 1e-3
    eps = central_epsilon(params, delta, n_honest=n - 1)
    assert math.isfinite(eps)
    trials = (n - 1) * m
    rng = np.random.default_rng(2018)
    reps = 400_000
    probs = [q / d] * d + [1 - q]
    fp = rng.multinomial(trials, probs, size=reps)[:, :2]
    fq = rng.multinomial(trials, probs, size=reps)[:, :2]
    p_view = fp + np.array([1, 0])
    q_view = fq + np.array([0, 1])
    best_eps = _audit(p_view, q_view, params=params, n=n, delta=delta, eps=eps)
    assert best_eps <= eps
    # the audit has teeth: it certifies a good share of the figure
    assert best_eps >= 0.5 * eps, (best_eps, eps)


@pytest.mark.slow
def test_monte_carlo_privacy_audit_through_the_real_encoder() -> None:
    """The same audit with every report made by ``client.HistogramEncoder`` itself
    (the target's real and fake reports, then the fakes of the 15 other devices, whose
    real reports the analyst is granted), 60,000 views per neighbouring value.

    Seeded (Mersenne Twister bits: statistics only). 12 threshold sets, Clopper–Pearson
    bounds at 1e-9 per side: false-failure probability <= 2·12·1e-9 < 3e-8.
    """
    from crowdmix.client.histogram import HistogramEncoder
    from tests.client.bitsources import SeededBits

    d, m, q, n = 3, 3, 1.0, 16
    params = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q)
    delta = 1e-3
    eps = central_epsilon(params, delta, n_honest=n - 1)
    reps = 60_000

    def views(x: int, seed: int) -> np.ndarray:
        enc = HistogramEncoder(params, metric="m", rand=SeededBits(seed))
        out = np.zeros((reps, 2), dtype=np.int64)
        for r in range(reps):
            view = [*enc.indexes(x), *(v for _ in range(n - 1) for v in enc.fake_indexes())]
            out[r] = (view.count(0), view.count(1))
        return out

    p_view, q_view = views(0, 1), views(1, 2)
    best_eps = _audit(p_view, q_view, params=params, n=n, delta=delta, eps=eps)
    assert best_eps <= eps
    assert best_eps >= 0.4 * eps, (best_eps, eps)  # it has teeth (0.51 with these seeds)


@settings(max_examples=40, deadline=None)
@given(
    eps=st.floats(0.05, 3.0),
    n_honest=st.integers(0, 300),
    m=st.integers(1, 4),
    q=st.floats(0.01, 1.0),
    d=st.integers(2, 60),
)
def test_delta_is_monotone_in_epsilon_noise_and_crowd(
    eps: float, n_honest: int, m: int, q: float, d: int
) -> None:
    def f(e: float, nh: int, mm: int, qq: float) -> float:
        return fake_delta(e, n_honest=nh, fake_slots=mm, bucket_probability=qq / d)

    base = f(eps, n_honest, m, q)
    slack = 1e-12 + 1e-8 * base
    assert 0.0 <= base <= 1.0
    assert f(eps * 1.1, n_honest, m, q) <= base + slack
    assert f(eps, n_honest + 7, m, q) <= base + slack
    assert f(eps, n_honest, m + 1, q) <= base + slack
    assert f(eps, n_honest, m, min(1.0, q * 1.2)) <= base + slack


@pytest.mark.slow  # heavy: the full check runs it, scripts/check --fast does not
@settings(max_examples=15, deadline=None)
@given(q=st.floats(0.05, 1.0), frac=st.floats(0.2, 1.0))
def test_epsilon_falls_with_the_noise_rate_and_honest_share(q: float, frac: float) -> None:
    p = HistogramParams(domain_size=20, fake_slots=2, fake_probability=q)
    p2 = HistogramParams(domain_size=20, fake_slots=2, fake_probability=min(1.0, q * 1.5))

    def crowd(h: float) -> int:
        return honest_others(2000, dishonest_share(2000, h))

    e = central_epsilon(p, 1e-5, n_honest=crowd(frac))
    assert central_epsilon(p2, 1e-5, n_honest=crowd(frac)) <= e
    assert central_epsilon(p, 1e-5, n_honest=crowd(min(1.0, frac + 0.1))) <= e


def test_central_epsilon_is_on_the_safe_side_and_infinite_without_cover() -> None:
    p = HistogramParams(domain_size=1000, fake_slots=1, fake_probability=0.05)
    crowd = 10**6 - 1
    eps = central_epsilon(p, 1e-6, n_honest=crowd)
    assert (
        histogram_delta(eps, p, n_honest=crowd)
        <= 1e-6
        < histogram_delta(eps * (1 - 1e-6), p, n_honest=crowd)
    )
    # δ(ε) >= E[2^-M] for all ε: ~e^-10 here, so no ε meets δ = 1e-6
    weak = HistogramParams(domain_size=10**5, fake_slots=1, fake_probability=1.0)
    assert central_epsilon(weak, 1e-6, n_honest=crowd) == math.inf
    # no fakes: no cover at all
    none = HistogramParams(domain_size=10, fake_slots=0, fake_probability=0.0)
    assert central_epsilon(none, 1e-6, n_honest=crowd) == math.inf


def test_local_epsilon_caps_the_central_figure_and_both_are_stated() -> None:
    p = HistogramParams(domain_size=10, fake_slots=1, fake_probability=0.01, local_epsilon=0.7)
    g = histogram_guarantee(p, 1000, 1e-6)
    assert g.epsilon <= 0.7
    assert g.local_epsilon == 0.7
    no_ldp = histogram_guarantee(
        HistogramParams(domain_size=10, fake_slots=1, fake_probability=0.5), 1000, 1e-6
    )
    assert no_ldp.local_epsilon == math.inf
    assert "no guarantee" not in no_ldp.render() and "ε = ∞" in no_ldp.render()


def test_honest_fraction_validation_and_count() -> None:
    assert dishonest_share(101, 0.5) == 51  # ⌈50.5⌉: never undercounted
    assert dishonest_share(1000, 0.9) == 100  # (1 − 0.9)·1000 = 99.99999999999999
    assert honest_others(101, 51) == 49
    assert honest_others(10, 40) == 0
    g = histogram_guarantee(HistogramParams(domain_size=10, fake_slots=1, fake_probability=0.5),
                            101, 1e-6, honest_fraction=0.5)  # fmt: skip
    assert (g.n_honest, g.dishonest) == (49, 51)
    with pytest.raises(ValueError, match="honest_fraction"):
        dishonest_share(10, 1.5)


@pytest.mark.parametrize("x", [0.8962213582126424, 1.0, 0.99999, 12.3456, 1.23456e-5, 2.0000001])
def test_printed_figures_are_never_rounded_down(x: float) -> None:
    assert float(format_up(x)) >= x
    assert float(format_up(x)) <= x * (1 + 1.1e-3)
