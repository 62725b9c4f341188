"""Binary RR's own shuffle bound against the real shuffled mechanism.

Tiny batches are enumerated exactly: every data set (n = 1…8; the victim's bit 1 vs 0, every
count a of the others holding 1), every one of the 2^n report vectors, and the
shuffled output (the sorted reports). The bound's δ at ε must be at least the exact
δ of every data set in both directions, and at the ε it publishes the exact δ of every
data set must be at most δ. Deterministic (no sampling): no false failures. The
enumeration sums floats: its own error (≤ 1e-13 here) is the comparisons' margin.
A cell bound is also checked against exact rationals with no margin, cells of several a
against each a (n = 100, 200, where an interior a is worst), and coverage by a stand-in
bound that leaks at one a only: wherever that a is, nothing below ε0 may be published.
"""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest

from crowdmix.aggregator.accounting import privacy_statement
from crowdmix.aggregator.accounting.amplification import best_amplification, best_within
from crowdmix.aggregator.accounting.binary_rr import (
    binary_rr_delta,
    binary_rr_epsilon,
    config_delta,
)
from crowdmix.aggregator.accounting.lower_bounds import krr_lower
from crowdmix.aggregator.accounting.randomizers import KaryRR
from crowdmix.core.basic import BasicParams
from crowdmix.core.registry import MetricConfig, ShufflePolicy

MARGIN = 1e-13  # the enumeration's own float error, far above what it can reach
EPS0S = (0.25, 0.5, 1.0, 2.0, 4.0)


def shuffled_outputs(
    victim: int, ones: int, zeros: int, eps0: float
) -> dict[tuple[int, ...], float]:
    """The law of the sorted reports of the real mechanism: each user reports its bit
    w.p. e^ε0/(e^ε0+1), else its flip; every report vector enumerated."""
    keep = math.exp(eps0) / (math.exp(eps0) + 1.0)
    bits = [victim] + [1] * ones + [0] * zeros
    law: dict[tuple[int, ...], float] = {}
    for flips in itertools.product((False, True), repeat=len(bits)):
        pr = math.prod(1.0 - keep if f else keep for f in flips)
        out = tuple(sorted(b ^ f for b, f in zip(bits, flips, strict=True)))
        law[out] = law.get(out, 0.0) + pr
    return law


def hockey(p: dict[tuple[int, ...], float], q: dict[tuple[int, ...], float], eps: float) -> float:
    e = math.exp(eps)
    return math.fsum(max(0.0, p[k] - e * q.get(k, 0.0)) for k in p)


def exact_deltas(n: int, eps0: float, eps: float) -> list[tuple[int, float, float]]:
    """(a, D(P‖Q), D(Q‖P)) for every data set: P the victim holding 1, Q holding 0."""
    out = []
    for a in range(n):
        p = shuffled_outputs(1, a, n - 1 - a, eps0)
        q = shuffled_outputs(0, a, n - 1 - a, eps0)
        out.append((a, hockey(p, q, eps), hockey(q, p, eps)))
    return out


@pytest.mark.parametrize("n", range(1, 9))
def test_every_data_set_is_below_the_bound(n: int) -> None:
    for eps0 in EPS0S:
        for frac in (0.0, 0.05, 0.2, 0.5, 0.9):
            eps = frac * eps0
            for a, up, down in exact_deltas(n, eps0, eps):
                # P‖Q with a others at 1; Q‖P is P‖Q with the bits flipped: (n−1−a, a).
                assert config_delta(eps, eps0, a, n - 1 - a, 1e-12) >= up - MARGIN
                assert config_delta(eps, eps0, n - 1 - a, a, 1e-12) >= down - MARGIN


@pytest.mark.slow
@pytest.mark.parametrize("n", range(1, 9))
def test_the_published_epsilon_holds_for_every_data_set(n: int) -> None:
    for eps0, delta in itertools.product(EPS0S, (0.3, 0.1, 0.02, 1e-3)):
        eps = binary_rr_epsilon(eps0, n, delta)
        assert eps <= eps0
        worst = max(max(up, down) for _, up, down in exact_deltas(n, eps0, eps))
        assert worst <= delta + MARGIN, (eps0, n, delta, eps, worst)
        assert binary_rr_delta(eps, eps0, n, delta) >= worst - MARGIN


def convolved_deltas(n: int, eps0: float, eps: float) -> list[float]:
    """max(D(P‖Q), D(Q‖P)) for every a: the count of ones' law by convolving the two
    binomials (the shuffled output's law, as the enumeration shows, without 2^n)."""
    import numpy as np
    from scipy import stats

    q = 1.0 / (math.exp(eps0) + 1.0)
    p, e, out = 1.0 - q, math.exp(eps), []
    for a in range(n):
        b = n - 1 - a
        f = np.convolve(
            stats.binom.pmf(np.arange(a + 1), a, p), stats.binom.pmf(np.arange(b + 1), b, q)
        )
        up, down = np.convolve(f, [q, p]), np.convolve(f, [p, q])
        out.append(max(np.maximum(up - e * down, 0).sum(), np.maximum(down - e * up, 0).sum()))
    return out


