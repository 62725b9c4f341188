"""Basic mechanisms: the closed-form estimators are unbiased, their stated
variances match, and 95% intervals cover ~95% (seeded; false-failure
probabilities in each test)."""

from __future__ import annotations

import numpy as np
import pytest

from crowdmix.aggregator.counting.basic import OlhSupportCounts
from crowdmix.aggregator.decode import NoReportsError, ParamsMismatchError
from crowdmix.aggregator.decode.basic import decode_basic, project_to_simplex, support_probabilities
from crowdmix.client.basic import BasicEncoder
from crowdmix.core.basic import OLH_PRIME, BasicParams

SHARES = np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04])


def simulate_supports(
    params: BasicParams, n_v: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(totals[1], ones[1, ·]) drawn from the mechanism's exact output distribution."""
    n = int(n_v.sum())
    d = params.domain_size
    if params.mechanism == "binary-rr":
        ps, qs = support_probabilities(params)
        ones = rng.binomial(n_v[1], ps) + rng.binomial(n_v[0], qs)
        return np.array([n]), np.array([[ones]])
    if params.mechanism == "krr":
        p = params.keep_probability
        out = np.zeros(d, dtype=np.int64)
        for v in range(d):
            probs = np.full(d, (1 - p) / (d - 1))
            probs[v] = p
            out += rng.multinomial(n_v[v], probs)
        return np.array([n]), out[None, :]
    if params.mechanism == "oue":
        q = params.oue_q
        return np.array([n]), (rng.binomial(n_v, 0.5) + rng.binomial(n - n_v, q))[None, :]
    # OLH: draw (a, b) and the k-RR'd bucket exactly as client.basic does, count for real.
    g = params.olh_buckets
    x = np.repeat(np.arange(d), n_v)
    a = rng.integers(1, OLH_PRIME, n, dtype=np.int64)
    b = rng.integers(0, OLH_PRIME, n, dtype=np.int64)
    h = ((a * x + b) % OLH_PRIME) % g
    keep = rng.random(n) < params.keep_probability
    other = rng.integers(0, g - 1, n)
    y = np.where(keep, h, other + (other >= h))
    payload = np.zeros((n, params.report_bytes), dtype=np.uint8)
    payload[:, :4] = a.astype("<u4").view(np.uint8).reshape(n, 4)
    payload[:, 4:8] = b.astype("<u4").view(np.uint8).reshape(n, 4)
    payload[:, 8] = y
    acc = OlhSupportCounts(d, g)
    acc.add(np.zeros(n, dtype=np.int64), payload)
    return acc.totals, acc.ones


@pytest.mark.parametrize(
    ("mechanism", "epsilon", "reps", "n"),
    [
        ("binary-rr", 1.0, 3000, 4000),
        ("krr", 1.5, 3000, 4000),
        ("oue", 1.0, 3000, 4000),
        ("olh", 1.5, 400, 3000),
    ],
)
def test_estimators_are_unbiased_with_stated_variance_and_coverage(
    mechanism: str, epsilon: float, reps: int, n: int
) -> None:
    # Per value: |mean error| < 5.5 standard errors of the mean (two-sided
    # 4e-8, ×6 values ≈ 2e-7); empirical/stated variance within ±25% (>= 6 sd
    # of the variance ratio for reps >= 400); coverage of reps·d nominal-95%
    # intervals within ±5.3 binomial sd of 95% (~1e-7).
    d = 2 if mechanism == "binary-rr" else SHARES.size
    params = BasicParams(mechanism=mechanism, epsilon=epsilon, domain_size=d)  # type: ignore[arg-type]
    shares = np.array([0.3, 0.7]) if d == 2 else SHARES
    rng = np.random.default_rng(4242 + d + reps + len(mechanism))
    errs = np.empty((reps, d))
    stated = np.empty((reps, d))
    covered = 0
    for r in range(reps):
        n_v = rng.multinomial(n, shares)
        totals, ones = simulate_supports(params, n_v, rng)
        res = decode_basic(totals, ones, params, correction="none")
        truth = n_v / n
        errs[r] = res.proportion - truth
        stated[r] = res.std_error**2
        covered += int(np.sum((res.ci_low <= truth) & (truth <= res.ci_high)))
    sem = errs.std(axis=0, ddof=1) / np.sqrt(reps)
    assert np.all(np.abs(errs.mean(axis=0)) < 5.5 * sem)
    ratio = errs.var(axis=0) / stated.mean(axis=0)
    assert np.all((ratio > 0.75) & (ratio < 1.25)), ratio
    total = reps * d
    sd = np.sqrt(total * 0.05 * 0.95)
    assert abs((total - covered) - 0.05 * total) < 5.3 * sd, covered / total


def test_encoder_payloads_decode_to_the_truth() -> None:
    # Real encoder + real accumulator, one seed-free run of 3000 OUE reports of
    # value 2 only: value 2's estimate is within 6 se of 1 (false failure 2e-9).
    from crowdmix.aggregator.counting import accumulator_for
    from crowdmix.core.registry import MetricConfig

    metric = MetricConfig(name="m", basic=BasicParams(mechanism="oue", epsilon=2.0, domain_size=5))
    assert metric.basic is not None
    enc = BasicEncoder(metric.basic, metric="m")
    payload = b"".join(enc.randomize(2) for _ in range(3000))
    acc = accumulator_for(metric)
    acc.add(np.zeros(3000, dtype=np.int64), np.frombuffer(payload, np.uint8).reshape(3000, -1))
    res = decode_basic(acc.totals, acc.ones, metric.basic, ["a", "b", "c", "d", "e"])
    assert abs(res.proportion[2] - 1.0) < 6 * res.std_error[2]
    assert res.values[2] == "c" and res.significant[2]


def test_simplex_projection() -> None:
    x = project_to_simplex([0.5, 0.7, -0.1])
    assert x.sum() == pytest.approx(1.0) and np.all(x >= 0)
    np.testing.assert_allclose(x, [0.4, 0.6, 0.0])
    np.testing.assert_allclose(project_to_simplex([0.2, 0.3, 0.5]), [0.2, 0.3, 0.5])
    params = BasicParams(mechanism="krr", epsilon=1.0, domain_size=3)
    res = decode_basic([1000], [[500, 450, 50]], params, project=True)
    assert res.proportion.sum() == pytest.approx(1.0) and np.all(res.proportion >= 0)


def test_bad_basic_input() -> None:
    params = BasicParams(mechanism="krr", epsilon=1.0, domain_size=3)
    with pytest.raises(NoReportsError):
        decode_basic([0], [[0, 0, 0]], params)
    with pytest.raises(ParamsMismatchError, match="ones"):
        decode_basic([10], [[1, 2]], params)
    with pytest.raises(ParamsMismatchError, match="between 0"):
        decode_basic([10], [[1, 2, 11]], params)
    with pytest.raises(ParamsMismatchError, match="value names"):
        decode_basic([10], [[1, 2, 3]], params, ["a"])
