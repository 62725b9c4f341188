"""Fault tests of the whole pipeline: real shuffler and aggregator processes, real Redis
(AOF everysec) on loopback. Every test is bounded (timeouts everywhere) and ends by itself.

The expected counts are always a direct count (numpy, cohort by cohort, bit by bit) of
the reports in the requests the shuffler acknowledged. A request whose answer was lost
in a crash (the client saw UNAVAILABLE) may or may not have been stored; it must then
count exactly 0 or 1 times, which ``matching_subset`` checks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest

from crowdmix.aggregator.daemon.ingest import IngestBatch
from crowdmix.aggregator.daemon.service import batch_to_proto
from crowdmix.protos import crowdmix_pb2_grpc
from tests.redis_server import RedisServer
from tests.service.pipeline import METRIC, Load, Pipeline, explain, matching_subset

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pipeline(tmp_path: Path, private_redis: RedisServer) -> Iterator[Pipeline]:
    p = Pipeline(tmp_path, private_redis.url)
    try:
        yield p
    finally:
        codes = p.stop()
        # a graceful stop is part of the contract: SIGTERM → exit 0
        assert all(code == 0 for code in codes.values()), f"{codes}\n{p.logs()}"


def assert_acked_counted_once(p: Pipeline, load: Load) -> None:
    acked = load.indices("OK")
    # a lost answer (crash) leaves the request's fate unknown; a rejection means "not stored"
    unknown = load.indices("UNAVAILABLE") + load.indices("DEADLINE_EXCEEDED")
    expected = load.counts_of(acked)
    got = p.counts()
    assert got is not None, p.logs()
    if unknown:
        subset = matching_subset(load, expected, unknown, got)
        assert subset is not None, explain(expected, got)
    else:
        assert np.array_equal(got.totals, expected.totals), explain(expected, got)
        assert np.array_equal(got.ones, expected.ones), explain(expected, got)


def test_a_million_reports_are_counted_exactly(pipeline: Pipeline) -> None:
    pipeline.start_aggregator()
    pipeline.start_shuffler()
    load = Load(1000, seed=1)  # 1000 columnar requests of 1000 reports
    load.send(pipeline.shuffler_target, pipeline.config, range(1000))
    assert load.outcome.count("OK") == 1000, set(load.outcome)
    assert pipeline.wait_counted(1_000_000, settle=0.3) == 1_000_000, pipeline.logs()
    assert_acked_counted_once(pipeline, load)


def _kill_when(predicate_reached: threading.Event, kill: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        if predicate_reached.wait(60):
            kill()

    t = threading.Thread(target=run)
    t.start()
    return t


def test_sigkill_the_shuffler_mid_load(pipeline: Pipeline) -> None:
    pipeline.start_aggregator()
    shuffler = pipeline.start_shuffler()
    load = Load(400, seed=2)
    half = threading.Event()
    killed = _kill_when(half, shuffler.kill)
    # phase 1: the shuffler dies (SIGKILL) once 100 requests are acknowledged
    load.send(
        pipeline.shuffler_target,
        pipeline.config,
        range(200),
        on_ack=lambda n: half.set() if n >= 100 else None,
        pause_on_failure=0.01,
    )
    killed.join()
    assert not shuffler.alive()
    assert load.failed()  # requests did hit the dead shuffler
    pipeline.start_shuffler()  # recovers its in-flight batches from Redis, re-sends them
    load.send(pipeline.shuffler_target, pipeline.config, range(200, 400))
    assert set(load.outcome[200:]) == {"OK"}
    acked = len(load.indices("OK")) * 1000
    pipeline.wait_counted(acked, settle=1.0)
    assert_acked_counted_once(pipeline, load)


def test_sigkill_the_aggregator_mid_ingest(pipeline: Pipeline) -> None:
    aggregator = pipeline.start_aggregator()
    pipeline.start_shuffler()
    load = Load(400, seed=3)
    sender = threading.Thread(
        target=load.send, args=(pipeline.shuffler_target, pipeline.config, range(400))
    )
    sender.start()
    deadline = time.monotonic() + 60
    while pipeline.counted() < 60_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    aggregator.kill()  # SIGKILL while batches are flowing in
    killed_at = pipeline.counted()
    time.sleep(1.0)
    pipeline.start_aggregator()
    sender.join(60)
    assert not sender.is_alive()
    assert set(load.outcome) == {"OK"}
    assert killed_at < 400_000  # it really died mid-ingest
    assert pipeline.wait_counted(400_000, settle=1.0) == 400_000, pipeline.logs()
    assert_acked_counted_once(pipeline, load)


def test_aggregator_down_shuffler_buffers_up_to_its_bound_then_delivers(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    p = Pipeline(tmp_path, private_redis.url, shuffler_args=("--max-buffered", "50000"))
    try:
        p.start_aggregator()
        p.start_shuffler()
        load = Load(150, seed=4)
        load.send(p.shuffler_target, p.config, range(20))
        assert p.wait_counted(20_000, settle=0.3) == 20_000
        assert p.aggregator is not None and p.aggregator.stop() == 0
        # aggregator gone: the shuffler keeps acknowledging until 50 000 are buffered
        load.send(p.shuffler_target, p.config, range(20, 150), threads=2)
        seen = set(load.outcome[20:])
        assert seen == {"OK", "RESOURCE_EXHAUSTED"}, seen
        accepted_while_down = load.outcome[20:].count("OK") * 1000
        # the shuffler's bound covers its pending queues; the one batch it had already
        # taken in flight (<= max_batch = 20 000) when the aggregator vanished is extra
        assert 40_000 <= accepted_while_down <= 50_000 + 20_000
        assert p.counted() == 20_000
        time.sleep(1.0)  # "for a while"
        p.start_aggregator()
        total = 20_000 + accepted_while_down
        assert p.wait_counted(total, settle=0.5) == total, p.logs()
        assert_acked_counted_once(p, load)
    finally:
        codes = p.stop()
    assert all(code == 0 for code in codes.values()), codes


def test_redis_restart_keeps_acknowledged_reports_and_counts(
    pipeline: Pipeline, private_redis: RedisServer
) -> None:
    pipeline.start_aggregator()
    pipeline.start_shuffler()
    load = Load(300, seed=5)
    load.send(pipeline.shuffler_target, pipeline.config, range(100))
    pipeline.wait_counted(100_000, settle=0.3)
    restarted = threading.Event()

    def restart_redis() -> None:
        private_redis.restart()  # SHUTDOWN (AOF written) and start again on the same port
        restarted.set()

    t = threading.Thread(target=restart_redis)
    t.start()
    load.send(pipeline.shuffler_target, pipeline.config, range(100, 200), pause_on_failure=0.05)
    t.join(30)
    assert restarted.is_set()
    load.send(pipeline.shuffler_target, pipeline.config, range(200, 300))
    assert set(load.outcome[200:]) == {"OK"}, set(load.outcome[200:])
    # a write cut off by the SHUTDOWN may have been stored: DEADLINE_EXCEEDED, not retried
    assert set(load.outcome) <= {"OK", "UNAVAILABLE", "DEADLINE_EXCEEDED"}
    pipeline.wait_counted(len(load.indices("OK")) * 1000, settle=1.0)
    assert_acked_counted_once(pipeline, load)
    # and once more after a SIGKILL of Redis, past the everysec fsync
    before = pipeline.counts()
    time.sleep(1.5)
    private_redis.kill()
    private_redis.start()
    after = pipeline.counts()
    assert before is not None and after is not None
    assert np.array_equal(before.ones, after.ones) and before.num_reports == after.num_reports


def test_a_batch_delivered_twice_across_an_aggregator_crash_counts_once(
    pipeline: Pipeline,
) -> None:
    aggregator = pipeline.start_aggregator()
    rng = np.random.default_rng(6)
    n = 5000
    batch = IngestBatch(
        batch_id=os.urandom(16),
        window=pipeline.registry.window_of(time.time()),
        metric=METRIC,
        fingerprint=pipeline.config.fingerprint,
        count=n,
        report_bytes=8,
        cohorts=rng.integers(0, 32, n).astype(np.int64),
        bits=rng.integers(0, 256, (n, 8), dtype=np.uint8).tobytes(),
        report_ids=os.urandom(16 * n),
    )
    msg = batch_to_proto(batch)
    target = f"127.0.0.1:{pipeline.aggregator_port}"
    with grpc.insecure_channel(target) as channel:
        assert crowdmix_pb2_grpc.AggregatorStub(channel).Ingest(msg, timeout=10).applied == n
    aggregator.signal(signal.SIGKILL)  # as if the ack had been lost with the process
    aggregator.kill()
    pipeline.start_aggregator()
    with grpc.insecure_channel(target) as channel:
        stub = crowdmix_pb2_grpc.AggregatorStub(channel)
        resp = stub.Ingest(msg, timeout=10)  # the shuffler's retry
        assert (resp.applied, resp.duplicate) == (0, True)
        # garbage to the same process: rejected with a reason, nothing counted
        for bad in (
            msg.__class__(batch_id=b"\x00" * 3, window=msg.window, reports=msg.reports),
            msg.__class__(batch_id=os.urandom(16), window=msg.window),
        ):
            with pytest.raises(grpc.RpcError) as info:
                stub.Ingest(bad, timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details()
    got = pipeline.counts()
    assert got is not None and got.num_reports == n
    assert pipeline.store.applied_batches(METRIC) == 1


def test_shuffler_forwards_to_the_aggregator_over_mtls(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    certs = tmp_path / "tls"
    subprocess.run(
        ["bash", str(ROOT / "deploy/tls/make-certs.sh"), str(certs), "localhost", "127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    p = Pipeline(
        tmp_path,
        private_redis.url,
        aggregator_args=(
            "--tls-cert", str(certs / "aggregator.crt"),
            "--tls-key", str(certs / "aggregator.key"),
            "--tls-client-ca", str(certs / "ca.crt"),
        ),
        shuffler_args=(
            "--aggregator-ca", str(certs / "ca.crt"),
            "--aggregator-cert", str(certs / "shuffler-client.crt"),
            "--aggregator-key", str(certs / "shuffler-client.key"),
        ),
    )  # fmt: skip
    try:
        p.start_aggregator()
        p.start_shuffler()
        load = Load(30, seed=7)
        load.send(p.shuffler_target, p.config, range(30))
        assert set(load.outcome) == {"OK"}
        assert p.wait_counted(30_000, settle=0.3) == 30_000, p.logs()
        assert_acked_counted_once(p, load)
    finally:
        codes = p.stop()
    assert all(code == 0 for code in codes.values()), codes
