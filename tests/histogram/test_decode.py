"""crowdmix.aggregator.decode.histogram: exact formulas, seeded unbiasedness/variance/coverage;
the planner and its command."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from crowdmix.aggregator.accounting.histogram import central_epsilon, histogram_delta
from crowdmix.aggregator.accounting.histogram_plan import plan_histogram
from crowdmix.aggregator.accounting.planner import PlanError
from crowdmix.aggregator.decode.errors import NoReportsError, ParamsMismatchError
from crowdmix.aggregator.decode.histogram import count_variance, decode_histogram, histogram_counts
from crowdmix.cli import main
from crowdmix.client.histogram import HistogramEncoder
from crowdmix.core.histogram import HistogramParams
from tests.client.bitsources import SeededBits


def test_exact_estimate_with_known_and_estimated_devices() -> None:
    params = HistogramParams(domain_size=4, fake_slots=2, fake_probability=0.5)
    y = np.array([30, 10, 10, 10])  # 60 reports
    res = decode_histogram(y, params, num_devices=40)
    # fakes per value: 40·2·0.5/4 = 10
    assert np.allclose(res.estimate, [20, 0, 0, 0])
    assert np.allclose(res.std_error * 40, math.sqrt(40 * 2 * 0.125 * 0.875))
    est = decode_histogram(y, params)  # n̂ = 60/2 = 30; a = 0.25/2
    assert est.num_reports == 30
    assert np.allclose(est.proportion * 30, y - 0.125 * 60)
    for r in (res, est):
        assert np.all(r.ci_low <= r.proportion) and np.all(r.proportion <= r.ci_high)
        assert r.distribution is not None and abs(r.distribution.sum() - 1) < 1e-12


def test_bad_counts_are_refused_with_a_reason() -> None:
    params = HistogramParams(domain_size=3, fake_slots=1, fake_probability=0.5)
    with pytest.raises(ParamsMismatchError, match="expected 3"):
        decode_histogram([1, 2], params)
    with pytest.raises(ParamsMismatchError, match="non-negative"):
        decode_histogram([1, -2, 3], params)
    with pytest.raises(NoReportsError):
        decode_histogram([0, 0, 0], params)
    with pytest.raises(ParamsMismatchError, match="cannot come from"):
        decode_histogram([10, 10, 10], params, num_devices=5)  # at most 2 each
    with pytest.raises(ValueError, match="out of the domain"):
        histogram_counts([0, 3], params)


def simulate(
    c: np.ndarray, params: HistogramParams, rng: np.random.Generator, reps: int
) -> np.ndarray:
    """reps × d histograms from the mechanism's exact law."""
    d, n = c.size, int(c.sum())
    p, r = params.keep_probability, params.other_probability
    tau = d * r
    out = np.empty((reps, d), dtype=np.int64)
    for i in range(reps):
        kept = rng.binomial(c, 1 - tau) if tau else c
        real = kept + rng.multinomial(n - int(kept.sum()), np.full(d, 1 / d))
        fakes = rng.binomial(n * params.fake_slots, params.fake_probability)
        out[i] = real + rng.multinomial(fakes, np.full(d, 1 / d))
    assert p > 0
    return out


@pytest.mark.parametrize("local", [None, 1.5])
@pytest.mark.parametrize("known", [True, False])
def test_unbiased_exact_variance_and_coverage(local: float | None, known: bool) -> None:
    """4 values × 3 checks, each at <= 1e-9 (normal tails at 6.1 sd, for reps = 3000
    means of bounded terms; sample variance within ±25% is 8+ of its sds): < 2e-8 per run."""
    params = HistogramParams(domain_size=4, fake_slots=3, fake_probability=0.4, local_epsilon=local)
    c = np.array([500, 300, 200, 0])
    n = int(c.sum())
    rng = np.random.default_rng(1800 + (local is None) + 2 * known)
    reps = 3000
    ys = simulate(c, params, rng, reps)
    est = np.empty((reps, 4))
    covered = np.zeros(4)
    for i in range(reps):
        r = decode_histogram(ys[i], params, num_devices=n if known else None)
        counts = r.proportion * r.diagnostics["devices"]
        est[i] = counts
        covered += (r.ci_low * r.diagnostics["devices"] <= c) & (
            c <= r.ci_high * r.diagnostics["devices"]
        )
    var = count_variance(params, n, c, n_known=known)
    mean = est.mean(axis=0)
    assert np.all(np.abs(mean - c) <= 6.1 * np.sqrt(var / reps))
    assert np.all(np.abs(est.var(axis=0) / var - 1) <= 0.25)
    # 95% Wald intervals; coverage over 3000 runs >= 0.92 (6 sd below 0.95 at this size)
    assert np.all(covered / reps >= 0.92), covered / reps


