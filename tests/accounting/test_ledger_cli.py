"""Through the command line: `crowdmix report --ledger` records a release
that merges R windows as R rounds (counts file and live Redis), `crowdmix privacy
ledger FILE` shows every release with the running total, and a ledger file that
does not exist is an error wherever a ledger is read."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.counting.files import save_counts
from crowdmix.core.registry import load_registry
from tests.accounting.test_cli import run

CONFIG = """
[metrics.browser]
encoding = "krr"
epsilon = 2.0
domain = ["chrome", "firefox", "safari", "edge"]
"""

# statistical, seconds each: the full check runs them, scripts/check --fast does not
pytestmark = pytest.mark.slow


def merged_counts(tmp_path: Path) -> tuple[Path, Path]:
    """A k-RR counts file merging windows (no window named), 20 000 reports."""
    config = tmp_path / "metrics.toml"
    config.write_text(CONFIG)
    metric = load_registry(config)["browser"]
    assert metric.basic is not None
    acc = accumulator_for(metric)
    rng = np.random.default_rng(11)
    p = metric.basic.keep_probability
    true = rng.choice(4, 20_000, p=[0.6, 0.3, 0.1, 0.0])
    other = rng.integers(0, 3, true.size)
    reported = np.where(rng.random(true.size) < p, true, other + (other >= true))
    acc.add(np.zeros(true.size, dtype=np.int64), reported.astype(np.uint8)[:, None])
    counts = tmp_path / "merged.npz"
    save_counts(counts, acc, metric="browser", encoding="krr", fingerprint=metric.fingerprint)
    return counts, config


def test_counts_merging_seven_windows_are_recorded_as_seven_rounds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    counts, config = merged_counts(tmp_path)
    ledger = tmp_path / "ledger.json"
    base = ["report", "--counts", str(counts), "--config", str(config), "--metric", "browser",
            "--rounds", "7", "--no-plot", "--ledger", str(ledger)]  # fmt: skip
    # A ledger that does not exist is an error, not "nothing spent yet".
    code, _, err = run(capsys, *base, "--out", str(tmp_path / "o0"))
    assert code == 1 and "does not exist" in err and "Traceback" not in err
    assert not ledger.exists()
    code, _, err = run(capsys, *base, "--new-ledger", "--out", str(tmp_path / "o1"))
    assert code == 0, err
    privacy = json.loads((tmp_path / "o1" / "summary.json").read_text())["privacy"]
    statement = privacy["statement"]
    assert statement["longitudinal"]["rounds"] == 7
    seven = statement["longitudinal"]["epsilon"]
    assert seven > statement["central"]["epsilon"]  # once recorded as 0.333 against 1.115
    assert privacy["ledger"]["total_epsilon"] == seven and privacy["ledger"]["rounds"] == 7
    (entry,) = json.loads(ledger.read_text())["browser"]
    assert entry["rounds"] == 7 and entry["epsilon"] == seven
    assert entry["segment"]["rounds"] == 7
    # --new-ledger never restarts an existing ledger.
    code, _, err = run(capsys, *base, "--new-ledger", "--out", str(tmp_path / "o2"))
    assert code == 1 and "already exists" in err
    assert len(json.loads(ledger.read_text())["browser"]) == 1

    # `crowdmix privacy ledger FILE`: per release window, rounds, crowd, ε and the total.
    code, out, _ = run(capsys, "privacy", "ledger", str(ledger))
    assert code == 0
    assert "browser: 1 release\n" in out
    row = next(
        line for line in out.splitlines() if line.strip().startswith("browser/windows-unknown/")
    )
    assert row.split()[1:4] == ["0", "7", "1,000"]  # window, rounds, crowd (min_batch assumed)
    printed = float(out.split("total: (ε = ")[1].split(",")[0])
    assert seven <= printed <= seven * (1 + 1e-5)  # never printed smaller than it is
    # The total states the same-clients-every-round assumption.
    assert "note: the total assumes the same clients report in every round" in out
    code, out, _ = run(capsys, "privacy", "ledger", str(ledger), "--json")
    data = json.loads(out)["metrics"]["browser"]
    assert data["cumulative"]["epsilon"] == seven
    (release,) = data["releases"]
    assert release["rounds"] == 7 and release["crowd"] == 1000
    assert release["running_total"]["epsilon"] == seven
    assert any("same clients report in every round" in n for n in data["notes"])


def test_privacy_ledger_of_a_missing_file_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = tmp_path / "nope.json"
    for argv in (
        ["privacy", "ledger", str(missing)],
        ["privacy", "ledger", str(missing), "--json"],
        ["privacy", "ledger", "--file", str(missing), "--metric", "pages"],
    ):
        code, out, err = run(capsys, *argv)
        assert code == 1 and out == ""
        assert err.strip() == f"crowdmix: error: ledger file {missing} does not exist"
    code, _, err = run(capsys, "privacy", "ledger")
    assert code == 1 and "FILE" in err


def test_running_totals_never_decrease_in_the_listing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from crowdmix.aggregator.accounting import JsonFileLedgerStore, PrivacyLedger, record_release
    from crowdmix.core.basic import BasicParams
    from crowdmix.core.registry import MetricConfig

    metric = MetricConfig(
        name="pages", basic=BasicParams(mechanism="krr", epsilon=2.0, domain_size=5)
    )
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger(JsonFileLedgerStore(path))
    for i, n in enumerate((2000, 50_000, 3000)):
        record_release(ledger, metric, n, release_id=f"r{i}", window=i, batch_sizes=[n])
    code, out, _ = run(capsys, "privacy", "ledger", str(path), "--metric", "pages", "--json")
    assert code == 0
    data = json.loads(out)
    totals = [r["running_total"]["epsilon"] for r in data["releases"]]
    assert totals == sorted(totals) and totals[0] >= 0.2297
    assert all(t >= r["epsilon"] for t, r in zip(totals, data["releases"], strict=True))
    assert [r["crowd"] for r in data["releases"]] == [2000, 50_000, 3000]


def test_redis_over_seven_windows_is_seven_rounds(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, redis_url: str
) -> None:
    from crowdmix.aggregator.daemon.ingest import Ingestor
    from crowdmix.aggregator.store.redis import RedisCountStore
    from tests.service.helpers import write_registry
    from tests.service.test_report_redis import REGISTRY, TRUE, rappor_batch

    _, registry = write_registry(tmp_path, REGISTRY)
    config = registry["home"]
    rng = np.random.default_rng(7)
    # the ingestor's clock in window 206, so windows 200-206 are within retention
    ingestor = Ingestor(
        registry, RedisCountStore.from_url(redis_url), clock=lambda: 206 * registry.window_seconds
    )
    for window in range(200, 207):
        ingestor.ingest(rappor_batch(rng, config, 5000, window))
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("\n".join(TRUE) + "\n")
    ledger = tmp_path / "ledger.json"
    code, _, err = run(
        capsys, "report", "--redis", redis_url, "--metric", "home", "--candidates",
        str(candidates), "--out", str(tmp_path / "out"), "--no-plot",
        "--ledger", str(ledger), "--new-ledger",
    )  # fmt: skip
    assert code == 0, err
    statement = json.loads((tmp_path / "out" / "summary.json").read_text())["privacy"]["statement"]
    assert statement["longitudinal"]["rounds"] == 7
    (entry,) = json.loads(ledger.read_text())["home"]
    assert entry["rounds"] == 7
    assert entry["epsilon"] == statement["longitudinal"]["epsilon"]
    assert entry["epsilon"] > statement["central"]["epsilon"]
