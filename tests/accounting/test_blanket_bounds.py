"""The blanket bounds: never below a lower bound, never above the generic bound where
they claim to beat it, monotone where the proof says so, and composable.

Deterministic (exact evaluations, no sampling): no false failures.
"""

from __future__ import annotations

import itertools
import math

import pytest

from crowdmix.aggregator.accounting.amplification import (
    amplify,
    amplify_randomizer,
    best_amplification,
    best_within,
    epsilon_from_profile,
)
from crowdmix.aggregator.accounting.blanket import (
    Profile,
    bins,
    bit_sum_law,
    bit_vector_given,
    krr_given,
    mixture,
)
from crowdmix.aggregator.accounting.blanket_pld import blanket_pld
from crowdmix.aggregator.accounting.history import Segment, compose_segments
from crowdmix.aggregator.accounting.local import basic_epsilon, basic_total_variation
from crowdmix.aggregator.accounting.lower_bounds import bit_vector_lower, krr_lower
from crowdmix.aggregator.accounting.pairs import ClonePair
from crowdmix.aggregator.accounting.pld import pld_lower_epsilon
from crowdmix.aggregator.accounting.randomizers import (
    BitVector,
    KaryRR,
    LocalHashing,
    randomizer_of,
)
from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams
from crowdmix.core.privacy import epsilon_inf, epsilon_one

DELTA = 1e-6


@pytest.mark.parametrize(
    ("eps0", "d", "n"),
    [(0.5, 2, 2000), (2.0, 3, 1000), (1.0, 5, 5000), (0.5, 32, 20_000), (4.0, 32, 3000)],
)
def test_krr_figure_is_between_its_lower_bound_and_the_generic_bound(
    eps0: float, d: int, n: int
) -> None:
    ours = best_amplification(eps0, n, DELTA, KaryRR(epsilon0=eps0, domain=d)).result.epsilon
    assert krr_lower(eps0, d, n, DELTA) <= ours <= amplify(eps0, n, DELTA).epsilon
    if d >= 3:  # the blanket wins, within 3% of the exact (N0, N1) of 'everyone else x2'
        assert ours < amplify(eps0, n, DELTA).epsilon
        assert ours <= 1.03 * krr_lower(eps0, d, n, DELTA)


@pytest.mark.parametrize(("eps0", "n"), [(0.5, 3000), (2.0, 3000), (4.0, 20_000)])
def test_oue_figure_is_between_its_lower_bounds_and_the_generic_bound(eps0: float, n: int) -> None:
    oue = randomizer_of(basic=BasicParams(mechanism="oue", epsilon=eps0, domain_size=8))
    ours = amplify_randomizer(oue, n, DELTA).epsilon  # type: ignore[arg-type]
    assert isinstance(oue, BitVector)
    lowers = bit_vector_lower(oue.p, oue.q, 1, n, DELTA, labelled=False)
    assert max(lowers.values()) <= ours < amplify(eps0, n, DELTA).epsilon


def test_rappor_report_figure_is_above_its_column_lower_bound() -> None:
    params = RapporParams(k=64, h=2, m=16, f=0.25, p=0.25, q=0.75)
    rand = randomizer_of(rappor=params)
    assert isinstance(rand, BitVector)
    assert rand.epsilon0 == pytest.approx(epsilon_one(params), rel=1e-12)
    ours = amplify_randomizer(rand, 200, DELTA).epsilon
    lower = bit_vector_lower(rand.p, rand.q, 2, 200, DELTA, labelled=False)["columns"]
    assert lower <= ours < amplify(epsilon_one(params), 200, DELTA).epsilon


def test_prr_randomizer_has_epsilon_inf() -> None:
    params = RapporParams(k=16, h=2, m=1, f=0.5)
    prr = randomizer_of(rappor=params, prr_only=True)
    assert isinstance(prr, BitVector)
    assert prr.epsilon0 == pytest.approx(epsilon_inf(params), rel=1e-12)
    assert randomizer_of(rappor=RapporParams(k=16, h=2, m=1, f=0.0), prr_only=True) is None


def test_blanket_delta_does_not_grow_with_the_cover() -> None:
    # δ_m(ε) is non-increasing in m (one more blanket draw is a post-processing).
    for given in (
        lambda m: krr_given(1.0, 5, m, DELTA),
        lambda m: bit_vector_given(0.3, 0.6, (2, 2), m, DELTA, {}),
        lambda m: bit_vector_given(0.25, 0.5, (1, 1), m, DELTA, {}),
    ):
        for eps in (0.05, 0.2, 0.6):
            ds = [given(m).delta(eps) for m in (0, 1, 2, 5, 10, 30, 100)]
            assert all(a >= b - 1e-15 for a, b in itertools.pairwise(ds)), ds


