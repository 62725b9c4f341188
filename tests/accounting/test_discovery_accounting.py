"""Privacy of a discovery: ε0 per round, parallel groups, the ledger's total."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from fractions import Fraction

import pytest

from crowdmix.aggregator.accounting import MemoryLedgerStore, PrivacyLedger, Release
from crowdmix.aggregator.accounting.amplification import (
    amplify,
    best_amplification,
    shuffled_rr_lower_bound,
)
from crowdmix.aggregator.accounting.discovery import (
    RoundCost,
    discovery_guarantee,
    plan_epsilon0,
    round_segment,
)
from crowdmix.aggregator.accounting.history import segment_to_dict
from crowdmix.aggregator.accounting.lower_bounds import krr_lower
from crowdmix.aggregator.accounting.randomizers import KaryRR


def test_planned_epsilon0_is_the_largest_that_meets_the_target() -> None:
    for n in (2_000, 150_000):
        eps0 = plan_epsilon0(n, 1.0, 1e-6)
        assert amplify(eps0, n, 1e-6).epsilon <= 1.0
        assert amplify(eps0 + 1e-3, n, 1e-6).epsilon > 1.0
    with pytest.raises(ValueError, match="positive integer"):
        plan_epsilon0(0, 1.0, 1e-6)


def test_disjoint_groups_cost_their_worst_round() -> None:
    rounds = [
        RoundCost(round=0, group=0, n_reports=100_000, epsilon0=7.0),
        RoundCost(round=1, group=1, n_reports=50_000, epsilon0=7.0),
        RoundCost(round=2, group=2, n_reports=200_000, epsilon0=8.0),
    ]
    g = discovery_guarantee(rounds, 1e-6)
    each = [amplify(c.epsilon0, c.n_reports, 1e-6).epsilon for c in rounds]
    assert g.epsilon == pytest.approx(max(each), rel=1e-12)
    assert g.delta == 1e-6 and g.local_epsilon == 8.0
    assert g.argument == "parallel over disjoint groups"
    # never below what the worst round's own mechanism needs (a valid lower bound)
    assert g.epsilon >= shuffled_rr_lower_bound(7.0, 50_000, 1e-6)


def test_rounds_sharing_a_group_compose_sequentially() -> None:
    alone = discovery_guarantee([RoundCost(round=0, group=0, n_reports=20_000, epsilon0=5.0)], 1e-6)
    shared = discovery_guarantee(
        [RoundCost(round=r, group=0, n_reports=20_000, epsilon0=5.0) for r in range(2)], 1e-6
    )
    assert shared.epsilon > alone.epsilon and shared.local_epsilon == 10.0
    assert shared.argument.endswith("sequential within each")


def test_the_ledger_total_is_the_discovery_guarantee() -> None:
    rounds = [RoundCost(round=r, group=r, n_reports=40_000 + r, epsilon0=6.0) for r in range(3)]
    ledger = PrivacyLedger(MemoryLedgerStore())

    def record(c: RoundCost, release_id: str, window: int, discovery: str) -> None:
        """The round as the round job records it: its own figure and its segment."""
        ledger.record(
            "words",
            Release(
                release_id=release_id,
                window=window,
                n_reports=c.n_reports,
                mechanism="heavy-hitters",
                epsilon=amplify(c.epsilon0, c.n_reports, 1e-6).epsilon,
                delta=1e-6,
                fresh_randomness=True,
                segment=segment_to_dict(round_segment(c, 1e-6, discovery)),
            ),
        )

    for c in rounds:
        record(c, f"r{c.round}", c.round, "words-1")
    total = ledger.spent("words")
    assert total[0] == pytest.approx(discovery_guarantee(rounds, 1e-6, discovery="words-1").epsilon)
    assert total[0] < 1.5 * amplify(6.0, 40_000, 1e-6).epsilon  # not 3 rounds added up
    # a second discovery of the same metric adds (basic composition across partitions)
    record(RoundCost(round=0, group=0, n_reports=40_000, epsilon0=6.0), "again", 9, "words-2")
    assert ledger.spent("words")[0] == pytest.approx(2 * total[0], rel=1e-9)


def _shuffled_krr(values: list[int], eps0: float, d: int) -> Counter[tuple[int, ...]]:
    """Exact law of the sorted outputs of k-RR over d values for each device."""
    p = math.exp(eps0) / (math.exp(eps0) + d - 1)
    q = (1 - p) / (d - 1)
    law: Counter[tuple[int, ...]] = Counter()
    for outs in itertools.product(range(d), repeat=len(values)):
        prob = math.prod(p if o == v else q for o, v in zip(outs, values, strict=True))
        law[tuple(sorted(outs))] += prob
    return law


def test_parallel_groups_by_exact_enumeration() -> None:
    # Two shuffled groups of 3-RR reports (sizes 3 and 2). One device of group 0 changes
    # its value; group 1 is unchanged. The joint view's exact δ at the claimed ε is at
    # most the claimed δ.
    eps0, d, delta = 2.0, 3, 0.2
    g0, g0_other = [0, 2, 2], [1, 2, 2]
    g1 = [0, 1]
    a = _shuffled_krr(g0, eps0, d)
    b = _shuffled_krr(g0_other, eps0, d)
    c = _shuffled_krr(g1, eps0, d)
    claimed = discovery_guarantee(
        [
            RoundCost(round=0, group=0, n_reports=3, epsilon0=eps0),
            RoundCost(round=1, group=1, n_reports=2, epsilon0=eps0),
        ],
        delta,
    )
    e = math.exp(claimed.epsilon)
    for x, y in ((a, b), (b, a)):
        exact = sum(
            max(0.0, x.get(o0, 0.0) * pc - e * y.get(o0, 0.0) * pc)
            for o0 in set(x) | set(y)
            for _, pc in c.items()
        )
        assert exact <= claimed.delta + 1e-12


def test_a_value_round_uses_k_rr_s_blanket_bound() -> None:
    # The value round is plain k-RR over candidates + "none": its figure is the best of
    # the generic and k-RR's blanket bound, above k-RR's own lower bound; hashed prefix
    # rounds (no domain) keep the generic bound.
    prefix = RoundCost(round=0, group=0, n_reports=60_000, epsilon0=3.0)
    value = RoundCost(round=1, group=1, n_reports=40_000, epsilon0=3.0, domain=33)
    g = discovery_guarantee([prefix, value], 1e-6)
    best = best_amplification(3.0, 40_000, 1e-6, KaryRR(epsilon0=3.0, domain=33)).result
    assert best.bound == "blanket"
    assert dict(g.per_round) == {0: amplify(3.0, 60_000, 1e-6).epsilon, 1: best.epsilon}
    assert krr_lower(3.0, 33, 40_000, 1e-6) <= best.epsilon < amplify(3.0, 40_000, 1e-6).epsilon
    assert g.epsilon == pytest.approx(max(dict(g.per_round).values()), rel=1e-12)
    generic = discovery_guarantee(
        [prefix, RoundCost(round=1, group=1, n_reports=40_000, epsilon0=3.0)], 1e-6
    )
    assert g.epsilon <= generic.epsilon


def _exp_bounds(eps: float) -> tuple[Fraction, Fraction]:
    """Rationals lo ≤ e^ε ≤ hi: a Taylor partial sum (every term ≥ 0) and it plus the
    tail bound t_{j+1}/(1 − ε/(j+2)), with the sum's terms below 2^-320 of it."""
    x, term, total, j = Fraction(eps), Fraction(1), Fraction(1), 0
    while j < 2 * x + 2 or term * 2**320 > total:
        j += 1
        term = term * x / j
        total += term
    return total, total + term * x / (j + 1) / (1 - x / (j + 2))


