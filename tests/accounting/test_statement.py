"""privacy_statement: cohort handling, batches, longitudinal arguments, output."""

from __future__ import annotations

import json
import math

import pytest

from crowdmix.aggregator.accounting import amplify, privacy_statement
from crowdmix.aggregator.accounting.amplification import best_amplification
from crowdmix.aggregator.accounting.local import (
    epsilon_inf,
    epsilon_k,
    epsilon_one,
    total_variation,
)
from crowdmix.aggregator.accounting.randomizers import randomizer_of
from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import MetricConfig, ShufflePolicy

DELTA = 1e-6
# A policy whose batches are never split below 1e8 reports: these tests then see
# one batch of n_reports, as if the caller had passed batch_sizes=[n_reports].
ONE_BATCH = ShufflePolicy(min_batch=10**8, max_batch=10**8)


def rappor_metric(m: int = 1, f: float = 0.5) -> MetricConfig:
    return MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=m, f=f), shuffle=ONE_BATCH)


def basic_metric(mechanism: str, epsilon: float, d: int = 2) -> MetricConfig:
    params = BasicParams(mechanism=mechanism, epsilon=epsilon, domain_size=d)  # type: ignore[arg-type]
    return MetricConfig(name="b", basic=params, shuffle=ONE_BATCH)


def test_single_cohort_uses_the_whole_batch_and_the_generic_bound() -> None:
    stmt = privacy_statement(rappor_metric(), 10**6, delta=DELTA)
    params = RapporParams(k=16, h=2, m=1)
    assert stmt.epsilon_local == pytest.approx(epsilon_one(params))
    assert stmt.epsilon_inf == pytest.approx(epsilon_inf(params))
    assert stmt.beta == pytest.approx(total_variation(params))
    assert stmt.central.n_amplify == 10**6
    # The RAPPOR-specific (p, β, q) figure 0.002289 was removed (not a dominating pair).
    assert stmt.central.bound == "generic"
    assert stmt.central.epsilon == pytest.approx(0.003872, abs=5e-7)
    assert stmt.central.candidates == {"generic": stmt.central.epsilon}
    assert stmt.longitudinal.argument == "single-release"


def test_persistent_cohorts_amplify_within_the_smallest_cohort() -> None:
    sizes = [400_000, 300_000, 200_000, 100_000]
    stmt = privacy_statement(rappor_metric(m=4), 10**6, delta=DELTA, cohort_sizes=sizes)
    assert stmt.central.n_amplify == 100_000
    assert stmt.smallest_cohort_share == pytest.approx(0.1)
    eps1 = epsilon_one(RapporParams(k=16, h=2, m=4))
    expected = amplify(eps1, 100_000, DELTA).epsilon
    assert stmt.central.epsilon == pytest.approx(expected, rel=1e-12)
    assert "smallest cohort" in stmt.render()
    # A share given directly means the same thing.
    by_share = privacy_statement(rappor_metric(m=4), 10**6, delta=DELTA, cohort_sizes=0.1)
    assert by_share.central.n_amplify == 100_000
    # Cohorts drawn fresh per report: no caveat, the whole batch hides each report.
    fresh = privacy_statement(
        rappor_metric(m=4), 10**6, delta=DELTA, cohort_sizes=sizes, cohort_per_report=True
    )
    assert fresh.central.n_amplify == 10**6
    assert fresh.central.epsilon < stmt.central.epsilon


def test_unknown_cohort_sizes_are_estimated_conservatively() -> None:
    stmt = privacy_statement(rappor_metric(m=64), 10**6, delta=DELTA)
    assert stmt.cohort_share_estimated
    assert stmt.central.n_amplify < 10**6 // 64
    assert stmt.to_dict()["cohorts"]["share_estimated"] is True  # type: ignore[index]


def test_empty_cohorts_are_ignored_and_bad_sizes_rejected() -> None:
    stmt = privacy_statement(rappor_metric(m=4), 1000, delta=DELTA, cohort_sizes=[0, 500, 500])
    assert stmt.central.n_amplify == 500
    with pytest.raises(ValueError, match="sum to"):
        privacy_statement(rappor_metric(m=4), 1000, cohort_sizes=[1, 2])
    with pytest.raises(ValueError, match="share"):
        privacy_statement(rappor_metric(m=4), 1000, cohort_sizes=1.5)
    with pytest.raises(ValueError, match="cohort sizes"):
        privacy_statement(rappor_metric(m=2), 3, cohort_sizes=[1, 1, 1])


def test_unknown_batches_assume_the_policys_smallest_batch() -> None:
    policy = ShufflePolicy(min_batch=5000, max_batch=50_000)
    metric = MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=1), shuffle=policy)
    stmt = privacy_statement(metric, 10**6, delta=DELTA)
    assert stmt.batch_assumed and stmt.batch_size == 5000
    assert stmt.central.n_amplify == 5000
    assert "smallest batch the shuffle policy allows (5,000 reports)" in stmt.render()
    known = privacy_statement(metric, 10**6, delta=DELTA, batch_sizes=[50_000] * 20)
    assert known.central.n_amplify == 50_000
    assert known.central.epsilon < stmt.central.epsilon
    # Fewer reports than min_batch: they can only have been one batch.
    assert privacy_statement(metric, 3000, delta=DELTA).central.n_amplify == 3000