def test_binning_only_raises_delta() -> None:
    # Fewer bins use δ at each bin's smallest m: never below the exact mixture.
    others, gamma = 400, 5 / (math.e + 4)
    exact = mixture(others, gamma, lambda m: krr_given(1.0, 5, m, DELTA), DELTA, max_bins=10**6)
    for count in (4, 12):
        binned = mixture(
            others, gamma, lambda m: krr_given(1.0, 5, m, DELTA), DELTA, max_bins=count
        )
        for eps in (0.05, 0.15, 0.3):
            assert binned.delta(eps) >= exact.delta(eps)


def test_bins_spaced_around_the_mean_only_raise_delta() -> None:
    # A crowd whose window of m is too wide for one bin per m: the spaced bins.
    others, p = 4000, 1 / (math.e + 1)
    gamma = 0.5 / (1 - p)
    cache: dict[object, object] = {}
    edges, weights, below = bins(others, gamma, DELTA, 32)
    assert len(edges) > 20 and edges == sorted(set(edges))
    assert abs(below + sum(weights) - 1.0) < 1e-12

    def given(m: int) -> Profile:
        return bit_vector_given(p, 0.5, (1, 1), m, DELTA, cache)

    exact = mixture(others, gamma, given, DELTA, max_bins=10**6)
    binned = mixture(others, gamma, given, DELTA)
    for eps in (0.02, 0.04, 0.06):
        assert exact.delta(eps) <= binned.delta(eps) <= 1.02 * exact.delta(eps)
    tight = epsilon_from_profile(exact, DELTA, 1.0)
    assert tight <= epsilon_from_profile(binned, DELTA, 1.0) <= 1.001 * tight


def test_olh_bound_sits_between_its_g_ary_rr_and_the_generic_bound() -> None:
    # OLH with g buckets hides like g-ary RR except when the victim's hash collides.
    olh = LocalHashing(epsilon0=1.0, buckets=4)
    ours = amplify_randomizer(olh, 5000, DELTA).epsilon
    krr4 = amplify_randomizer(KaryRR(epsilon0=1.0, domain=4), 5000, DELTA).epsilon
    assert krr4 * 0.9 < ours < amplify(1.0, 5000, DELTA).epsilon


@pytest.mark.parametrize(
    "rand", [KaryRR(epsilon0=2.0, domain=5), BitVector(p=1 / (math.e**2 + 1), q=0.5, bits=1)]
)
def test_blanket_pld_dominates_one_round_and_composes_above_a_lower_bound(rand: object) -> None:
    n, rounds = 2000, 5
    pld = blanket_pld(rand, n)  # type: ignore[arg-type]
    assert pld is not None
    one = amplify_randomizer(rand, n, DELTA).epsilon  # type: ignore[arg-type]
    # The PLD's pair dominates the round: its ε is the binned bound's, up to the grid.
    assert one * 0.99 <= float(pld.get_epsilon_for_delta(DELTA)) <= one * 1.02
    if isinstance(rand, KaryRR):  # the exact (N0, N1) pair of 'everyone else x2'
        e = math.exp(rand.epsilon0)
        exact = ClonePair(p=e, alpha=1 / (e + 4), r=1 / (e + 4))
        composed = float(pld.self_compose(rounds).get_epsilon_for_delta(DELTA))
        assert pld_lower_epsilon(exact, n, rounds, DELTA) <= composed


def test_randomizers_refuse_bad_parameters() -> None:
    with pytest.raises(ValueError, match="domain"):
        KaryRR(epsilon0=1.0, domain=1)
    with pytest.raises(ValueError, match="p must be below q"):
        BitVector(p=0.6, q=0.5, bits=1)
    with pytest.raises(ValueError, match="epsilon0"):
        LocalHashing(epsilon0=-1.0, buckets=3)
    with pytest.raises(ValueError, match=r"not 1\.0"):
        best_amplification(1.0, 100, DELTA, KaryRR(epsilon0=2.0, domain=3))


