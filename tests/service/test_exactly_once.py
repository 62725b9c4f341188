"""Exactly once from the device to the count, with real processes.

Real ``crowdmix shuffler serve`` and ``crowdmix aggregator serve`` processes, a real
redis-server (AOF everysec) and, where a Redis reply must be lost, a small TCP proxy
between the shuffler and its Redis. Every sender has a cohort of its own, so the
aggregator's per-cohort totals are per-sender counts: each test asserts, sender by
sender, that every report the sender was told was stored is counted exactly once.
Senders behave like the SDK: a request that failed transiently is sent again with
the same report ids until it is acknowledged.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import redis

from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.aggregator.store.base import StoredCounts
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.redis_store import _TAKE
from tests.redis_proxy import DropOneReply
from tests.redis_server import RedisServer, free_port
from tests.service.pipeline import METRIC, K, M, Pipeline, Senders, explain

pytestmark = pytest.mark.slow

SHUFFLER_TABLE = "\n[shuffler]\ninflight_retry_seconds = 1.0\nforward_timeout_seconds = 0.9\n"
# Senders send requests of PER_REQUEST reports concurrently, so a release can leave the
# last few requests pending; the pipeline's min_batch is one request, so whatever is left
# is released (at min_batch = 1000 a shuffler rightly held a last 250 or 500: seen on
# loaded boxes as acknowledged != counted within the wait)
PER_REQUEST = 250


def _pipeline(
    tmp_path: Path, redis_url: str, *, extra_toml: str = SHUFFLER_TABLE, **options: Any
) -> Pipeline:
    """A pipeline whose batches may be as small as one request (PER_REQUEST reports),
    its shuffler re-offering a batch in flight after a second unless ``extra_toml`` says
    otherwise."""
    return Pipeline(
        tmp_path, redis_url, max_batch=4000, min_batch=PER_REQUEST, extra_toml=extra_toml, **options
    )


def assert_each_sender_counted_once(p: Pipeline, senders: Senders) -> None:
    expected = senders.expected()
    got = p.counts()
    assert got is not None, p.logs()
    per_sender = got.totals[: senders.senders]
    acked = senders.acked.sum(axis=1) * senders.per_request
    assert per_sender.tolist() == acked.tolist(), (
        f"counted per sender {per_sender.tolist()}, acknowledged {acked.tolist()}\n{p.logs()}"
    )
    assert not got.totals[senders.senders :].any()
    assert np.array_equal(got.ones, expected.ones), explain(expected, got)


def wait_until_counted(p: Pipeline, senders: Senders, timeout: float) -> None:
    want = int(senders.acked.sum()) * senders.per_request
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.counted() < want:
        time.sleep(0.1)
    # settle: a double count would show as more than wanted
    time.sleep(1.0)


@pytest.fixture
def proxy(private_redis: RedisServer) -> Iterator[DropOneReply]:
    # the take script must be known to Redis, so the cut EVALSHA is one that runs
    client = redis.Redis.from_url(private_redis.url)
    sha = client.script_load(_TAKE)
    client.close()
    assert sha == hashlib.sha1(_TAKE.encode()).hexdigest()
    p = DropOneReply(private_redis.port, sha.encode())
    yield p
    p.close()


@pytest.mark.parametrize("when", ["while_running", "on_sigterm"])
def test_a_batch_whose_move_reply_is_lost_is_forwarded(
    tmp_path: Path, private_redis: RedisServer, proxy: DropOneReply, when: str
) -> None:
    """The move script ran, its reply was lost: the stranded in-flight batch is sent
    while the daemon runs (a sweep re-offers it after inflight_retry_seconds), or, when
    the sweep is far off, by SIGTERM's final pass; not only at the next start-up."""
    retry = 1.0 if when == "while_running" else 3600.0
    table = f"\n[shuffler]\ninflight_retry_seconds = {retry}\nforward_timeout_seconds = 0.9\n"
    p = _pipeline(tmp_path, private_redis.url, shuffler_redis_url=proxy.url, extra_toml=table)
    try:
        p.start_aggregator()
        p.start_shuffler()
        senders = Senders({METRIC: p.config.fingerprint}, 8, 10, PER_REQUEST, seed=1)
        proxy.armed.set()
        senders.send(p.shuffler_target, range(10), deadline=time.monotonic() + 60)
        assert senders.acked.all()
        assert proxy.dropped.wait(10), "the proxy never saw the move script"
        assert p.shuffler is not None
        if when == "while_running":
            wait_until_counted(p, senders, timeout=30)
            assert p.shuffler.alive()  # counted while running
        else:
            wait_until_counted(p, senders, timeout=3)
            assert p.counted() < 20_000  # stranded until...
            assert p.shuffler.stop(grace=20) == 0  # ...SIGTERM's final pass sends it
            wait_until_counted(p, senders, timeout=10)
        assert_each_sender_counted_once(p, senders)
        assert "release pass failing" in p.logs()  # the lost reply was seen
    finally:
        codes = p.stop()
    assert all(code in (0, None) for code in codes.values()), f"{codes}\n{p.logs()}"


