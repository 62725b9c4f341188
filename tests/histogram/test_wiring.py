"""Shuffled histograms wired like the basic encodings: registry, GetConfig, the shuffler's
and the aggregator's refusals, counting, the SDK's per-call split, the device-count
bound and the release statement (no servers: the daemons are in tests/e2e)."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import numpy as np
import pytest

from crowdmix.aggregator.accounting.histogram import central_epsilon
from crowdmix.aggregator.accounting.histogram_crowd import honest_lower_bound
from crowdmix.aggregator.accounting.histogram_release import histogram_release
from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.counting.basic import IndexCounts
from crowdmix.aggregator.daemon.ingest import Ingestor
from crowdmix.aggregator.errors import ConfigError as AggregatorConfigError
from crowdmix.aggregator.errors import InvalidBatch
from crowdmix.aggregator.report.job import (
    PrivacyStatementError,
    ReportJob,
    privacy_figures,
    run_report,
)
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.client.device_config import from_proto
from crowdmix.client.histogram import HistogramEncoder
from crowdmix.client.report import Report
from crowdmix.client.transport import within_message_caps
from crowdmix.core.device_config import DeviceConfig, to_proto
from crowdmix.core.histogram import HistogramParams
from crowdmix.core.registry import RegistryError, parse_registry
from crowdmix.core.sealed import PublicKeySet
from crowdmix.shuffler.errors import ConfigError, InvalidRequest
from crowdmix.shuffler.intake import Intake
from crowdmix.shuffler.validation import RowsIn, check_message_cap, validate

TABLE = {
    "encoding": "shuffled-histogram",
    "domain": ["a", "b", "c", "d"],
    "fake_slots": 2,
    "fake_probability": 0.25,
    "local_epsilon": 3.0,
}


def _registry(**changes: object) -> object:
    table = {**TABLE, **changes}
    table = {k: v for k, v in table.items() if v is not None}
    return parse_registry({"metrics": {"h": table}})


def test_registry_reads_the_encoding_and_names_bad_fields() -> None:
    reg = _registry()
    metric = reg["h"]  # type: ignore[index]
    assert metric.encoding == "shuffled-histogram"
    assert metric.requires_sealing and metric.num_cohorts == 1 and metric.report_bytes == 1
    assert metric.histogram == HistogramParams(
        domain_size=4, fake_slots=2, fake_probability=0.25, local_epsilon=3.0
    )
    assert metric.domain == ("a", "b", "c", "d")
    assert metric.fingerprint == metric.histogram.fingerprint()
    for changes, needle in [
        ({"fake_slots": None}, "fake_slots is required"),
        ({"fake_probability": 1.5}, "fake_probability"),
        ({"colour": "red"}, "unknown field"),
        ({"domain_size": 7}, "disagrees"),
        ({"honest_fraction": 0.0}, "honest_fraction"),
        ({"local_epsilon": -1.0}, "local_epsilon"),
        ({"domain": None}, "domain or domain_size is required"),
    ]:
        with pytest.raises(RegistryError, match=needle) as info:
            _registry(**changes)
        assert "metric 'h'" in str(info.value)


def test_getconfig_serves_the_params_the_sdk_encodes_with() -> None:
    for local in (3.0, None):
        reg = _registry(local_epsilon=local)
        config = DeviceConfig.of(reg, PublicKeySet(()))  # type: ignore[arg-type]
        back = from_proto(to_proto(config)).metrics["h"]
        assert back.histogram == reg["h"].histogram  # type: ignore[index]
        assert back.domain == ("a", "b", "c", "d")
        assert back.fingerprint == reg["h"].fingerprint  # type: ignore[index]


def test_the_shuffler_refuses_clear_reports_and_unsealed_startup() -> None:
    reg = _registry()
    metric = reg["h"]  # type: ignore[index]
    rows = RowsIn("h", metric.fingerprint, 1, [0], b"\x01", b"\x01" * 16, window=20000)
    with pytest.raises(InvalidRequest) as info:
        validate(reg, [rows], max_reports=100)  # type: ignore[arg-type]
    assert info.value.reason == "histogram_unsealed"
    with pytest.raises(ConfigError, match="needs sealed reports"):
        Intake(reg)  # type: ignore[arg-type]


def test_the_per_call_cap_is_one_devices_reports() -> None:
    reg = _registry()
    check_message_cap(reg, {"h": 3})  # type: ignore[arg-type]  # 1 + m = 3
    with pytest.raises(InvalidRequest) as info:
        check_message_cap(reg, {"h": 4})  # type: ignore[arg-type]
    assert info.value.reason == "too_many_messages"
    assert "at most 3" in str(info.value)


def test_the_sdk_splits_a_batch_within_the_cap_in_order() -> None:
    reg = _registry()
    config = DeviceConfig.of(reg, PublicKeySet(()))  # type: ignore[arg-type]
    fp = reg["h"].fingerprint  # type: ignore[index]
    batch = [Report(metric="h", cohort=0, bits=bytes([i % 4]), params_fingerprint=fp)
             for i in range(7)]  # fmt: skip
    other = Report(metric="x", cohort=0, bits=b"\x00", params_fingerprint=1)
    now, rest = within_message_caps([*batch[:2], other, *batch[2:]], config)
    assert now == [batch[0], batch[1], other, batch[2]]
    assert rest == batch[3:]


def test_the_aggregator_refuses_without_keys_and_clear_batches(tmp_path: Path) -> None:
    reg = _registry()
    with pytest.raises(AggregatorConfigError, match="needs sealed reports"):
        Ingestor(reg, MemoryCountStore())  # type: ignore[arg-type]
    from crowdmix.aggregator.daemon.ingest import IngestBatch
    from crowdmix.aggregator.sealing.ingest import KeyFile
    from crowdmix.demo_support import demo_keys as _demo_keys

    keys = _demo_keys()
    try:
        key_file = KeyFile(str(Path(keys.name) / "keys.json"))
        ingestor = Ingestor(reg, MemoryCountStore(), keys=key_file)  # type: ignore[arg-type]
        metric = reg["h"]  # type: ignore[index]
        batch = IngestBatch(
            batch_id=b"\x01" * 16,
            metric="h",
            window=reg.window_of(time.time()),  # type: ignore[attr-defined]
            fingerprint=metric.fingerprint,
            report_bytes=1,
            count=1,
            cohorts=np.zeros(1, dtype=np.int64),
            bits=b"\x01",
            report_ids=b"\x01" * 16,
        )
        with pytest.raises(InvalidBatch) as info:
            ingestor.check_header(batch)
        assert info.value.reason == "histogram_unsealed"
        key_file.close()
    finally:
        keys.cleanup()


def test_counting_is_one_bincount_per_batch() -> None:
    metric = _registry()["h"]  # type: ignore[index]
    acc = accumulator_for(metric)
    assert isinstance(acc, IndexCounts)
    idx = np.array([0, 3, 3, 1, 3], dtype=np.uint8)
    acc.add(np.zeros(5, dtype=np.int64), idx.reshape(-1, 1))
    assert acc.ones[0].tolist() == [1, 1, 0, 3] and acc.totals.tolist() == [5]


@pytest.mark.slow
def test_honest_lower_bound_fails_at_most_at_its_rate() -> None:
    """k_low(T) > n happens with probability <= β. 400 seeded trials at β = 0.05: the
    failures are at most Bin(400, 0.05) (mean 20); P(>= 45 of them) ~ 4e-7."""
    params = HistogramParams(domain_size=8, fake_slots=3, fake_probability=0.3)
    rng = np.random.default_rng(17)
    n = 500
    totals = n + rng.binomial(n * 3, 0.3, size=400)
    failures = sum(honest_lower_bound(int(t), params, failure=0.05) > n for t in totals)
    assert failures < 45
    # and it is not vacuous: close to T/(1 + m·q) at this size
    assert honest_lower_bound(int(n * 1.9), params, failure=0.05) >= 0.9 * n


def test_honest_lower_bound_counts_dishonest_devices_at_the_cap() -> None:
    params = HistogramParams(domain_size=8, fake_slots=3, fake_probability=0.3)
    # 80 honest devices sending their minimum 1 and 20 dishonest sending 1 + m = 4 each
    total = 80 + 20 * 4
    assert honest_lower_bound(total, params, failure=1e-3, dishonest=20) <= 80
    assert honest_lower_bound(total, params, failure=1e-3, dishonest_ratio=0.25) <= 80
    # the dishonest alone can send them all: no honest device is certain
    assert honest_lower_bound(80, params, failure=1e-3, dishonest=20) == 0
    assert honest_lower_bound(7, HistogramParams(
        domain_size=8, fake_slots=0, fake_probability=0.0), failure=1e-3) == 7  # fmt: skip


@pytest.mark.slow
def test_release_never_states_less_than_the_true_crowd_and_uses_the_smallest_batch() -> None:
    params = HistogramParams(domain_size=50, fake_slots=2, fake_probability=0.4)
    n = 20_000
    total = int(n * (1 + 2 * 0.4))
    whole = histogram_release("h", params, total)
    truth = central_epsilon(params, 1e-6, n_honest=n - 1)
    assert whole.epsilon >= truth
    assert whole.n_honest <= n - 1
    split = histogram_release("h", params, total, batch_sizes=(total - 5000, 5000))
    assert split.smallest_batch == 5000 and split.epsilon > whole.epsilon
    # unknown sizes: the metric's min_batch, below which nothing is released
    floor_ = histogram_release("h", params, total, min_batch=2000)
    assert floor_.smallest_batch == 2000 and floor_.epsilon >= split.epsilon
    assert whole.delta == 1e-6 and math.isclose(whole.device_failure, 1e-7)
    with pytest.raises(ValueError, match="one window at a time"):
        histogram_release("h", params, total, rounds=2)


def test_report_job_decodes_and_refuses_a_statement_for_unsealed_counts() -> None:
    metric = _registry()["h"]  # type: ignore[index]
    assert metric.histogram is not None
    enc = HistogramEncoder(metric.histogram, metric="h", domain=metric.domain)
    rnd = random.Random(4)
    acc = accumulator_for(metric)
    for _ in range(2000):
        reports = enc.encode(rnd.choice("aab"))
        bits = np.frombuffer(b"".join(r.bits for r in reports), dtype=np.uint8)
        acc.add(np.zeros(len(reports), dtype=np.int64), bits.reshape(-1, 1))
    job = ReportJob(
        metric=metric, totals=acc.totals, ones=acc.ones, sealed=True, duplicate_reports=0
    )
    outcome = run_report(job)
    assert outcome.summary["encoding"] == "shuffled-histogram"
    assert outcome.summary["params"]["fake_slots"] == 2
    assert outcome.summary["privacy"]["statement"]["colluding_local_epsilon"] == 3.0
    assert "Shuffler + aggregator colluding: 3.000-LDP" in outcome.summary["privacy"]["text"]
    with pytest.raises(PrivacyStatementError, match="not sealed"):
        privacy_figures(metric, acc.totals, sealed=False)


REGISTRY_TOML = """
[metrics.h]
encoding = "shuffled-histogram"
domain = ["a", "b", "c", "d"]
fake_slots = 2
fake_probability = 0.25
local_epsilon = 3.0
[metrics.h.shuffle]
min_batch = 100
"""


def _counts_file(
    tmp_path: Path, window: int | None, duplicate_reports: int | None = 0
) -> tuple[Path, Path]:
    from crowdmix.aggregator.counting.files import save_counts

    reg_path = tmp_path / "metrics.toml"
    reg_path.write_text(REGISTRY_TOML)
    metric = parse_registry({"metrics": {"h": TABLE | {"shuffle": {"min_batch": 100}}}})["h"]
    assert metric.histogram is not None
    enc = HistogramEncoder(metric.histogram, metric="h", domain=metric.domain)
    acc = accumulator_for(metric)
    rnd = random.Random(8)
    for _ in range(3000):
        reports = enc.encode(rnd.choice("abbc"))
        bits = np.frombuffer(b"".join(r.bits for r in reports), dtype=np.uint8)
        acc.add(np.zeros(len(reports), dtype=np.int64), bits.reshape(-1, 1))
    path = tmp_path / f"counts-{window}.npz"
    save_counts(
        path, acc, metric="h", encoding=metric.encoding, fingerprint=metric.fingerprint,
        window=window, duplicate_reports=duplicate_reports,
    )  # fmt: skip
    return reg_path, path


def test_report_from_a_counts_file_one_window_only_and_no_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crowdmix.cli import main

    reg, one = _counts_file(tmp_path, window=20000)
    base = ["report", "--counts", str(one), "--config", str(reg), "--metric", "h", "--no-plot"]
    assert main([*base, "--out", str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "shuffled histogram" in printed and "colluding: 3.000-LDP" in printed
    assert "reports from an estimated" in printed
    assert (tmp_path / "out" / "results.csv").read_text().count("\n") == 5
    ledger = tmp_path / "ledger.json"
    code = main([*base, "--out", str(tmp_path / "o2"), "--ledger", str(ledger), "--new-ledger"])
    assert code == 1 and "--ledger does not record shuffled-histogram" in capsys.readouterr().err
    _, merged = _counts_file(tmp_path, window=None)
    code = main([*base[:2], str(merged), *base[3:], "--rounds", "2", "--out", str(tmp_path / "o3")])
    err = capsys.readouterr().err
    assert code == 1 and "one window at a time" in err and "Traceback" not in err


@pytest.mark.slow
def test_readme_figures_one_batch_per_window_against_batches_of_100k() -> None:
    """README: at n = 1e6, d = 1000 the plan (m = 1, q ≈ 0.043) states ε ≤ 0.999 from one
    batch, and far more from batches of 100,000 reports (the smallest: 43,090)."""
    from crowdmix.aggregator.accounting.histogram_plan import plan_histogram

    plan = plan_histogram(1.0, 0.9e-6, 1_000_000, 1000, max_messages=8, local_epsilon="auto")
    p = plan.params
    assert p.fake_slots == 1 and round(p.fake_probability, 3) == 0.043
    total = round(1_000_000 * p.expected_messages)
    one = histogram_release("h", p, total, batch_sizes=(total,))
    assert one.epsilon <= 0.999
    tenth = 100_000
    sizes = (tenth,) * (total // tenth) + (total % tenth,)
    split = histogram_release("h", p, total, batch_sizes=sizes)
    assert 4.5 < split.epsilon < 4.6 < p.local_epsilon


def test_privacy_metric_states_both_figures_and_the_generic_statement_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crowdmix.aggregator.accounting import privacy_statement
    from crowdmix.cli import main

    reg = tmp_path / "metrics.toml"
    reg.write_text(REGISTRY_TOML)
    assert main(["privacy", "metric", "--config", str(reg), "--metric", "h", "--n", "5000"]) == 0
    out = capsys.readouterr().out
    assert "shuffled histogram" in out and "colluding: 3.000-LDP" in out
    metric = parse_registry({"metrics": {"h": TABLE}})["h"]
    with pytest.raises(ValueError, match="histogram_release"):
        privacy_statement(metric, 5000)


def test_the_stored_registry_entry_keeps_the_honest_fraction() -> None:
    """A report made from the aggregator's stored entry alone (no --config) must not
    assume more honest devices than the registry did."""
    from crowdmix.aggregator.store.codec import describe_metric, metric_from_description

    metric = parse_registry({"metrics": {"h": TABLE | {"honest_fraction": 0.8}}})["h"]
    back = metric_from_description("h", describe_metric(metric))
    assert back == metric and back.honest_fraction == 0.8


@pytest.mark.slow
def test_plan_release_meets_the_target_as_stated() -> None:
    from crowdmix.aggregator.accounting.histogram_release import plan_release

    plan, stated = plan_release(1.0, 1e-6, 20_000, 120, max_messages=8, local_epsilon="auto")
    assert stated.epsilon <= 1.0 and stated.delta == 1e-6
    assert stated.local_epsilon == plan.params.local_epsilon