def test_a_round_realises_at_most_its_epsilon_and_is_charged_what_it_realises() -> None:
    """Random rounds (ε in (0, 20], prefix rounds of up to ~7·10^4 buckets, value rounds
    of up to 3,000 candidates): the keep probability every SDK draws with realises
    ln(keep·(n−1)/(1−keep)) ≤ ε, proved with rationals (keep·(n−1)/(1−keep) ≤ a lower
    bound on e^ε); it is the largest float that does (the next one is above an upper bound:
    a false failure needs e^ε within ~2^-200 of a float's boundary, p < 1e-50); and
    ``round_epsilon`` charges at most ε and at least the realised ε (50-digit log)."""
    import random

    import mpmath

    from crowdmix.aggregator.accounting.local import round_epsilon
    from crowdmix.core.discovery import PrefixRound, SymbolMap, ValueRound, next_prime

    rng = random.Random(20261127)
    sm = SymbolMap(alphabet="0123456789", max_length=6)
    below = 0
    with mpmath.workdps(50):
        for i in range(300):
            eps = rng.choice([rng.uniform(0.0, 20.0), rng.uniform(0.0, 1.0), rng.randint(1, 20)])
            eps = float(max(eps, 1e-9))
            params: PrefixRound | ValueRound
            if i % 2:
                g = next_prime(rng.choice([3, rng.randint(3, 500), rng.randint(3, 70_000)]))
                params = PrefixRound(symbols=sm, start=0, stop=2, epsilon=eps, seeds=1, buckets=g)
                n = g
            else:
                c = rng.choice([1, rng.randint(1, 40), rng.randint(1, 3000)])
                params = ValueRound(symbols=sm, epsilon=eps, candidates=tuple(map(str, range(c))))
                n = c + 1
            lo, hi = _exp_bounds(eps)
            keep = Fraction(params.keep_probability)
            ratio = keep * (n - 1) / (1 - keep)
            assert ratio <= lo, (eps, n)  # realised ≤ configured
            up = Fraction(math.nextafter(params.keep_probability, 1.0))
            assert up * (n - 1) / (1 - up) > hi, (eps, n)  # and tight
            charged = round_epsilon(params)
            realised = mpmath.log(mpmath.mpf(ratio.numerator) / ratio.denominator)
            assert realised <= mpmath.mpf(charged) <= eps, (eps, n)
            below += charged < eps
    assert below  # the charge is the realised ε where its rounding up stays below ε


