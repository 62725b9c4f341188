"""``crowdmix report --redis`` for a shuffled histogram: a statement
per collection window only, never for merged windows, and never into --ledger."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.store import open_store
from crowdmix.aggregator.store.base import NO_REPORT_IDS
from crowdmix.aggregator.store.codec import describe_metric
from crowdmix.core.registry import parse_registry

TABLE = {"encoding": "shuffled-histogram", "domain": ["a", "b", "c", "d"], "fake_slots": 2}


def test_merged_windows_and_the_ledger_are_refused_one_window_is_stated(
    redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from crowdmix.cli import main

    metric = parse_registry({"metrics": {"h": TABLE | {"fake_probability": 0.25}}})["h"]
    store = open_store(redis_url)
    rng = np.random.default_rng(3)
    try:
        for window in (100, 101):
            acc = accumulator_for(metric)
            idx = rng.integers(0, 4, size=4000).astype(np.uint8).reshape(-1, 1)
            acc.add(np.zeros(4000, dtype=np.int64), idx)
            store.apply_reports(
                "h", window, rng.bytes(16), metric.fingerprint, acc, NO_REPORT_IDS,
                description=describe_metric(metric),
            )  # fmt: skip
    finally:
        store.close()
    base = ["report", "--redis", redis_url, "--metric", "h", "--no-plot"]

    assert main([*base, "--out", str(tmp_path / "all")]) != 0
    err = capsys.readouterr().err
    assert "one window at a time" in err and "Traceback" not in err
    assert not (tmp_path / "all" / "summary.json").exists()

    assert main([*base, "--windows", "100,101", "--out", str(tmp_path / "two")]) != 0
    assert "one window at a time" in capsys.readouterr().err

    ledger = tmp_path / "ledger.json"
    code = main([*base, "--windows", "100", "--out", str(tmp_path / "l"),
                 "--ledger", str(ledger), "--new-ledger"])  # fmt: skip
    assert code != 0 and "--ledger does not record" in capsys.readouterr().err
    assert not ledger.exists()

    assert main([*base, "--windows", "100", "--out", str(tmp_path / "one")]) == 0
    out = capsys.readouterr().out
    assert "shuffled histogram, 4,000 reports" in out and "no call stored twice" in out