def test_unshuffled_reports_get_local_guarantees_only() -> None:
    stmt = privacy_statement(rappor_metric(), 10**6, delta=DELTA, rounds=5, shuffled=False)
    params = RapporParams(k=16, h=2, m=1)
    assert not stmt.central.amplified and stmt.central.epsilon == epsilon_one(params)
    assert stmt.longitudinal.epsilon == pytest.approx(epsilon_k(params, 5))
    assert "not shuffled" in stmt.render()
    assert stmt.to_dict()["batch"]["shuffled"] is False  # type: ignore[index]


def test_batches_use_the_smallest_batch() -> None:
    stmt = privacy_statement(rappor_metric(), 150_000, delta=DELTA, batch_sizes=[100_000, 50_000])
    assert stmt.central.n_amplify == 50_000
    assert not stmt.batch_assumed
    assert "smallest shuffled batch" in stmt.render()
    with pytest.raises(ValueError, match="batch_sizes"):
        privacy_statement(rappor_metric(), 10, batch_sizes=[5, 4])


def test_memoised_prr_longitudinal_amplifies_eps_k_or_eps_inf() -> None:
    params = RapporParams(k=16, h=2, m=1)
    stmt = privacy_statement(rappor_metric(), 10**5, delta=DELTA, rounds=10)
    lg = stmt.longitudinal
    assert lg.rounds == 10
    assert stmt.epsilon_rounds == pytest.approx(epsilon_k(params, 10))
    assert lg.candidates["memoised-prr-k"] == pytest.approx(
        amplify(epsilon_k(params, 10), 10**5, DELTA).epsilon
    )
    # ε_∞ amplified by the best of the generic bound and the PRR's blanket bound (the
    # PRR-β (p, β, q) pair understated ε).
    prr = randomizer_of(rappor=params, prr_only=True)
    best = best_amplification(epsilon_inf(params), 10**5, DELTA, prr).result.epsilon
    assert lg.candidates["memoised-prr-inf"] == best
    assert best <= amplify(epsilon_inf(params), 10**5, DELTA).epsilon
    assert lg.argument in ("memoised-prr-k", "memoised-prr-inf")
    assert "pld-composition" not in lg.candidates  # rounds share the PRR: never composed
    assert lg.epsilon == min(lg.candidates.values())
    assert lg.epsilon >= stmt.central.epsilon
    # Many rounds: the ε_∞ argument takes over and stops growing.
    many = privacy_statement(rappor_metric(), 10**5, delta=DELTA, rounds=10**6)
    assert many.longitudinal.argument == "memoised-prr-inf"


@pytest.mark.slow  # PLD accounting: seconds, left to the full check
def test_fresh_randomness_rounds_are_composed() -> None:
    metric = basic_metric("krr", 1.0, 4)
    stmt = privacy_statement(metric, 20_000, delta=DELTA, rounds=20)
    assert stmt.epsilon_inf is None
    assert stmt.longitudinal.argument == "pld-composition"
    assert stmt.central.bound == "blanket"  # 4-ary RR's own bound beats the generic one
    assert stmt.central.epsilon < stmt.longitudinal.epsilon < 20 * stmt.central.epsilon


def test_to_dict_is_json_and_render_is_quotable() -> None:
    stmt = privacy_statement(rappor_metric(m=8), 10**5, delta=DELTA, rounds=3)
    data = json.loads(json.dumps(stmt.to_dict(), allow_nan=False))
    assert data["central"]["bound"] in ("generic", "blanket")
    assert data["central"]["bound_description"] != data["central"]["bound"]
    assert data["central"]["delta"] == DELTA
    assert data["local"]["epsilon_1"] == pytest.approx(stmt.epsilon_local)
    assert data["longitudinal"]["argument"].startswith("memoised-prr")
    assumptions = " | ".join(data["assumptions"])
    assert "the shuffler and the aggregator do not collude" in assumptions
    assert "cannot read the shuffler's store" in assumptions
    # ε0 = ε_1 counts one report per person; the memoised-PRR rounds argument needs
    # the value to stay the same (a new value gets a fresh PRR).
    assert "at most one report of this metric per collection window" in assumptions
    assert "each client's value is the same in every round" in assumptions
    assert "every round shuffles the same clients together" in assumptions
    text = stmt.render()
    assert f"{stmt.central.epsilon:.4g}" in text and "collude" in text and "3 releases" in text
    assert "each of these 3 releases satisfies" in text
    assert "that each client's value is the same in every round" in text
    single = privacy_statement(rappor_metric(m=8), 10**5, delta=DELTA).to_dict()
    assert not any("same in every round" in a for a in single["assumptions"])


