"""``crowdmix report --redis``: decode the aggregator's live counts, one window or several."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from crowdmix.aggregator.daemon.ingest import IngestBatch, Ingestor
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.core.hashing import bloom_int
from crowdmix.core.registry import MetricConfig
from tests.service.helpers import write_registry

REGISTRY = """
[metrics.home]
encoding = "rappor"
k = 32
h = 2
m = 16
f = 0.2
p = 0.25
q = 0.75
"""
TRUE = {"alpha": 0.4, "beta": 0.3, "gamma": 0.2, "delta": 0.1}


def rappor_batch(
    rng: np.random.Generator, config: MetricConfig, n: int, window: int
) -> IngestBatch:
    """n reports drawn exactly as devices would send them (PRR + IRR per bit)."""
    params = config.rappor
    assert params is not None
    values = list(TRUE)
    value = rng.choice(len(values), size=n, p=list(TRUE.values()))
    cohort = rng.integers(0, params.m, size=n)
    table = np.array(
        [[bloom_int(v, c, params, config.hashing) for c in range(params.m)] for v in values],
        dtype=np.uint64,
    )
    bloom = table[value, cohort]
    bit = (bloom[:, None] >> np.arange(params.k, dtype=np.uint64)[None, :]) & np.uint64(1)
    f, p, q = params.f, params.p, params.q
    p11, p01 = q * (1 - f / 2) + p * f / 2, p * (1 - f / 2) + q * f / 2
    report = rng.random((n, params.k)) < np.where(bit == 1, p11, p01)
    return IngestBatch(
        batch_id=rng.bytes(16),
        window=window,
        metric=config.name,
        fingerprint=config.fingerprint,
        count=n,
        report_bytes=params.report_bytes,
        cohorts=cohort.astype(np.int64),
        bits=np.packbits(report, axis=1, bitorder="little").tobytes(),
        report_ids=rng.bytes(16 * n),
    )


def crowdmix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crowdmix", *args], capture_output=True, text=True, timeout=120
    )


def ingest(tmp_path: Path, redis_url: str, seed: int, batches: list[int]) -> None:
    """Batches of ``home`` reports (``batches``: the window of each, 20 000 reports each)
    through the aggregator's ingest into Redis, its clock in window 101 (so windows 100
    and 101 are within retention)."""
    _, registry = write_registry(tmp_path, REGISTRY)
    rng = np.random.default_rng(seed)
    store = RedisCountStore.from_url(redis_url)
    ingestor = Ingestor(registry, store, clock=lambda: 101 * registry.window_seconds)
    for window in batches:
        ingestor.ingest(rappor_batch(rng, registry["home"], 20_000, window))


def report(
    redis_url: str, candidates: Path, out: Path, *options: str
) -> subprocess.CompletedProcess[str]:
    """``crowdmix report --redis`` of metric ``home``."""
    return crowdmix(
        "report", "--redis", redis_url, "--metric", "home", "--candidates", str(candidates),
        "--out", str(out), "--no-plot", *options,
    )  # fmt: skip


def test_report_decodes_live_counts_from_redis(tmp_path: Path, redis_url: str) -> None:
    # 60 000 reports over two windows: 20 000 in window 100, 40 000 in window 101
    ingest(tmp_path, redis_url, 2024, [100, 101, 101])
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("\n".join([*TRUE, "epsilon", "zeta"]) + "\n")

    out = tmp_path / "all"
    result = report(redis_url, candidates, out)
    assert result.returncode == 0, result.stderr
    with (out / "results.csv").open() as fh:
        rows = {r["value"]: r for r in csv.DictReader(fh)}
    # Each true value has a z-score above 10 at 60 000 reports (miss probability < 1e-6);
    # the seed is fixed, so the test is deterministic.
    significant = {v for v, r in rows.items() if r["significant"].lower() in ("true", "1", "yes")}
    assert set(TRUE) <= significant
    for value, share in TRUE.items():
        assert abs(float(rows[value]["proportion"]) - share) < 0.05
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reports"] == 60_000
    # The statement rests on the batches the aggregator saw, and two windows are
    # two releases from (possibly) the same clients.
    statement = summary["privacy"]["statement"]
    assert statement["batch"]["sizes"] == [20_000, 20_000, 20_000]
    assert statement["batch"]["smallest"] == 20_000
    assert statement["batch"]["assumed_min_batch"] is False
    assert statement["longitudinal"]["rounds"] == 2
    assert statement["batch"]["smallest_crowd_measured"] is True

    one = tmp_path / "one"
    result = report(redis_url, candidates, one, "--windows", "100")
    assert result.returncode == 0, result.stderr
    summary = json.loads((one / "summary.json").read_text())
    assert summary["reports"] == 20_000
    assert summary["privacy"]["statement"]["batch"]["sizes"] == [20_000]
    assert summary["privacy"]["statement"]["longitudinal"]["rounds"] == 1


def test_report_redis_errors_are_messages(tmp_path: Path, redis_url: str) -> None:
    out = str(tmp_path / "out")
    result = crowdmix("report", "--redis", redis_url, "--out", out)
    assert result.returncode == 1 and "--metric" in result.stderr
    result = crowdmix("report", "--redis", redis_url, "--metric", "nothing", "--out", out)
    assert result.returncode == 1 and "no counts stored" in result.stderr
    result = crowdmix(
        "report", "--redis", redis_url, "--metric", "x", "--windows", "a-b", "--out", out
    )
    assert result.returncode == 1 and "windows" in result.stderr
    assert "Traceback" not in result.stderr


def test_report_records_releases_in_a_ledger_and_refuses_one_over_budget(
    tmp_path: Path, redis_url: str
) -> None:
    ingest(tmp_path, redis_url, 7, [100, 101])
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("\n".join(TRUE) + "\n")
    ledger = tmp_path / "ledger.json"

    def release(window: str, out: str, *budget: str) -> subprocess.CompletedProcess[str]:
        return report(
            redis_url, candidates, tmp_path / out, "--windows", window, "--ledger", str(ledger),
            *budget,
        )  # fmt: skip

    first = release("100", "w100", "--budget-epsilon", "10", "--new-ledger")
    assert first.returncode == 0, first.stderr
    summary = json.loads((tmp_path / "w100" / "summary.json").read_text())
    assert summary["privacy"]["ledger"]["recorded"] is True
    assert summary["privacy"]["ledger"]["releases"] == 1
    spent = summary["privacy"]["ledger"]["total_epsilon"]
    assert 0 < spent < 10

    again = release("100", "again", "--budget-epsilon", "10")  # same release: no new cost
    assert again.returncode == 0, again.stderr
    assert (
        json.loads((tmp_path / "again" / "summary.json").read_text())["privacy"]["ledger"][
            "releases"
        ]
        == 1
    )

    before = ledger.read_bytes()
    refused = release("101", "w101", "--budget-epsilon", str(spent * 1.0001))
    assert refused.returncode == 1
    assert "release refused by the ledger" in refused.stderr
    assert ledger.read_bytes() == before  # nothing recorded
    assert not (tmp_path / "w101" / "summary.json").exists()  # nothing published