def test_the_round_job_and_the_ledger_charge_the_realised_epsilon0() -> None:
    """``absorb`` costs a round at ``round_epsilon`` of its params, a value round's ledger
    segment amplifies that ε0 (the generic and the k-RR blanket bound alike), and the
    planned round's figure over min_batch stays at most the target."""
    import numpy as np

    from crowdmix.aggregator.accounting.history import compose_segments
    from crowdmix.aggregator.accounting.local import round_epsilon
    from crowdmix.aggregator.discovery import DiscoveryPlan, DiscoveryState
    from crowdmix.aggregator.discovery.job import DiscoverySettings, absorb, round_params
    from crowdmix.aggregator.discovery.simulate import (
        simulate_prefix_counts,
        simulate_value_counts,
    )
    from crowdmix.core.discovery import PrefixRound, SymbolMap, ValueRound

    plan = DiscoveryPlan(
        symbols=SymbolMap(alphabet="ab", max_length=2), spans=(3,), keep=4, candidates=4,
        seeds=8, weights=(0.5, 0.5),
    )  # fmt: skip
    settings = DiscoverySettings(plan=plan, epsilon=1.0, delta=1e-6, devices=4000, min_batch=1500)
    state, rng = DiscoveryState(), np.random.default_rng(7)
    symbols, holders = [plan.symbols.symbols("ab")], np.zeros(2000, dtype=np.int64)
    for _ in range(plan.rounds):
        params = round_params(settings, state)
        if isinstance(params, PrefixRound):
            counts = simulate_prefix_counts(params, symbols, holders, rng)
        else:
            counts = simulate_value_counts(params, symbols, holders, rng)
        outcome = absorb(settings, state, counts, crowd=settings.min_batch)
        cost = outcome.cost
        assert cost.epsilon0 == round_epsilon(params) <= params.epsilon
        stated = best_amplification(cost.epsilon0, settings.min_batch, 1e-6, cost.randomizer())
        assert stated.result.epsilon <= settings.epsilon
        seg = round_segment(cost, 1e-6, "d")
        assert seg.epsilon0 == cost.epsilon0
        if isinstance(params, ValueRound):
            krr = KaryRR(epsilon0=cost.epsilon0, domain=params.cells)
            alone = best_amplification(cost.epsilon0, cost.n_reports, 1e-6, krr)
            assert compose_segments([seg]).epsilon == alone.result.epsilon
        state = outcome.state


def test_a_round_keeps_the_true_value_at_least_as_often_as_any_other() -> None:
    """ε-LDP of n-ary RR needs both keep/q ≤ e^ε and q/keep ≤ e^ε (q = (1 − keep)/(n − 1)).
    The keep, the largest float ≤ L/(L + n − 1), can fall below 1/n when e^ε − 1 is under
    the float grid near 1/n: then q/keep > 1 realises more than a tiny ε (and the charge,
    capped at ε, is below it). Rounds refuse such an ε (below ``MIN_EPSILON`` = 2^-48); from
    it up every keep is ≥ 1/n (the ratio ≥ 1, so the realised ε is ln(ratio) ∈ [0, ε]),
    checked exactly at the smallest ε and its neighbours for n from 2 to ``MAX_CELLS``."""
    import random

    from crowdmix.core.discovery import (
        MAX_CELLS,
        MIN_EPSILON,
        SymbolMap,
        ValueRound,
        exp_lower,
        keep_probability,
        next_prime,
    )
    from crowdmix.core.errors import ParamsError

    sm = SymbolMap(alphabet="ab", max_length=2)
    n = 3  # 1/3 is not a float: the keep of ε ≈ 0 is the float below it
    for tiny in (5e-324, 1e-300, 1e-17):
        keep = Fraction(keep_probability(tiny, n))
        ratio = keep * (n - 1) / (1 - keep)
        assert ratio < 1 - Fraction(tiny)  # q/keep > 1/(1 − ε) ≥ e^ε: not ε-LDP
        with pytest.raises(ParamsError, match="epsilon"):
            ValueRound(symbols=sm, epsilon=tiny, candidates=("a", "b"))
    rng = random.Random(20261128)
    epsilons = [MIN_EPSILON, math.nextafter(MIN_EPSILON, 1.0), 2 * MIN_EPSILON, 1e-14, 1e-9]
    epsilons += [MIN_EPSILON * rng.uniform(1.0, 1e6) for _ in range(20)]
    ns = [2, 3, 5, 7, 11, 1000, next_prime(70_000), MAX_CELLS - 1, MAX_CELLS]
    ns += [rng.randint(2, MAX_CELLS) for _ in range(20)]
    for eps in epsilons:
        for n in ns:
            keep = Fraction(keep_probability(eps, n))
            assert keep * n >= 1, (eps, n)  # ratio ≥ 1: the realised ε is in [0, ε]
    ValueRound(symbols=sm, epsilon=MIN_EPSILON, candidates=("a", "b"))
    for bad in (-1.0, 0.0, math.nan, math.inf, math.nextafter(20.0, 21.0)):  # as in TypeScript
        with pytest.raises(ParamsError, match="epsilon"):
            exp_lower(bad)