def test_no_prr_gives_infinite_eps_inf_as_null() -> None:
    stmt = privacy_statement(rappor_metric(f=0.0), 10**4, delta=DELTA, rounds=2)
    assert stmt.epsilon_inf is not None and math.isinf(stmt.epsilon_inf)
    data = json.loads(json.dumps(stmt.to_dict(), allow_nan=False))
    assert data["local"]["epsilon_inf"] is None


def test_too_few_reports_say_no_amplification() -> None:
    metric = basic_metric("binary-rr", 4.0)
    stmt = privacy_statement(metric, 20, delta=DELTA)
    assert not stmt.central.amplified
    assert stmt.central.bound == "none"
    assert stmt.central.epsilon == stmt.epsilon_local
    assert "no amplification" in stmt.render()


def test_statement_input_validation() -> None:
    with pytest.raises(ValueError, match="n_reports"):
        privacy_statement(rappor_metric(), 0)
    with pytest.raises(ValueError, match="delta"):
        privacy_statement(rappor_metric(), 10, delta=0.0)
    with pytest.raises(ValueError, match="rounds"):
        privacy_statement(rappor_metric(), 10, rounds=0)


def test_large_fresh_batches_fall_back_to_optimal_composition() -> None:
    from crowdmix.aggregator.accounting.composition import compose_optimal
    from crowdmix.aggregator.accounting.pld import MAX_PLD_N

    metric = basic_metric("oue", 2.0, 8)
    n = 2 * MAX_PLD_N
    stmt = privacy_statement(metric, n, delta=DELTA, rounds=10)
    assert stmt.longitudinal.argument == "optimal-composition"
    oue = randomizer_of(basic=metric.basic)
    per_round = best_amplification(2.0, n, DELTA / 20, oue).result.epsilon
    expected = compose_optimal(per_round, DELTA / 20, 10, DELTA)
    assert stmt.longitudinal.epsilon == pytest.approx(expected, rel=1e-12)


def test_cohort_counts_within_a_smaller_batch_are_estimated_conservatively() -> None:
    policy = ShufflePolicy(min_batch=1000, max_batch=10_000)
    metric = MetricConfig(name="pages", rappor=RapporParams(k=16, h=2, m=8), shuffle=policy)
    # Measured shares over the release (smallest 1/8), applied to 1000-report batches.
    stmt = privacy_statement(metric, 80_000, delta=DELTA, cohort_sizes=[10_000] * 8)
    # The exact binomial quantile whose failure probability, over every
    # cohort of every batch, is charged to δ (mean − 5 sd failed w.p. ≈ 8·80·Φ(−5)).
    from scipy.stats import binom

    from crowdmix.aggregator.accounting.guarantees import CROWD_FAILURE

    n_amp = stmt.central.n_amplify
    failure = 8 * 80 * binom.cdf(n_amp - 1, 1000, 1 / 8)
    assert failure <= CROWD_FAILURE * DELTA
    assert 8 * 80 * binom.cdf(n_amp, 1000, 1 / 8) > CROWD_FAILURE * DELTA  # the largest such
    assert stmt.segment is not None and stmt.segment.crowd_failure == CROWD_FAILURE * DELTA
    assert stmt.central.delta == DELTA  # δ_amp + the crowd's failure probability
    assert stmt.cohort_share_estimated
    # Unknown sizes: estimated for the batch itself.
    unknown = privacy_statement(metric, 80_000, delta=DELTA)
    assert unknown.central.n_amplify < 1000 / 8


@pytest.mark.slow  # PLD accounting: seconds, left to the full check
def test_a_measured_crowd_replaces_the_estimate() -> None:
    metric = rappor_metric(m=8)
    estimated = privacy_statement(metric, 10**5, delta=DELTA, batch_sizes=[50_000, 50_000],
                                  cohort_sizes=[12_500] * 8)  # fmt: skip
    measured = privacy_statement(metric, 10**5, delta=DELTA, batch_sizes=[50_000, 50_000],
                                 cohort_sizes=[12_500] * 8, smallest_crowd=6_000)  # fmt: skip
    assert measured.central.n_amplify == 6_000
    assert estimated.central.n_amplify != 6_000  # 5 sd below 6 250
    assert "measured when the batches were counted" in measured.render()
    assert measured.to_dict()["batch"]["smallest_crowd_measured"] is True
    with pytest.raises(ValueError, match="smallest_crowd"):
        privacy_statement(metric, 10**5, delta=DELTA, batch_sizes=[10**5], smallest_crowd=0)


def test_one_report_is_one_report_not_one_reports() -> None:
    metric = MetricConfig(
        name="b",
        basic=BasicParams(mechanism="krr", epsilon=1.0, domain_size=3),
        shuffle=ShufflePolicy(min_batch=1),
    )
    text = privacy_statement(metric, 1, batch_sizes=[1]).render()
    assert "Shuffling 1 report is too few" in text and "held 1 report." in text
    assert "1 reports" not in text
    assumed = privacy_statement(metric, 1).render()
    assert "(1 report)" in assumed and "1 reports" not in assumed