@pytest.mark.parametrize("n", (30, 200))
def test_the_published_epsilon_holds_for_every_a_at_larger_n(n: int) -> None:
    for eps0, delta in itertools.product((0.5, 2.0, 4.0), (1e-2, 1e-6)):
        eps = binary_rr_epsilon(eps0, n, delta)
        assert max(convolved_deltas(n, eps0, eps)) <= delta + MARGIN, (eps0, n, delta, eps)


def test_an_interior_data_set_can_leak_more_than_the_extremes() -> None:
    # Why every a is covered: at n = 8, ε0 = 2, some others holding 1 leak 1.23× more
    # (total variation) than everyone else holding 0, or everyone 1.
    rows = exact_deltas(8, 2.0, 0.0)
    extremes = max(rows[0][1], rows[0][2], rows[-1][1], rows[-1][2])
    interior = max(max(up, down) for _, up, down in rows[1:-1])
    assert interior > 1.2 * extremes


@pytest.mark.slow
@pytest.mark.parametrize("eps0", (0.25, 1.0, 4.0))
@pytest.mark.parametrize("n", (10, 100, 1_000, 10_000, 100_000))
def test_never_below_the_lower_bound_and_within_two_percent(eps0: float, n: int) -> None:
    for delta in (1e-6, 1e-10):
        ours = binary_rr_epsilon(eps0, n, delta)
        lower = krr_lower(eps0, 2, n, delta)
        assert lower <= ours <= max(1.02 * lower, lower + 1e-9) or ours == eps0


def test_bad_input_is_refused_with_its_name() -> None:
    with pytest.raises(ValueError, match="epsilon0"):
        binary_rr_epsilon(-1.0, 10, 1e-6)
    with pytest.raises(ValueError, match="n must"):
        binary_rr_epsilon(1.0, 0, 1e-6)
    with pytest.raises(ValueError, match="delta"):
        binary_rr_delta(0.1, 1.0, 10, 1.5)
    for eps in (-3.0, -0.1, math.nan, "0.5"):
        with pytest.raises(ValueError, match="epsilon must"):
            binary_rr_delta(eps, 1.0, 10, 1e-6)  # type: ignore[arg-type]


def test_binary_rr_takes_its_own_bound_everywhere() -> None:
    n, delta = 10_000, 1e-6
    rr = KaryRR(epsilon0=1.0, domain=2)
    best = best_amplification(1.0, n, delta, rr)
    assert best.result.bound == "binary-rr"
    assert best.result.epsilon == best.candidates["binary-rr"] == binary_rr_epsilon(1.0, n, delta)
    assert best.result.epsilon < best.candidates["generic"]
    eps = best.result.epsilon
    assert best_within(1.0, n, delta, eps, rr) and not best_within(1.0, n, delta, 0.999 * eps, rr)
    # other domains never take it
    assert (
        "binary-rr"
        not in best_amplification(1.0, n, delta, KaryRR(epsilon0=1.0, domain=3)).candidates
    )
    # a statement for a binary-rr metric, and for k-RR with two values
    for mechanism in ("binary-rr", "krr"):
        metric = MetricConfig(
            name="m",
            basic=BasicParams(mechanism=mechanism, epsilon=1.0, domain_size=2),
            shuffle=ShufflePolicy(min_batch=1, max_batch=10**6),
        )
        stmt = privacy_statement(metric, n, delta=delta, batch_sizes=[n])
        assert stmt.central.bound == "binary-rr"
        # ε0 is the metric's basic_epsilon (1 up to its float rounding)
        assert stmt.central.epsilon == binary_rr_epsilon(stmt.epsilon_local, n, delta)
        assert stmt.central.epsilon == pytest.approx(eps, rel=1e-6)


def exact_rational_delta(eps: float, eps0: float, ones: int, zeros: int) -> Fraction:
    """D(P‖Q) on exact rationals for the float flip probability q = 1/(e^ε0+1) the
    bound reads (p = 1 − q exactly, as the device draws it) and e one ulp below the
    float e^ε (math.exp is within an ulp, so this δ is at least the one at e^ε)."""
    q = Fraction(1.0 / (math.exp(eps0) + 1.0))
    p = 1 - q
    e = Fraction(math.nextafter(math.exp(eps), 0.0))
    f = [Fraction(1)]
    for prob in [p] * ones + [q] * zeros:  # N = Bin(ones, p) + Bin(zeros, q)
        f = [
            (f[t] if t < len(f) else 0) * (1 - prob) + (f[t - 1] * prob if t else 0)
            for t in range(len(f) + 1)
        ]
    f = [Fraction(0), *f, Fraction(0)]  # f[t + 1] = P(N = t), t = −1 … max N + 1
    total = Fraction(0)
    for t in range(len(f) - 1):  # T = V + N, the victim's V ~ Bern(p) under P
        up, down = q * f[t + 1] + p * f[t], p * f[t + 1] + q * f[t]
        total += max(Fraction(0), up - e * down)
    return total


