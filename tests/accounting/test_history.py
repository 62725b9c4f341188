"""Accounting over time never understates.

Regression tests carry independently computed figures (each fails on the code before the
fix: the ledger took min(Σε, the newest release's figure at the newest crowd));
property tests (Hypothesis, small crowds so every example is milliseconds) show
the total never decreases, is never below a single release, and equals the
homogeneous figure when releases are alike; every tightening is checked against
a valid lower bound (the exact privacy of a concrete mechanism on a concrete
data set, evaluated optimistically).
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from crowdmix.aggregator.accounting import (
    Budget,
    BudgetExceededError,
    MemoryLedgerStore,
    PrivacyLedger,
    privacy_statement,
    record_release,
)
from crowdmix.aggregator.accounting.amplification import (
    _lower_root,
    amplify,
    amplify_randomizer,
    best_amplification,
)
from crowdmix.aggregator.accounting.history import Segment, compose_segments, round_pair
from crowdmix.aggregator.accounting.local import (
    basic_total_variation,
    epsilon_inf,
    prr_total_variation,
)
from crowdmix.aggregator.accounting.pairs import ClonePair
from crowdmix.aggregator.accounting.pld import pld_lower_epsilon, shuffle_pld
from crowdmix.aggregator.accounting.randomizers import randomizer_of
from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import MetricConfig

DELTA = 1e-6


def krr(epsilon: float, d: int = 5) -> MetricConfig:
    return MetricConfig(
        name="pages", basic=BasicParams(mechanism="krr", epsilon=epsilon, domain_size=d)
    )


# --- 1. the defects, with independently computed figures ------------------------------


@pytest.mark.slow  # statistical: the full check runs it
def test_total_does_not_drop_when_a_larger_crowd_follows() -> None:
    # k-RR ε=2, d=5: release 1 at n=2,000 costs 0.2302 (5-RR's blanket bound; the
    # generic stronger clone gives 0.2720, an earlier 0.2297 came from the (p, β, q)
    # pair, which understates: the exact shuffled 5-RR needs ≥ 0.22984 there); after
    # release 2 at n=200,000 the old total read 0.0332.
    ledger = PrivacyLedger(MemoryLedgerStore())
    s1, (t1, _) = record_release(
        ledger, krr(2.0), 2000, release_id="r1", window=1, batch_sizes=[2000]
    )
    assert round(s1.central.epsilon, 4) == 0.2302  # 0.2304 before bins spaced around the mean
    assert s1.central.epsilon >= 0.22984
    assert t1 >= s1.central.epsilon
    s2, (t2, d2) = record_release(
        ledger, krr(2.0), 200_000, release_id="r2", window=2, batch_sizes=[200_000]
    )
    assert t2 >= t1 >= 0.2301  # was 0.0332
    assert t2 >= s2.central.epsilon
    # Both rounds together, each at its own crowd, cost more than either alone
    # (PLD composition: well under the basic sum) but never more than the sum.
    assert t2 > s1.central.epsilon
    assert t2 <= s1.central.epsilon + s2.central.epsilon + 1e-4
    assert d2 == DELTA
    assert ledger.spent("pages") == (t2, d2)


@pytest.mark.slow  # heavy: the full check runs it, scripts/check --fast does not
def test_total_does_not_drop_when_params_change_under_one_name() -> None:
    # Different params under one metric name: release 1 alone costs 0.2980 (blanket;
    # generic 0.3403; an earlier 0.2965 cell used the unsound (p, β, q) pair), the
    # old total after release 2 read 0.0108 (exact: 0.0110).
    ledger = PrivacyLedger(MemoryLedgerStore())
    s1, (t1, _) = record_release(
        ledger, krr(2.3), 2000, release_id="r1", window=1, batch_sizes=[2000]
    )
    assert round(s1.central.epsilon, 3) == 0.298
    _, (t2, _) = record_release(
        ledger, krr(0.9), 200_000, release_id="r2", window=2, batch_sizes=[200_000]
    )
    assert t2 >= t1 >= s1.central.epsilon  # was 0.0108


@pytest.mark.slow  # PLD accounting at n = 200,000: seconds, left to the full check
def test_budget_check_uses_the_sound_total_and_records_nothing_when_refused() -> None:
    first = privacy_statement(krr(2.0), 2000, batch_sizes=[2000]).central.epsilon
    # The old total after the second release (0.0332) would fit a budget of 0.2;
    # the first release alone already spends 0.2302.
    store = MemoryLedgerStore()
    ledger = PrivacyLedger(store, Budget(epsilon=first + 0.0005, delta=1e-5))
    record_release(ledger, krr(2.0), 2000, release_id="r1", window=1, batch_sizes=[2000])
    before = store.load("pages")
    with pytest.raises(BudgetExceededError, match="Nothing was recorded"):
        record_release(ledger, krr(2.0), 200_000, release_id="r2", window=2, batch_sizes=[200_000])
    assert store.load("pages") == before


def test_a_release_merging_windows_is_recorded_as_that_many_rounds() -> None:
    # `--rounds 7` once recorded ε 0.333 while the statement said 1.115 over 7.
    metric = MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=1))
    ledger = PrivacyLedger(MemoryLedgerStore())
    stmt, (total, _) = record_release(
        ledger, metric, 70_000, release_id="all", window=0, rounds=7, batch_sizes=[10_000] * 7
    )
    (entry,) = ledger.releases("pages")
    assert entry.rounds == 7 and stmt.longitudinal.rounds == 7
    assert entry.epsilon == stmt.longitudinal.epsilon > stmt.central.epsilon
    assert total == stmt.longitudinal.epsilon
    # Seven one-window releases of the same clients cost the same as one merging seven.
    alike = PrivacyLedger(MemoryLedgerStore())
    for w in range(7):
        _, (t, _) = record_release(
            alike, metric, 10_000, release_id=f"w{w}", window=w, batch_sizes=[10_000]
        )
    assert t == total


def test_cohort_per_report_with_a_prr_does_not_use_the_memoised_argument() -> None:
    # f > 0, m = 64, cohort drawn per report, 30 rounds: a client's reports go through
    # up to min(30, 64) cohorts whose PRRs may share coins (next test); the old
    # statement amplified one ε_∞ (0.0428), the one after it 30·ε_∞ (unproven).
    params = RapporParams(k=16, h=2, m=64)
    metric = MetricConfig(name="pages", rappor=params)
    stmt = privacy_statement(metric, 10**6, cohort_per_report=True, rounds=30)
    lg = stmt.longitudinal
    assert lg.argument == "cohort-irr"
    assert "memoised-prr-inf" not in lg.candidates and "memoised-prr-k" not in lg.candidates
    assert lg.epsilon > 0.0428
    # 30 reports, each bounded through its IRR over all k bits, amplified.
    bit = max(math.log(params.q / params.p), math.log((1 - params.p) / (1 - params.q)))
    assert lg.epsilon == pytest.approx(amplify(30 * params.k * bit, 10**6, DELTA).epsilon)
    assert "min(R, m)·ε_∞ bounds" in stmt.render()
    # One round, or one cohort, keeps the memoised argument.
    assert privacy_statement(metric, 10**6, cohort_per_report=True).longitudinal.rounds == 1
    persistent = privacy_statement(metric, 10**6, rounds=30)
    assert persistent.longitudinal.argument.startswith("memoised-prr")


def _linked_view(
    blooms: list[tuple[int, ...]], f: float, p: float, q: float
) -> dict[tuple[tuple[int, ...], ...], float]:
    """Exact distribution of one client's reports under cohorts 0 and 1 (one each),
    with PRR coins keyed by the Bloom bits (client/rappor.py): cohorts whose Bloom
    filters coincide share one PRR output."""
    import itertools

    k = len(blooms[0])
    strings = list(itertools.product((0, 1), repeat=k))

    def prr(b: tuple[int, ...], s: tuple[int, ...]) -> float:
        return math.prod(f / 2 + (1 - f) * (x == y) for x, y in zip(b, s, strict=True))

    def irr(o: tuple[int, ...], s: tuple[int, ...]) -> float:
        return math.prod(
            (q if y else p) if x else 1 - (q if y else p) for x, y in zip(o, s, strict=True)
        )

    distinct = sorted(set(blooms))
    out = {}
    for o in itertools.product(strings, repeat=2):
        total = 0.0
        for ss in itertools.product(strings, repeat=len(distinct)):
            chosen = dict(zip(distinct, ss, strict=True))
            w = math.prod(prr(b, s) for b, s in chosen.items())
            total += w * irr(o[0], chosen[blooms[0]]) * irr(o[1], chosen[blooms[1]])
        out[o] = total
    return out


@pytest.mark.parametrize(("f", "p", "q"), [(0.5, 1e-6, 1 - 1e-6), (0.9, 1e-4, 1 - 1e-4)])
def test_cohorts_sharing_prr_coins_exceed_two_epsilon_inf_and_stay_within_the_irr_bound(
    f: float, p: float, q: float
) -> None:
    # A value whose Bloom filters coincide in two cohorts (one PRR) against one whose
    # filters differ (two independent PRRs): k = 2, h = 1, both cohorts reported once.
    # The exact privacy loss of the linked pair of reports is past 2·ε_∞, so the
    # "min(R, m) independent PRRs" argument was unsound; the IRR bound holds.
    same = _linked_view([(1, 0), (1, 0)], f, p, q)
    apart = _linked_view([(1, 0), (0, 1)], f, p, q)
    loss = max(abs(math.log(same[o] / apart[o])) for o in same)
    params = RapporParams(k=2, h=1, m=2, f=f, p=p, q=q)
    assert loss > 2 * epsilon_inf(params)
    # One client alone (n = 1: nothing to hide among), two rounds.
    seg = Segment(
        rounds=2,
        n_amplify=1,
        delta=DELTA,
        epsilon0=0.0,
        beta=0.0,
        rappor=params,
        cohort_per_report=True,
    )
    composed = compose_segments([seg])
    assert composed.argument == "cohort-irr"
    assert composed.epsilon >= loss


def test_prrs_with_shared_coins_and_different_f_are_refused() -> None:
    from crowdmix.aggregator.accounting import UnboundedReleaseError

    ledger = PrivacyLedger(MemoryLedgerStore())
    a = MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=1, f=0.5))
    b = MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=1, f=0.25))
    record_release(ledger, a, 10_000, release_id="a", window=1)
    with pytest.raises(UnboundedReleaseError, match="share their PRR coins"):
        record_release(ledger, b, 10_000, release_id="b", window=2)
    assert len(ledger.releases("pages")) == 1


def test_a_change_of_m_is_not_one_memoised_prr() -> None:
    # m = 8 then m = 16, unshuffled, f = 0.5: the ledger read 4.394
    # (= one ε_∞) for both although clients that change cohort get a new Bloom filter
    # and a new PRR (two independent PRRs reach 2·ε_∞ = 8.79). The clients that keep
    # their cohort share the PRR coins, so no bound is claimed: refused.
    from crowdmix.aggregator.accounting import UnboundedReleaseError
    from crowdmix.aggregator.accounting.history import _prr_key

    a = MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=8, f=0.5))
    b = MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=16, f=0.5))
    ledger = PrivacyLedger(MemoryLedgerStore())
    _, (t1, _) = record_release(ledger, a, 1000, release_id="a", window=1, shuffled=False)
    assert round(t1, 4) == 1.0743  # one unshuffled report: ε_1
    with pytest.raises(UnboundedReleaseError, match="share their PRR coins"):
        record_release(ledger, b, 1000, release_id="b", window=2, shuffled=False)
    assert len(ledger.releases("pages")) == 1 and ledger.spent("pages")[0] == t1
    # m is in the grouping key; with f = 0 (no PRR coins) the two m add up.
    seg = privacy_statement(a, 1000, shuffled=False).segment
    assert seg is not None and _prr_key(seg)[-1] == 8
    a0 = MetricConfig(name="q", rappor=RapporParams(k=16, h=2, m=8, f=0.0))
    b0 = MetricConfig(name="q", rappor=RapporParams(k=16, h=2, m=16, f=0.0))
    fresh = PrivacyLedger(MemoryLedgerStore())
    _, (u1, _) = record_release(fresh, a0, 1000, release_id="a", window=1, shuffled=False)
    _, (u2, _) = record_release(fresh, b0, 1000, release_id="b", window=2, shuffled=False)
    assert u2 > 1.99 * u1  # two rounds of fresh randomness (PLD at δ: a hair under 2·ε_1)


def test_prr_parameter_changes_sharing_coins_are_refused() -> None:
    # (h=1, f=0.5) then (h=2, f=0.25) under one metric was accepted
    # and basic-composed (0.2267), though the h = 1 filter is inside the h = 2 one
    # (equal for ~1/k of values) and the PRR coins depend only on the Bloom bytes.
    from crowdmix.aggregator.accounting import UnboundedReleaseError

    c = MetricConfig(name="q", rappor=RapporParams(k=16, h=1, m=1, f=0.5))
    d = MetricConfig(name="q", rappor=RapporParams(k=16, h=2, m=1, f=0.25))
    ledger = PrivacyLedger(MemoryLedgerStore())
    record_release(ledger, c, 1000, release_id="c", window=1)
    with pytest.raises(UnboundedReleaseError, match="share their PRR coins"):
        record_release(ledger, d, 1000, release_id="d", window=2)
    assert len(ledger.releases("q")) == 1
    # Different k with the same byte length (k = 12 and 16: two bytes) share coins too;
    # a different byte length (k = 24) or another metric name does not.
    e = MetricConfig(name="q", rappor=RapporParams(k=12, h=1, m=1, f=0.5))
    with pytest.raises(UnboundedReleaseError, match="2-byte Bloom filters"):
        record_release(ledger, e, 1000, release_id="e", window=2)
    g = MetricConfig(name="q", rappor=RapporParams(k=24, h=1, m=1, f=0.5))
    record_release(ledger, g, 1000, release_id="g", window=2)
    assert len(ledger.releases("q")) == 2


# --- properties --------------------------------------------------------------------------


def _segment(kind: str, eps: float, n: int, rounds: int) -> Segment:
    if kind in ("krr", "oue"):
        basic = BasicParams(mechanism=kind, epsilon=eps, domain_size=5 if kind == "krr" else 8)
        return Segment(
            rounds=rounds,
            n_amplify=n,
            delta=DELTA,
            epsilon0=eps,
            beta=basic_total_variation(basic),
        )
    from crowdmix.aggregator.accounting.local import epsilon_one, total_variation

    params = RapporParams(k=16, h=1, m=1, f=0.5 if kind == "rappor" else 0.0, p=0.4, q=0.7)
    return Segment(
        rounds=rounds,
        n_amplify=n,
        delta=DELTA,
        epsilon0=epsilon_one(params),
        beta=total_variation(params),
        rappor=params,
    )


segments = st.lists(
    st.builds(
        _segment,
        st.sampled_from(["krr", "oue", "rappor", "rappor-f0"]),
        st.sampled_from([0.5, 1.0, 2.0]),
        st.sampled_from([300, 1000, 3000]),
        st.integers(1, 3),
    ),
    min_size=1,
    max_size=4,
)


# Each composition is ~0.3 s (PLD FFTs): few examples, each a whole sequence.
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segments)
# Found by Hypothesis: choosing per f = 0 group between the PLD and the memoised-k
# argument let the sum drop (0.4749 → 0.4533) when the second group joined the PLD.
@pytest.mark.slow  # heavy: the full check runs it, scripts/check --fast does not
@example([_segment("krr", 1.0, 300, 1), _segment("rappor-f0", 0.5, 300, 1),
          _segment("rappor-f0", 0.5, 300, 1)])  # fmt: skip
def test_composition_never_decreases_and_covers_every_release(segs: list[Segment]) -> None:
    alone = [compose_segments([s]) for s in segs]
    previous = 0.0
    for i in range(1, len(segs) + 1):
        total = compose_segments(segs[:i])
        # Float slack of the PLD's FFT only; the ledger's floor makes it exact.
        assert total.epsilon >= previous - 1e-9
        previous = total.epsilon
        for one in alone[:i]:
            assert total.epsilon >= one.epsilon - 1e-9
            assert total.delta >= one.delta


@pytest.mark.slow  # heavy: the full check runs it, scripts/check --fast does not
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(segments)
def test_ledger_total_never_decreases_and_is_at_least_each_release(segs: list[Segment]) -> None:
    from crowdmix.aggregator.accounting import Release
    from crowdmix.aggregator.accounting.history import segment_to_dict

    ledger = PrivacyLedger(MemoryLedgerStore())
    previous = (0.0, 0.0)
    for i, s in enumerate(segs):
        own = compose_segments([s])
        entry = Release(
            release_id=f"r{i}",
            window=i,
            n_reports=s.n_amplify,
            mechanism="test",
            epsilon=own.epsilon,
            delta=own.delta,
            fresh_randomness=s.fresh,
            rounds=s.rounds,
            segment=segment_to_dict(s),
        )
        total = ledger.record("pages", entry)
        assert total[0] >= previous[0] and total[1] >= previous[1]
        assert all(total[0] >= r.epsilon for r in ledger.releases("pages"))
        previous = total


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(["krr", "oue", "rappor", "rappor-f0"]),
    st.sampled_from([0.5, 1.0, 2.0]),
    st.sampled_from([300, 3000]),
    st.integers(2, 6),
)
@pytest.mark.slow  # statistical: the full check runs it
def test_alike_releases_equal_the_homogeneous_figure(kind: str, eps: float, n: int, k: int) -> None:
    one = _segment(kind, eps, n, 1)
    many = compose_segments([one] * k)
    merged = compose_segments([_segment(kind, eps, n, k)])
    assert many.epsilon == merged.epsilon and many.delta == merged.delta


@pytest.mark.slow  # PLD accounting: seconds, left to the full check
def test_ledger_of_alike_statements_equals_the_statement_over_all_rounds() -> None:
    metric = krr(1.0, 4)
    ledger = PrivacyLedger(MemoryLedgerStore())
    for w in range(5):
        _, total = record_release(
            ledger, metric, 20_000, release_id=f"w{w}", window=w, batch_sizes=[20_000]
        )
    stmt = privacy_statement(metric, 20_000, batch_sizes=[20_000], rounds=5)
    assert total == (stmt.longitudinal.epsilon, stmt.longitudinal.delta)


# --- 2. figures after the soundness fix, each still above a valid lower bound ----------
# The (p, β, q) variation-ratio tightenings (k-RR PLD, PRR β, OUE β) were removed: that
# pair is not a dominating pair (tests/accounting/test_exact_shuffle.py has the exact
# counterexamples). Every figure is now the generic stronger clone's.


def test_krr_rounds_compose_the_generic_pair_and_stay_above_a_lower_bound() -> None:
    # Victim 0 vs 1, everyone else holding 2: the counts (N0, N1) are a post-processing
    # of shuffled 5-RR and form this pair exactly, so its optimistic PLD is a valid
    # lower bound (not the worst case: the exact test has a worse data set).
    eps, n, rounds = 2.0, 2000, 10
    beta = basic_total_variation(BasicParams(mechanism="krr", epsilon=eps, domain_size=5))
    ours = compose_segments([Segment(rounds=rounds, n_amplify=n, delta=DELTA, epsilon0=eps,
                                     beta=beta)]).epsilon  # fmt: skip
    e = math.exp(eps)
    projected = ClonePair(p=e, alpha=1.0 / (e + 4.0), r=1.0 / (e + 4.0))
    assert pld_lower_epsilon(projected, n, rounds, DELTA) <= ours
    generic = shuffle_pld(ClonePair.stronger_clone(eps), n).self_compose(rounds)
    assert ours == float(generic.get_epsilon_for_delta(DELTA))


def test_memoised_prr_uses_the_prr_blanket_and_stays_above_a_lower_bound() -> None:
    # A proposed tightening (0.1474 → 0.1221, 7.78 → 3.56) used the PRR's own β in the
    # (p, β, q) pair, which is not a dominating pair. The PRR's blanket bound (a bit
    # vector with p = f/2, q = 1 − f/2) is proved: 0.1331 and 2.669 (2.672 before its
    # bins were spaced around the mean).
    for (h, f, n), sound in {(2, 0.5, 10**5): 0.1331, (2, 0.25, 10**4): 2.669}.items():
        params = RapporParams(k=16, h=h, m=1, f=f)
        metric = MetricConfig(name="pages", rappor=params)
        lg = privacy_statement(metric, n, batch_sizes=[n], rounds=10**6).longitudinal
        assert lg.argument == "memoised-prr-inf"
        prr = randomizer_of(rappor=params, prr_only=True)
        assert lg.epsilon == best_amplification(epsilon_inf(params), n, DELTA, prr).result.epsilon
        assert lg.epsilon < amplify(epsilon_inf(params), n, DELTA).epsilon
        assert round(lg.epsilon, 4 if f == 0.5 else 3) == sound
        # Lower bound: the victim's 2h PRR bits projected on "v0's pattern" vs
        # "v1's pattern", everyone else holding a value with disjoint bits — a
        # post-processing of the shuffled PRRs, evaluated exactly (rounded down).
        keep, flip = 1 - f / 2, f / 2
        pair = ClonePair(p=(keep / flip) ** (2 * h), alpha=flip ** (2 * h), r=(flip * keep) ** h)
        lower = _lower_root(pair.evaluate(n, DELTA), DELTA, epsilon_inf(params))
        assert 0 < lower <= lg.epsilon
        assert prr_total_variation(params) < math.tanh(epsilon_inf(params) / 2)


@pytest.mark.parametrize("n", [1000, 10_000, 100_000])
def test_oue_uses_its_blanket_bound_and_stays_above_a_lower_bound(n: int) -> None:
    eps = 2.0
    metric = MetricConfig(
        name="pages", basic=BasicParams(mechanism="oue", epsilon=eps, domain_size=8)
    )
    ours = privacy_statement(metric, n, batch_sizes=[n]).central
    assert ours.bound == "blanket"
    assert ours.epsilon == amplify_randomizer(randomizer_of(basic=metric.basic), n, DELTA).epsilon
    assert ours.epsilon < amplify(eps, n, DELTA).epsilon
    # OUE, victim holding x vs x', everyone else another value w: keep the reports
    # whose w-bit is 0, then count bits (x, x') = (1, 0) and (0, 1) — a post-processing
    # of the shuffled output forming this pair exactly (the reviewer's filtered bound).
    q = 1.0 / (math.exp(eps) + 1.0)
    pair = ClonePair(p=math.exp(eps), alpha=(1 - q) * q / 2, r=0.5 * q * (1 - q))
    assert _lower_root(pair.evaluate(n, DELTA), DELTA, eps) <= ours.epsilon


def test_round_pair_is_always_the_generic_stronger_clone() -> None:
    assert round_pair(1.0) == ClonePair.stronger_clone(1.0)


# --- lower-severity points ---------------------------------------------------------------


def test_lower_uses_the_largest_known_lower_bound(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from crowdmix.cli import main

    # Binary RR beats 3-RR at ε0 = 0.5, n = 1e3 (exact: 0.0569 vs 0.0527).
    assert main(["privacy", "amplify", "--epsilon0", "0.5", "--n", "1e3", "--lower", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert round(out["lower_bounds"]["binary-rr"], 4) == 0.0569
    assert round(out["lower_bounds"]["krr3"], 4) == 0.0527
    assert out["rr_lower_bound"] == out["lower_bounds"]["binary-rr"]
    assert out["epsilon"] >= out["rr_lower_bound"]


@pytest.mark.slow  # two whole plans: seconds, left to the full check
def test_planner_enforces_meets_target(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    from crowdmix.aggregator.accounting import PlanError, plan, statement

    assert plan(0.1, 1e-6, 10**5, 50).meets_target
    # Whatever the search proposes, a plan whose stated figures miss the target is
    # never returned: make the statement it is checked against 10× worse.
    real = statement.privacy_statement

    def worse(*args: object, **kwargs: object) -> statement.PrivacyStatement:
        stmt = real(*args, **kwargs)  # type: ignore[arg-type]
        central = dataclasses.replace(stmt.central, epsilon=10 * stmt.central.epsilon)
        return dataclasses.replace(stmt, central=central)

    monkeypatch.setattr(statement, "privacy_statement", worse)
    with pytest.raises(PlanError, match="fed back through the privacy statement"):
        plan(0.1, 1e-6, 10**5, 50)


def test_rappor_md5_statement_names_the_secret_entropy_assumption() -> None:
    params = RapporParams(k=16, h=2, m=1)
    md5 = MetricConfig(name="pages", rappor=params, hashing="rappor-md5")
    text = privacy_statement(md5, 10**4).render()
    assert "HMAC-SHA256 keyed by the secret" in text and "voids ε_∞" in text
    plain = MetricConfig(name="pages", rappor=params)
    assert "HMAC" not in privacy_statement(plain, 10**4).render()