def test_encoder_to_decoder_through_real_reports() -> None:
    params = HistogramParams(domain_size=5, fake_slots=2, fake_probability=0.5, local_epsilon=3.0)
    enc = HistogramEncoder(params, metric="m", rand=SeededBits(7))
    values = [0] * 600 + [1] * 300 + [4] * 100
    idx = [int.from_bytes(r.bits, "little") for v in values for r in enc.encode(v)]
    res = decode_histogram(histogram_counts(idx, params), params, num_devices=len(values))
    truth = np.array([600, 300, 0, 0, 100]) / 1000
    # each |z| <= 6.1: false failure <= 5 · 1.1e-9
    assert np.all(np.abs(res.proportion - truth) <= 6.1 * res.std_error)


def test_plan_meets_the_target_with_the_smallest_rate() -> None:
    plan = plan_histogram(1.0, 1e-6, 10**5, 1000, max_messages=16)
    p = plan.params
    assert plan.central_epsilon <= 1.0
    assert histogram_delta(1.0, p, n_honest=10**5 - 1) <= 1e-6
    below = HistogramParams(domain_size=1000, fake_slots=p.fake_slots,
                            fake_probability=p.fake_probability - 2**-20)  # fmt: skip
    assert histogram_delta(1.0, below, n_honest=10**5 - 1) > 1e-6
    if p.fake_slots > 1:
        fewer = HistogramParams(domain_size=1000, fake_slots=p.fake_slots - 1, fake_probability=1.0)
        assert histogram_delta(1.0, fewer, n_honest=10**5 - 1) > 1e-6
    assert plan.max_messages == 1 + p.fake_slots <= 16
    assert math.isclose(plan.std_error_count, math.sqrt(float(count_variance(p, 10**5, 0.0))))


def test_plan_auto_local_epsilon_and_refusal() -> None:
    plan = plan_histogram(1.0, 1e-6, 10**6, 1000, max_messages=4, local_epsilon="auto")
    assert plan.params.local_epsilon is not None
    assert central_epsilon(plan.params, 1e-6, n_honest=10**6 - 1) <= 1.0
    no_ldp = HistogramParams(domain_size=1000, fake_slots=plan.params.fake_slots,
                             fake_probability=plan.params.fake_probability)  # fmt: skip
    assert float(count_variance(plan.params, 10**6, 0.0)) <= 2 * float(
        count_variance(no_ldp, 10**6, 0.0)
    )
    with pytest.raises(PlanError, match="messages per device"):
        plan_histogram(1.0, 1e-6, 1000, 10**5, max_messages=3)


@pytest.mark.slow  # heavy: the full check runs it, scripts/check --fast does not
def test_cli_plan_and_check(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["privacy", "histogram", "--n", "1e6", "--domain", "1000", "--epsilon", "1",
            "--max-messages", "8", "--json"]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["central_epsilon"] <= 1.0 and out["max_messages"] <= 8
    # the README's example figures
    assert out["fake_slots"] == 1 and abs(out["fake_probability"] - 0.043) < 5e-4
    assert abs(out["expected_messages"] - 1.04) < 5e-3 and abs(out["std_error_count"] - 6.5) < 0.05
    argv = ["privacy", "histogram", "--n", "1e6", "--domain", "1000", "--fake-slots", "1",
            "--fake-probability", str(out["fake_probability"])]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "central ε = 1" in text and "ε = ∞" in text


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--epsilon", "1", "--max-messages", "2"], "needs more than 2 messages"),
        (["--fake-slots", "1"], "needs both"),
        (["--epsilon", "1"], "planning needs"),
        (["--fake-slots", "1", "--fake-probability", "2"], "fake_probability"),
        (["--epsilon", "1", "--max-messages", "8", "--honest-fraction", "2"], "honest_fraction"),
    ],
)
def test_cli_bad_input_is_one_line(
    capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main(["privacy", "histogram", "--n", "1000", "--domain", "10000", *extra]) == 1
    err = capsys.readouterr().err
    assert err.startswith("crowdmix: error: ") and message in err and err.count("\n") == 1