@pytest.mark.parametrize("eps0", (0.25, 1.0, 4.0, 9.0))
def test_a_cell_bound_is_above_the_exact_rational_delta_without_margin(eps0: float) -> None:
    # No float margin: the bound must charge its own float and window errors. A window
    # that leaves out 1e-4 of a binomial makes a dropped window charge show.
    for ones, zeros in ((0, 17), (17, 0), (1, 16), (5, 11), (8, 8), (3, 0), (0, 1), (0, 0)):
        for frac in (0.0, 0.1, 0.4, 0.8):
            eps = frac * eps0
            exact = exact_rational_delta(eps, eps0, ones, zeros)
            for tail in (1e-12, 1e-4):
                bound = config_delta(eps, eps0, ones, zeros, tail)
                assert Fraction(bound) >= exact, (eps0, ones, zeros, eps, tail)


# (n, ε0, δ): an interior data set leaks most at the published ε and lies in a cell
# of several a (n > 65): a cell bound must cover each a of its cell.
INTERIOR_WORST = ((100, 2.0, 1e-3), (200, 3.0, 1e-2), (200, 1.0, 1e-2))


@pytest.mark.parametrize(("n", "eps0", "delta"), INTERIOR_WORST)
def test_cells_of_several_data_sets_bound_each_of_them(n: int, eps0: float, delta: float) -> None:
    eps = binary_rr_epsilon(eps0, n, delta)
    exact = convolved_deltas(n, eps0, eps)
    worst = max(exact)
    assert worst > max(exact[0], exact[-1]) * 1.004  # the premise: an interior a is worst
    for split_below in (0.5, 1e-2 * worst):  # no cell split; every cell split to single a
        assert binary_rr_delta(eps, eps0, n, split_below) >= worst - MARGIN


@pytest.mark.parametrize("n", (2, 3, 66, 100, 1_000))
def test_one_leaky_data_set_anywhere_keeps_epsilon_at_epsilon0(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every a in [0, n − 1] must lie in a cell that is checked: a cell bound that is
    # 1 exactly when its cell holds one chosen a (0 elsewhere) forbids every ε < ε0,
    # and the δ at any ε is that 1. (Cells split, halves and extremes alike.)
    from crowdmix.aggregator.accounting import binary_rr

    last = n - 1
    some = {0, 1, 2, 63, 64, 65, last // 3, last // 2, last - 2, last - 1, last}
    for leaky in range(n) if n <= 100 else sorted(some):

        def fake(
            eps: float, eps0: float, ones: int, zeros: int, tail: float, a: int = leaky
        ) -> float:
            return 1.0 if ones <= a <= last - zeros else 0.0

        monkeypatch.setattr(binary_rr, "config_delta", fake)
        binary_rr._epsilon.cache_clear()
        try:
            assert binary_rr_epsilon(1.0, n, 1e-6) == 1.0, leaky
            assert binary_rr_delta(0.5, 1.0, n, 1e-6) == 1.0, leaky
            assert binary_rr_delta(0.5, 1.0, n, 0.99) == 1.0, leaky
        finally:
            binary_rr._epsilon.cache_clear()


def test_a_check_that_runs_out_of_cells_publishes_nothing_below_epsilon0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Cells of several a that never fall below δ must be split to single a: at n = 1,000
    # that is past the budget of cells a check may read, and the check must then fail
    # (ε0 published), not pass on the cells it has not read.
    from crowdmix.aggregator.accounting import binary_rr

    n = 1_000

    def fake(eps: float, eps0: float, ones: int, zeros: int, tail: float) -> float:
        return 1.0 if ones < n - 1 - zeros else 0.0

    monkeypatch.setattr(binary_rr, "config_delta", fake)
    binary_rr._epsilon.cache_clear()
    try:
        assert binary_rr_epsilon(1.0, n, 1e-6) == 1.0
        assert binary_rr_delta(0.5, 1.0, n, 1e-6) == 0.0  # no budget: every single a read
    finally:
        binary_rr._epsilon.cache_clear()


@pytest.mark.parametrize("eps0", (0.25, 1.0, 4.0))
def test_the_bound_without_a_certain_crossing_nearby_is_still_a_bound(
    eps0: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With no span allowed, every crossing search ends in the fallback c1·P(N ≥ t_neg):
    # rare at the real span, so forced here, and held to the exact rationals.
    from crowdmix.aggregator.accounting import binary_rr

    monkeypatch.setattr(binary_rr, "_MAX_SPAN", 0)
    for ones, zeros in ((0, 17), (17, 0), (5, 11), (8, 8), (1, 0)):
        for frac in (0.0, 0.1, 0.4):
            eps = frac * eps0
            bound = config_delta(eps, eps0, ones, zeros, 1e-12)
            assert Fraction(bound) >= exact_rational_delta(eps, eps0, ones, zeros)
