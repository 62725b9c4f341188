"""The planner: its proposal, fed back through privacy_statement, meets the target."""

from __future__ import annotations

import pytest

from crowdmix.aggregator.accounting import privacy_statement
from crowdmix.aggregator.accounting.planner import PlanError, plan, std_error
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import MetricConfig


@pytest.mark.parametrize(
    ("epsilon", "n", "candidates", "rounds"),
    [(1.0, 10**6, 100, 1), (0.3, 10**5, 20, 1), (1.0, 10**6, 200, 30), (0.5, 50_000, 8, 5)],
)
def test_plan_round_trip_meets_target(epsilon: float, n: int, candidates: int, rounds: int) -> None:
    proposal = plan(epsilon, 1e-6, n, candidates, rounds=rounds)
    assert proposal.meets_target
    p = proposal.params
    assert p.k >= 1.5 * p.h * candidates or p.k == 4096
    # Fed back through the same statement a report job prints:
    metric = MetricConfig(name="planned", rappor=p)
    stmt = privacy_statement(metric, n, delta=1e-6, rounds=rounds, batch_sizes=[n])
    assert stmt.central.epsilon <= epsilon
    assert stmt.longitudinal.epsilon <= epsilon
    assert proposal.central_epsilon == stmt.central.epsilon
    assert 0 < proposal.std_error < proposal.detectable_frequency <= 1


@pytest.mark.slow  # PLD accounting: seconds, left to the full check
def test_more_reports_buy_a_smaller_error() -> None:
    small = plan(0.5, 1e-6, 50_000, 10)
    large = plan(0.5, 1e-6, 5_000_000, 10)
    assert large.std_error < small.std_error
    assert large.detectable_frequency < small.detectable_frequency


def test_std_error_formula() -> None:
    params = RapporParams(k=16, h=2, f=0.5, p=0.5, q=0.75)  # q* − p* = 0.125
    assert std_error(params, 10_000) == pytest.approx(1 / (2 * 0.125 * (2 * 10_000) ** 0.5))


def test_unreachable_and_bad_targets() -> None:
    with pytest.raises(PlanError, match="no usable signal"):
        plan(1e-4, 1e-6, 100, 10)
    with pytest.raises(ValueError, match="candidates"):
        plan(1.0, 1e-6, 1000, 0)
    with pytest.raises(ValueError, match="epsilon"):
        plan(0.0, 1e-6, 1000, 10)


def test_local_caps_are_respected_and_the_target_still_met() -> None:
    from crowdmix.core.privacy import epsilon_inf, epsilon_one

    free = plan(1.0, 1e-6, 1_000_000, 1000)
    capped = plan(1.0, 1e-6, 1_000_000, 1000, max_local_epsilon=4.0, max_epsilon_inf=8.0)
    assert epsilon_one(free.params) > 4.0  # without caps the planner trades local privacy
    assert epsilon_one(capped.params) <= 4.0 + 1e-9
    assert epsilon_inf(capped.params) <= 8.0
    assert capped.central_epsilon <= 1.0
    assert capped.std_error >= free.std_error  # privacy costs accuracy
    with pytest.raises(PlanError, match="within the local caps"):
        plan(1.0, 1e-6, 1_000_000, 1000, max_epsilon_inf=0.5)