@pytest.mark.parametrize(
    ("rand", "n"),
    [
        (KaryRR(epsilon0=2.0, domain=32), 20_000),
        (randomizer_of(rappor=RapporParams(k=64, h=2, m=16, f=0.25, p=0.25, q=0.75)), 464),
        (BitVector(p=0.2, q=0.8, bits=1), 3000),
    ],
)
def test_best_within_answers_as_the_best_bound_does(rand: object, n: int) -> None:
    # The planner's quick test: the same yes/no as best_amplification ≤ target, at
    # targets on, just around and far from the figure, and around the generic one.
    eps0 = rand.epsilon0  # type: ignore[attr-defined]
    ours = best_amplification(eps0, n, DELTA, rand).result.epsilon  # type: ignore[arg-type]
    generic = amplify(eps0, n, DELTA).epsilon
    assert ours < generic
    for base in (ours, generic):
        for factor in (0.5, 0.999, 1 - 2e-6, 1 - 1e-9, 1.0, 1 + 1e-9, 1 + 2e-6, 1.001, 1.5):
            target = base * factor
            quick = best_within(eps0, n, DELTA, target, rand)  # type: ignore[arg-type]
            assert quick == (ours <= target), (base, factor)
    assert best_within(eps0, n, DELTA, ours * 1.01) is False  # generic alone: above


def test_a_partitioned_single_round_uses_its_randomizers_blanket_bound() -> None:
    # Disjoint device groups (a partition) compose in parallel; one fresh round of a
    # group is bounded by the same best bound as a statement's single release.
    basic = BasicParams(mechanism="krr", epsilon=2.0, domain_size=32)
    # the ε the SDKs' float probabilities realise (within 1e-15 of 2.0): what a release
    # of the metric records as its segment's ε0 (statement.py)
    realised = basic_epsilon(basic)
    segments = [
        Segment(
            rounds=1,
            n_amplify=20_000,
            delta=DELTA,
            epsilon0=realised,
            beta=basic_total_variation(basic),
            basic=basic,
            partition="groups",
            group=g,
        )
        for g in (0, 1)
    ]
    best = best_amplification(realised, 20_000, DELTA, KaryRR(epsilon0=realised, domain=32))
    best = best.result
    assert best.bound == "blanket"
    assert compose_segments(segments).epsilon == best.epsilon < amplify(2.0, 20_000, DELTA).epsilon


@pytest.mark.parametrize(("draws", "p"), [(1, 0.2), (40, 0.3), (700, 0.125), (5000, 0.02)])
def test_two_bit_grid_from_tables_is_the_direct_log_pmf(draws: int, p: float) -> None:
    # bit_sum_points reads its two-bit grid's log-pmf terms from tables (when smaller
    # than the grid): the same floats as the direct sum, −inf where N1 > draws − N2.
    import numpy as np

    from crowdmix.aggregator.accounting.blanket import _grid_logpmf
    from crowdmix.aggregator.accounting.pairs import binom_logpmf

    n = np.arange(max(0, draws - 60), draws + 1, dtype=np.float64)
    k = np.arange(0, min(draws, 90) + 1, dtype=np.float64)  # k > n for n < draws
    table = _grid_logpmf(k, n, p, draws)
    assert table.shape == (len(n), len(k))
    assert np.array_equal(table, binom_logpmf(k[None, :], n[:, None], p))


def test_one_bit_tilted_tail_is_the_exact_binomial_tail() -> None:
    # The tilted mass outside a one-bit law's window, in closed form, against a direct
    # sum over every count (float64 is exact enough at this size), and never below it.
    import numpy as np
    from scipy import stats

    p, q, draws = 0.3, 0.5, 400
    law = bit_sum_law(1, p, q, draws, 1e-3, up=True)
    r1, r0 = q / p, (1 - q) / (1 - p)
    k = np.arange(draws + 1)
    x = r0 * draws + (r1 - r0) * k
    pmf = stats.binom.pmf(k, draws, p)
    lo, hi = (
        round((law.values[0] - r0 * draws) / (r1 - r0)),
        round((law.values[-1] - r0 * draws) / (r1 - r0)),
    )
    outside = (k < lo) | (k > hi)
    exact = float(np.sum(pmf[outside] * x[outside])) / draws
    assert exact > 0.0
    assert exact <= law.tilted_missing <= exact * (1 + 1e-5) + 1e-300


@pytest.mark.parametrize(("eps0", "n"), [(1.0, 10**6), (0.25, 10**6)])
def test_oue_is_amplified_at_a_small_delta_and_stays_above_its_lower_bound(
    eps0: float, n: int
) -> None:
    # At δ = 1e-10 and 10⁶ reports the laws' float round-off must not be charged as
    # tail (it was ~2e-9 > δ): the blanket bound applies, above the filtered lower bound.
    delta = 1e-10
    oue = BitVector(p=1 / (math.exp(eps0) + 1), q=0.5, bits=1, label="OUE")
    best = best_amplification(eps0, n, delta, oue).result
    assert best.bound == "blanket"
    lowers = bit_vector_lower(oue.p, oue.q, 1, n, delta, labelled=False)
    assert max(lowers.values()) <= best.epsilon < amplify(eps0, n, delta).epsilon
    assert best.epsilon <= 1.2 * max(lowers.values())
