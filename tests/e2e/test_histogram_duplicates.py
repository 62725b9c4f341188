"""A shuffled-histogram call stored twice, through the real aggregator daemon.

A shuffler may store one call twice (a retry after DEADLINE_EXCEEDED, or
``store_not_replicated``, whose first attempt was stored) and forward the copies in
another batch. The aggregator then counts each report once, but it has seen, by the
repeated report ids, which reports came from one device: that window's release must
not claim the central figure. Here a ``crowdmix aggregator serve`` process on a
redis-server this test starts gets one sealed batch per window, then one device's
report set again under a new batch id; ``crowdmix report --redis`` (and a counts file
exported from it) withholds the central figure for that window only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from crowdmix.aggregator.sealing.keys import KeySet, save_keyset
from crowdmix.client.histogram import HistogramEncoder
from crowdmix.client.report import Report
from crowdmix.client.sealing import seal_many
from crowdmix.cluster import DaemonProcess, RedisServer, free_port
from crowdmix.core.registry import load_registry, parse_registry
from crowdmix.core.sealed import PublicKeyConfig
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from tests.client.bitsources import SeededBits

METRIC = "h"
REGISTRY = f"""
[metrics.{METRIC}]
encoding = "shuffled-histogram"
domain = ["a", "b", "c", "d"]
fake_slots = 2
fake_probability = 0.5
[metrics.{METRIC}.shuffle]
min_batch = 100
"""
DEVICES = 2000


@dataclass
class Aggregator:
    workdir: Path
    registry_path: Path
    redis_url: str
    stub: crowdmix_pb2_grpc.AggregatorStub
    key: PublicKeyConfig


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[Aggregator]:
    reg = tmp_path / "registry.toml"
    reg.write_text(REGISTRY)
    now = int(time.time())
    keys, key = KeySet().with_new_key(now)
    save_keyset(tmp_path / "keys.json", keys, now=now, create=True)
    redis = RedisServer(appendonly=True, directory=str(tmp_path / "redis"), fsync="always")
    redis.start()
    port = free_port()
    daemon = DaemonProcess(
        "aggregator",
        [
            "aggregator", "serve", "--config", str(reg), "--redis", redis.url,
            "--listen", f"127.0.0.1:{port}", "--keys", str(tmp_path / "keys.json"),
        ],
        port,
        tmp_path / "aggregator.log",
    )  # fmt: skip
    try:
        daemon.start()
        daemon.wait_healthy()
        with grpc.insecure_channel(daemon.target) as channel:
            yield Aggregator(
                tmp_path, reg, redis.url, crowdmix_pb2_grpc.AggregatorStub(channel), key.public()
            )
    finally:
        assert daemon.stop() == 0, daemon.tail_log()
        redis.cleanup()


def _batch(agg: Aggregator, window: int, reports: list[Report]) -> pb.Batch:
    """One sealed batch, as the shuffler forwards it (sealed afresh: new ciphertexts)."""
    rows = [(r.bits, r.cohort, r.params_fingerprint, r.report_id) for r in reports]
    sealed = seal_many(agg.key, METRIC, window, rows)
    return pb.Batch(
        batch_id=os.urandom(16),
        window=window,
        reports=pb.ReportColumns(
            metric=METRIC,
            count=len(sealed),
            key_ids=[agg.key.key_id] * len(sealed),
            sealed=b"".join(sealed),
            sealed_bytes=len(sealed[0]),
        ),
    )


def _devices(seed: int) -> list[list[Report]]:
    """Each device's report set (its real report and fakes), from seeded coins."""
    params = parse_registry(tomllib.loads(REGISTRY))[METRIC].histogram
    assert params is not None
    encoder = HistogramEncoder(params, metric=METRIC, rand=SeededBits(seed))
    return [encoder.encode((0, 1, 1, 2)[i % 4]) for i in range(DEVICES)]


def _crowdmix(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crowdmix", *args],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def _report(agg: Aggregator, out: Path, *source: str) -> tuple[str, dict[str, object]]:
    run = _crowdmix("report", *source, "--metric", METRIC, "--no-plot", "--out", str(out))
    assert run.returncode in (0, 1), run.stderr  # 1: nothing significant is allowed
    assert "Traceback" not in run.stderr
    summary = json.loads((out / "summary.json").read_text())
    return run.stdout, summary["privacy"]


@pytest.mark.slow
def test_a_call_stored_twice_withdraws_its_windows_central_figure(aggregator: Aggregator) -> None:
    agg = aggregator
    registry = load_registry(agg.registry_path)
    now = registry.window_of(time.time())
    linked_window, clean_window = now, now - 2  # not adjacent: copies are checked in W±1
    first = _devices(1)
    clean = _devices(2)
    reply = agg.stub.Ingest(_batch(agg, linked_window, [r for d in first for r in d]), timeout=60)
    assert reply.applied == sum(map(len, first))
    clean_batch = _batch(agg, clean_window, [r for d in clean for r in d])
    assert agg.stub.Ingest(clean_batch, timeout=60).applied == sum(map(len, clean))
    # the shuffler stored device 7's call twice: forwarded again in a later batch, with
    # its report ids, under a new batch id (with new reports of other devices)
    again = first[7]
    late = [r for d in _devices(3)[:200] for r in d]
    reply = agg.stub.Ingest(_batch(agg, linked_window, again + late), timeout=60)
    assert (reply.applied, reply.duplicate) == (len(late), False)
    # the shuffler re-sends a whole batch (same batch id): a duplicate batch, not a repeat
    assert agg.stub.Ingest(clean_batch, timeout=60).duplicate

    source = ["--redis", agg.redis_url]
    text, privacy = _report(agg, agg.workdir / "linked", *source, "--windows", str(linked_window))
    line = (
        f"{len(again)} report ids were seen twice in this window: the aggregator may have "
        "linked a device's reports; no central guarantee"
    )
    assert line in text and "ε_L = ∞" in text
    assert "ε = " not in text and "δ = " not in text  # no central number at all
    statement = privacy["statement"]
    assert isinstance(statement, dict)
    assert statement["central"] is None and statement["central_total"] is None
    assert statement["duplicate_reports"] == len(again)
    assert statement["central_withheld"] == line

    text, privacy = _report(agg, agg.workdir / "clean", *source, "--windows", str(clean_window))
    assert "ε = " in text and "seen twice" not in text
    statement = privacy["statement"]
    assert isinstance(statement, dict) and statement["duplicate_reports"] == 0
    assert statement["central"]["epsilon"] is not None  # type: ignore[index]

    # a counts file exported from the store carries the count
    for window, linked in ((linked_window, True), (clean_window, False)):
        path = agg.workdir / f"counts-{window}.npz"
        run = _crowdmix(
            "counts", "export", "--redis", agg.redis_url, "--metric", METRIC,
            "--windows", str(window), "--out", str(path),
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
        text, privacy = _report(
            agg, agg.workdir / f"file-{window}", "--counts", str(path),
            "--config", str(agg.registry_path),
        )  # fmt: skip
        assert ("seen twice" in text) is linked and ("ε = " in text) is not linked
