"""Privacy of a discovery: ε0 per round, parallel groups, the ledger's total."""

from __future__ import annotations

import itertools
import math
from collections import Counter

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
    for c in rounds:
        eps_r = amplify(c.epsilon0, c.n_reports, 1e-6).epsilon
        seg = segment_to_dict(round_segment(c, 1e-6, "words-1"))
        ledger.record(
            "words",
            Release(
                release_id=f"r{c.round}",
                window=c.round,
                n_reports=c.n_reports,
                mechanism="heavy-hitters",
                epsilon=eps_r,
                delta=1e-6,
                fresh_randomness=True,
                segment=seg,
            ),
        )
    total = ledger.spent("words")
    assert total[0] == pytest.approx(discovery_guarantee(rounds, 1e-6, discovery="words-1").epsilon)
    assert total[0] < 1.5 * amplify(6.0, 40_000, 1e-6).epsilon  # not 3 rounds added up
    # a second discovery of the same metric adds (basic composition across partitions)
    c = RoundCost(round=0, group=0, n_reports=40_000, epsilon0=6.0)
    ledger.record(
        "words",
        Release(
            release_id="again",
            window=9,
            n_reports=40_000,
            mechanism="heavy-hitters",
            epsilon=amplify(6.0, 40_000, 1e-6).epsilon,
            delta=1e-6,
            fresh_randomness=True,
            segment=segment_to_dict(round_segment(c, 1e-6, "words-2")),
        ),
    )
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