def test_redis_sigkill_and_restart_mid_load_counts_every_acked_report_once(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    p = _pipeline(tmp_path, private_redis.url)
    try:
        p.start_aggregator()
        p.start_shuffler()
        senders = Senders({METRIC: p.config.fingerprint}, 8, 16, PER_REQUEST, seed=2)
        senders.send(p.shuffler_target, range(8), deadline=time.monotonic() + 60)

        def kill_and_restart() -> None:
            time.sleep(0.2)
            private_redis.kill()
            time.sleep(0.5)
            private_redis.start()

        t = threading.Thread(target=kill_and_restart)
        t.start()
        senders.send(p.shuffler_target, range(8, 16), deadline=time.monotonic() + 60)
        t.join(30)
        assert senders.acked.all()
        wait_until_counted(p, senders, timeout=30)
        assert p.shuffler is not None and p.shuffler.alive()
        assert_each_sender_counted_once(p, senders)
    finally:
        codes = p.stop()
    assert all(code == 0 for code in codes.values()), f"{codes}\n{p.logs()}"


def test_a_retry_after_the_shuffler_died_on_a_frozen_redis_counts_once(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    """The write reaches Redis but no answer reaches the device (Redis frozen, then the
    shuffler killed): the device retries with the same report ids and each sender's
    reports count once. Whether the dead shuffler's write still runs when Redis thaws is
    the kernel's choice (its socket may be reset, and the unread bytes with it): either
    way nothing is lost or counted twice, and what was stored twice is dropped and
    reported. test_a_first_copy_ingested_after_its_retry_counts_once_per_report_id makes
    the stored-twice case certain."""
    metrics_port = free_port()
    p = _pipeline(
        tmp_path, private_redis.url, aggregator_args=("--metrics-port", str(metrics_port))
    )
    assert private_redis.proc is not None
    redis_pid = private_redis.proc.pid
    try:
        p.start_aggregator()
        p.start_shuffler()
        senders = Senders({METRIC: p.config.fingerprint}, 6, 6, PER_REQUEST, seed=3)
        senders.send(p.shuffler_target, range(3), deadline=time.monotonic() + 60)
        os.kill(redis_pid, signal.SIGSTOP)
        try:
            # one attempt each: the shuffler writes, Redis never answers
            senders.send(p.shuffler_target, range(3, 4), deadline=time.monotonic() + 1.5, timeout=1)
            assert not senders.acked[:, 3].any()
            # the shuffler's writes sit unread in the frozen Redis's socket: wait until they
            # stop growing, so that its kill cannot cut a transaction short (a loaded box
            # once killed it before its first write, and nothing was stored twice)
            assert p.shuffler is not None and p.shuffler.proc is not None
            _wait_for_unread_writes(
                p.shuffler.proc.pid, private_redis.port, at_least=PER_REQUEST * 16
            )
            p.shuffler.proc.kill()
            p.shuffler.proc.wait(10)
        finally:
            os.kill(redis_pid, signal.SIGCONT)
        p.start_shuffler()
        senders.send(p.shuffler_target, range(3, 6), deadline=time.monotonic() + 60)
        assert senders.acked.all()
        assert set(senders.codes) <= {"DEADLINE_EXCEEDED", "UNAVAILABLE"}
        assert (senders.attempts[:, 3] >= 2).all()  # every sender retried request 3
        wait_until_counted(p, senders, timeout=30)
        assert_each_sender_counted_once(p, senders)
        # the copies the aggregator dropped are the ones it reports, in the store and
        # in its metrics: the first copies of request 3 when the dead shuffler's write ran
        dropped = p.store.duplicate_reports(METRIC)
        # (whole requests, at most one copy per attempt beyond the one counted)
        assert dropped is not None and dropped % PER_REQUEST == 0
        assert dropped <= int((senders.attempts[:, 3] - 1).sum()) * PER_REQUEST
        assert _metric(metrics_port, "crowdmix_aggregator_duplicate_reports_total") == dropped
    finally:
        codes = p.stop()
    assert all(code == 0 for code in codes.values()), f"{codes}\n{p.logs()}"


def _wait_for_unread_writes(pid: int, port: int, at_least: int, timeout: float = 30.0) -> None:
    """Wait until the bytes process ``pid`` wrote to the Redis on ``port`` and Redis has not
    read (the rx_queue, in /proc/net/tcp, of Redis's end of each of ``pid``'s connections)
    are ``at_least`` and have not changed for half a second."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        with open("/proc/net/tcp") as f:
            rows = [line.split() for line in f.readlines()[1:]]
        ports = lambda r: (int(r[1].rsplit(":", 1)[1], 16), int(r[2].rsplit(":", 1)[1], 16))  # noqa: E731
        theirs = {ports(r)[0] for r in rows if r[9] in inodes and ports(r)[1] == port}
        unread = sum(
            int(r[4].split(":")[1], 16)
            for r in rows
            if r[3] == "01" and ports(r)[0] == port and ports(r)[1] in theirs
        )
        if unread != last:
            last, since = unread, time.monotonic()
        elif unread >= at_least and time.monotonic() - since >= 0.5:
            return
        time.sleep(0.05)
    raise AssertionError(
        f"process {pid} left {last} bytes unread in the frozen Redis, not {at_least}"
    )


def _metric(port: int, name: str) -> float:
    """The sum of a Prometheus metric's samples on the aggregator's /metrics."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


def test_an_undecodable_ingest_body_is_invalid_argument_with_one_log_line(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    """Random bytes, a truncated Batch, a Batch with trailing garbage: INVALID_ARGUMENT
    (the shuffler parks such a batch instead of retrying it forever), one log line each,
    no traceback; the aggregator keeps serving."""
    p = Pipeline(tmp_path, private_redis.url)
    try:
        p.start_aggregator()
        good = pb.Batch(
            batch_id=os.urandom(16),
            window=p.registry.window_of(time.time()),
            reports=pb.ReportColumns(
                metric=METRIC,
                params_fingerprint=p.config.fingerprint,
                count=1,
                report_bytes=K // 8,
                cohorts=[0],
                bits=bytes(K // 8),
                report_ids=os.urandom(16),
            ),
        ).SerializeToString()
        bodies = [
            np.random.default_rng(4).integers(0, 256, 300, dtype=np.uint8).tobytes(),
            good[: len(good) - 5],
            good + b"\xff\xff\xff",
        ]
        with grpc.insecure_channel(f"127.0.0.1:{p.aggregator_port}") as channel:
            ingest = channel.unary_unary(
                "/crowdmix.v2.Aggregator/Ingest",
                request_serializer=None,
                response_deserializer=pb.IngestResponse.FromString,
            )
            for body in bodies:
                with pytest.raises(grpc.RpcError) as err:
                    ingest(body, timeout=10)
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
                assert "not a Batch" in (err.value.details() or "")
            assert ingest(good, timeout=10).applied == 1  # still serving
        log = p.logs()
        assert log.count("ingest refused: the request body is not a Batch") == 3, log
        assert "Traceback" not in log
    finally:
        codes = p.stop()
    assert all(code == 0 for code in codes.values()), f"{codes}\n{p.logs()}"


def test_fsync_always_starts_redis_with_appendfsync_always(tmp_path: Path) -> None:
    """README: `crowdmix cluster --fsync always` runs its Redis servers with
    appendfsync always (fsync before every reply); the flag parses, a bad mode is refused."""
    from crowdmix.cli import build_parser

    args = build_parser().parse_args(["cluster", "--dir", str(tmp_path), "--fsync", "always"])
    assert args.fsync == "always"
    server = RedisServer(directory=str(tmp_path / "r"), fsync="always")
    server.start()
    try:
        client = redis.Redis.from_url(server.url)
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        assert client.config_get("appendonly") == {"appendonly": "yes"}
        client.close()
    finally:
        server.cleanup()
    with pytest.raises(ValueError, match="fsync"):
        RedisServer(fsync="never")


def test_a_first_copy_ingested_after_its_retry_counts_once_per_report_id(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    """A device's first request was filed by one shuffler (reply lost), its retry by
    another, both under window W, the window the reports name; the retry's batch is
    delivered first (the first one was in flight in a process that crashed, or parked
    while the aggregator was down). Against the real ``crowdmix aggregator serve`` on
    Redis: every report id counts once and the earlier copy's other reports are counted,
    all in W. Each report has a cohort of its own, so cohort totals are per-report
    counts."""
    p = Pipeline(tmp_path, private_redis.url)
    rng = np.random.default_rng(37)
    shared, only_first, only_retry = range(0, 20), range(20, 26), range(26, M)
    bits = rng.integers(0, 256, size=(M, K // 8), dtype=np.uint8)
    ids = rng.integers(0, 256, size=(M, 16), dtype=np.uint8)

    def batch(cohorts: list[int], window: int) -> pb.Batch:
        return pb.Batch(
            batch_id=os.urandom(16),
            window=window,
            reports=pb.ReportColumns(
                metric=METRIC,
                params_fingerprint=p.config.fingerprint,
                count=len(cohorts),
                report_bytes=K // 8,
                cohorts=cohorts,
                bits=bits[cohorts].tobytes(),
                report_ids=ids[cohorts].tobytes(),
            ),
        )

    try:
        p.start_aggregator()
        w = p.registry.window_of(time.time())
        retry = batch([*only_retry, *shared], w)
        first = batch([*rng.permutation([*shared, *only_first]).tolist()], w)
        with grpc.insecure_channel(f"127.0.0.1:{p.aggregator_port}") as channel:
            stub = crowdmix_pb2_grpc.AggregatorStub(channel)
            r1 = stub.Ingest(retry, timeout=10)
            r2 = stub.Ingest(first, timeout=10)
            r3 = stub.Ingest(first, timeout=10)  # the shuffler re-offers it: a duplicate batch
        assert (r1.applied, r1.duplicate_reports) == (len(shared) + len(only_retry), 0)
        assert (r2.applied, r2.duplicate_reports) == (len(only_first), len(shared))
        assert (r3.applied, r3.duplicate) == (0, True)
        got = p.counts()
        assert got is not None, p.logs()
        assert got.totals.tolist() == [1] * M, p.logs()  # each report id counted once
        expected = CohortCounts.create(M, K)
        expected.add(np.arange(M, dtype=np.uint32), bits)
        assert np.array_equal(got.ones, expected.ones), explain(StoredCounts.of(expected), got)
        assert p.store.windows(METRIC) == [w]
    finally:
        codes = p.stop()
    assert all(code == 0 for code in codes.values()), f"{codes}\n{p.logs()}"
