"""What a release from the aggregator's live store (real Redis) says and costs:

- the ledger records a release by the windows and counts it covers, so reporting the
  same window with or without ``--windows`` (or under another ``--release-id``) is
  recorded once, and only new data is a new release;
- an exported counts file carries what the statement needs (windows, batch sizes, the
  measured crowd, sealing), so a report from it states what the live store states;
- ``"sealed"`` says what the aggregator saw: true when it opened every batch;
- ``counts list`` lists every metric, 0 where nothing is counted, windows as dates;
- a params mismatch names the field that differs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.daemon.ingest import Ingestor
from crowdmix.aggregator.sealing.ingest import KeyFile, SealedBatch
from crowdmix.aggregator.sealing.keys import KeySet, save_keyset
from crowdmix.aggregator.store.base import NO_REPORT_IDS
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.cli import main
from crowdmix.client.sealing import seal_many
from crowdmix.core.registry import Registry
from tests.service.helpers import random_batch, write_registry

WINDOW = 20_400  # 2025-11-08, daily windows


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _ingestor(registry: Registry, url: str, keys: KeyFile | None = None) -> Ingestor:
    return Ingestor(
        registry,
        RedisCountStore.from_url(url),
        clock=lambda: (WINDOW + 1) * registry.window_seconds,
        keys=keys,
    )


def _summary(out: Path) -> dict[str, Any]:
    return json.loads((out / "summary.json").read_text())  # type: ignore[no-any-return]


@pytest.fixture
def counted(tmp_path: Path, redis_url: str) -> tuple[Path, Registry]:
    """Two clear batches of ``browser`` (k-RR) in one window."""
    config, registry = write_registry(tmp_path)
    ingestor = _ingestor(registry, redis_url)
    rng = np.random.default_rng(7)
    for n in (1500, 900):
        ingestor.ingest(random_batch(rng, registry["browser"], n, WINDOW))
    return config, registry


def test_the_same_release_is_recorded_once_however_its_windows_are_given(
    tmp_path: Path, redis_url: str, counted: tuple[Path, Registry]
) -> None:
    _, registry = counted
    ledger = str(tmp_path / "ledger.json")
    base = ["report", "--redis", redis_url, "--metric", "browser", "--no-plot", "--ledger", ledger]
    code, _, err = _run(*base, "--new-ledger", "--out", str(tmp_path / "a"))
    assert code == 0, err
    first = _summary(tmp_path / "a")["privacy"]["ledger"]
    assert _summary(tmp_path / "a")["privacy"]["statement"]["sealed"] is False
    assert first["recorded"] is True and first["releases"] == 1
    assert first["release_id"].startswith(f"browser/{WINDOW}/")
    # the same window named explicitly, then under a label of the analyst's: free
    for extra in (["--windows", str(WINDOW)], ["--release-id", "weekly-run"]):
        code, _, err = _run(*base, *extra, "--out", str(tmp_path / "b"))
        assert code == 0, err
        again = _summary(tmp_path / "b")["privacy"]["ledger"]
        assert again["recorded"] is False and again["releases"] == 1, again
        assert again["content"] == first["content"]
        assert (again["total_epsilon"], again["total_delta"]) == (
            first["total_epsilon"],
            first["total_delta"],
        )
        # not recorded again, and still stated the same way (these batches were clear)
        assert _summary(tmp_path / "b")["privacy"]["statement"]["sealed"] is False
    # new reports in the window: new data, a new release
    _ingestor(registry, redis_url).ingest(
        random_batch(np.random.default_rng(8), registry["browser"], 700, WINDOW)
    )
    code, _, err = _run(*base, "--out", str(tmp_path / "c"))
    assert code == 0, err
    later = _summary(tmp_path / "c")["privacy"]["ledger"]
    assert later["recorded"] is True and later["releases"] == 2
    assert later["total_epsilon"] > first["total_epsilon"]


def test_an_exported_counts_file_states_what_the_live_store_states(
    tmp_path: Path, redis_url: str, counted: tuple[Path, Registry]
) -> None:
    config, _ = counted
    code, _, err = _run(
        "report", "--redis", redis_url, "--metric", "browser", "--no-plot",
        "--out", str(tmp_path / "live"),
    )  # fmt: skip
    assert code == 0, err
    npz = tmp_path / "browser.npz"
    code, out, err = _run(
        "counts", "export", "--redis", redis_url, "--metric", "browser", "--out", str(npz)
    )
    assert code == 0, err
    assert "2,400 reports of 'browser' from window 20400 (2025-11-08)" in out
    code, _, err = _run(
        "report", "--counts", str(npz), "--config", str(config), "--metric", "browser",
        "--no-plot", "--out", str(tmp_path / "file"),
    )  # fmt: skip
    assert code == 0, err
    live, saved = _summary(tmp_path / "live"), _summary(tmp_path / "file")
    assert live["privacy"]["statement"] == saved["privacy"]["statement"]
    assert live["privacy"]["text"] == saved["privacy"]["text"]
    statement = live["privacy"]["statement"]
    assert statement["batch"]["sizes"] == [900, 1500]
    assert statement["batch"]["smallest_crowd_measured"] is True
    # these batches came in the clear: the statement says so, without hedging
    assert statement["sealed"] is False
    assert "were not sealed" in statement["who_learns_what"]["shuffler"]
    assert "if the reports were sealed" not in live["privacy"]["text"]
    assert live["window"] == saved["window"] == WINDOW
    assert live["windows"] == saved["windows"] == [WINDOW]


def test_an_aggregator_that_opened_every_report_states_them_sealed(
    tmp_path: Path, redis_url: str
) -> None:
    _, registry = write_registry(tmp_path)
    metric = registry["browser"]
    now = int(time.time())
    keys, key = KeySet().with_new_key(now)
    save_keyset(tmp_path / "keys.json", keys, now=now, create=True)
    rng = np.random.default_rng(9)
    key_file = KeyFile(tmp_path / "keys.json")
    try:
        ingestor = _ingestor(registry, redis_url, keys=key_file)
        for _ in range(2):
            n = 400
            rows = [
                (bytes([int(v)]), 0, metric.fingerprint, os.urandom(16))
                for v in rng.integers(0, 5, size=n)
            ]
            sealed = seal_many(key.public(), "browser", WINDOW, rows)
            batch = SealedBatch(
                batch_id=os.urandom(16),
                window=WINDOW,
                metric="browser",
                count=n,
                key_ids=np.full(n, key.key_id, dtype=np.int64),
                sealed=b"".join(sealed),
                sealed_bytes=len(sealed[0]),
            )
            assert ingestor.ingest(batch).applied == n
    finally:
        key_file.close()
    code, _, err = _run(
        "report", "--redis", redis_url, "--metric", "browser", "--no-plot",
        "--out", str(tmp_path / "o"),
    )  # fmt: skip
    assert code == 0, err
    statement = _summary(tmp_path / "o")["privacy"]["statement"]
    assert statement["sealed"] is True
    assert statement["who_learns_what"]["shuffler"].startswith("only metadata")


def test_counts_list_shows_every_metric_with_zero_where_none_and_dates(
    tmp_path: Path, redis_url: str, counted: tuple[Path, Registry]
) -> None:
    config, registry = counted
    # a metric whose only batch counted nothing (every report dropped): stored, no window
    store = RedisCountStore.from_url(redis_url)
    try:
        empty = accumulator_for(registry["pages"])
        store.apply_reports(
            "pages", WINDOW, os.urandom(16), registry["pages"].fingerprint, empty, NO_REPORT_IDS
        )
    finally:
        store.close()
    code, out, err = _run("counts", "list", "--redis", redis_url, "--json")
    assert code == 0, err
    listed = {m["metric"]: m for m in json.loads(out)["metrics"]}
    assert listed["browser"]["reports"] == 2400 and listed["browser"]["batches"] == 2
    assert listed["browser"]["window_dates"] == ["2025-11-08"]
    assert listed["pages"]["reports"] == 0 and listed["pages"]["windows"] == []
    code, out, err = _run("counts", "list", "--redis", redis_url, "--config", str(config))
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert "window 20400 (2025-11-08)" in lines["browser"]
    assert "2,400 reports in 2 batches" in lines["browser"]
    assert "0 reports in 1 batch" in lines["pages"] and "no window" in lines["pages"]


def test_a_params_mismatch_names_the_field_that_differs(
    tmp_path: Path, redis_url: str, counted: tuple[Path, Registry]
) -> None:
    config, _ = counted
    other = tmp_path / "other.toml"
    other.write_text(config.read_text().replace("epsilon = 2.0", "epsilon = 1.5"))
    npz = tmp_path / "browser.npz"
    assert _run("counts", "export", "--redis", redis_url, "--metric", "browser",
                "--out", str(npz))[0] == 0  # fmt: skip
    for source in (["--counts", str(npz)], ["--redis", redis_url]):
        code, _, err = _run(
            "report", *source, "--config", str(other), "--metric", "browser",
            "--out", str(tmp_path / "o"),
        )  # fmt: skip
        assert code == 1
        assert "epsilon: 1.5 in the registry, 2.0 in the" in err, err
        assert "fingerprint" not in err
