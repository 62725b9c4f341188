"""Reports in through Submit, shuffled batches out to a real gRPC Aggregator."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
import pytest

from crowdmix.core.registry import Registry
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.columns import Chunk
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import start_shuffler
from crowdmix.shuffler.store import PendingWrite, QueueKey, ShufflerStore
from tests.redis_server import RedisServer
from tests.shuffler.helpers import (
    OUE,
    RAPPOR,
    RecordingAggregator,
    make_registry,
    serving,
    submit_request,
)
from tests.waiting import eventually

FAST = ShufflerSettings(tick_seconds=0.01, shutdown_grace_seconds=5.0)


def ids_chunk(ids: npt.NDArray[np.int64]) -> Chunk:
    """Reports that encode a unique id: cohort = id >> 16, bits = id & 0xffff (k=16, m=8),
    each with a fresh report id."""
    return Chunk(
        report_bytes=2,
        cohorts=(ids >> 16).astype(np.uint32),
        bits=(ids & 0xFFFF).astype("<u2").tobytes(),
        ids=os.urandom(16 * len(ids)),
    )


def ids_of(chunk: Chunk) -> npt.NDArray[np.int64]:
    low = np.frombuffer(chunk.bits, dtype="<u2").astype(np.int64)
    return (chunk.cohorts.astype(np.int64) << 16) | low


def columns_request(ids: npt.NDArray[np.int64], fp: int) -> pb.SubmitRequest:
    c = ids_chunk(ids)
    return submit_request(
        columns=[
            pb.ReportColumns(
                metric=RAPPOR,
                params_fingerprint=fp,
                count=c.count,
                report_bytes=2,
                cohorts=c.cohorts.tolist(),
                bits=c.bits,
            )
        ]
    )


def wait_for(cond: Callable[[], bool], timeout: float = 30.0) -> None:
    assert eventually(cond, timeout, 0.02), "condition not reached in time"


def test_100k_reports_come_out_as_exactly_the_input_multiset(
    store: ShufflerStore, aggregator: RecordingAggregator
) -> None:
    # max_delay is long, so batches go out full while reports arrive (14 × 7000) and
    # the final flush at stop releases the remaining 2000 (= min_batch).
    registry = make_registry(min_batch=2000, max_batch=7000, max_delay=60.0)
    fp = registry[RAPPOR].fingerprint
    n = 100_000
    ids = np.arange(n, dtype=np.int64)
    ids[-500:] = ids[:500]  # duplicates in the input must come out twice, too
    with serving(registry, store, aggregator.target, grace=5, settings=FAST) as (_, stub):
        futures = [
            stub.Submit.future(columns_request(ids[i : i + 1000], fp), timeout=30)
            for i in range(0, n, 1000)
        ]
        assert sum(f.result().accepted for f in futures) == n
        wait_for(lambda: aggregator.total() == 98_000)
    assert aggregator.total() == n
    batches = aggregator.all_reports()
    out = np.sort(np.concatenate([ids_of(b.chunk) for b in batches]))
    assert np.array_equal(out, np.sort(ids))  # union is exactly the input multiset
    assert min(b.chunk.count for b in batches) >= 2000  # never a small batch
    assert max(b.chunk.count for b in batches) <= 7000
    assert all(b.key.fingerprint == fp and b.metric == RAPPOR for b in batches)
    assert len({b.batch_id for b in batches}) == len(batches)
    assert all(len(b.batch_id) == 16 for b in batches)
    # shuffled: a released batch is not in arrival order
    assert not any(np.all(np.diff(ids_of(b.chunk)) > 0) for b in batches)
    assert sum(store.pending(RAPPOR).values()) == 0 and store.inflight_ids(RAPPOR) == []


def test_fewer_than_min_batch_are_never_released(aggregator: RecordingAggregator) -> None:
    registry = make_registry(min_batch=1000, max_batch=5000, max_delay=0.01)
    fp = registry[RAPPOR].fingerprint
    store = MemoryStore()
    # grace=2: the final flush at the stop still respects the threshold
    with serving(registry, store, aggregator.target, grace=2, settings=FAST) as (_, stub):
        stub.Submit(columns_request(np.arange(999, dtype=np.int64), fp), timeout=10)
        time.sleep(0.3)  # many release ticks, max_delay long past
        assert aggregator.total() == 0
        stub.Submit(columns_request(np.arange(999, 1000, dtype=np.int64), fp), timeout=10)
        wait_for(lambda: aggregator.total() == 1000)
        stub.Submit(columns_request(np.arange(5, dtype=np.int64), fp), timeout=10)
    assert aggregator.total() == 1000
    assert sum(store.pending(RAPPOR).values()) == 5


def test_waits_max_delay_before_releasing_a_partial_batch(
    aggregator: RecordingAggregator,
) -> None:
    registry = make_registry(min_batch=10, max_batch=1000, max_delay=0.6)
    fp = registry[RAPPOR].fingerprint
    with serving(registry, MemoryStore(), aggregator.target, grace=2, settings=FAST) as (_, stub):
        t0 = time.monotonic()
        stub.Submit(columns_request(np.arange(50, dtype=np.int64), fp), timeout=10)
        time.sleep(0.3)
        assert aggregator.total() == 0  # 50 ≥ min_batch but max_delay has not passed
        wait_for(lambda: aggregator.total() == 50)
        assert time.monotonic() - t0 >= 0.55
        # a full batch goes at once
        t1 = time.monotonic()
        stub.Submit(columns_request(np.arange(1000, dtype=np.int64), fp), timeout=10)
        wait_for(lambda: aggregator.total() == 1050)
        assert time.monotonic() - t1 < 0.5


def test_retries_while_aggregator_is_down_then_deletes_after_ack(
    aggregator: RecordingAggregator,
) -> None:
    registry = make_registry(min_batch=10, max_batch=100, max_delay=0.01)
    fp = registry[RAPPOR].fingerprint
    store = MemoryStore()
    aggregator.fail_next = 4
    with serving(registry, store, aggregator.target, grace=2, settings=FAST) as (handle, stub):
        stub.Submit(columns_request(np.arange(100, dtype=np.int64), fp), timeout=10)
        wait_for(lambda: len(store.inflight_ids(RAPPOR)) == 1)
        wait_for(lambda: aggregator.total() == 100, timeout=20)
        wait_for(lambda: store.inflight_ids(RAPPOR) == [])
    assert aggregator.calls == 5
    assert handle.metrics.forward_failures._value.get() == 4


def test_recovery_reforwards_inflight_batches_once(aggregator: RecordingAggregator) -> None:
    registry = make_registry(min_batch=10, max_batch=100)
    fp = registry[RAPPOR].fingerprint
    store = MemoryStore()
    key = QueueKey(window=registry.window_of(time.time()), fingerprint=fp)
    store.append([PendingWrite.of(RAPPOR, key, ids_chunk(np.arange(150, dtype=np.int64)))])
    left = store.take(RAPPOR, key, min_batch=10, max_batch=100, batch_id=b"A" * 16)
    assert left is not None
    # the "crashed" process's batch was already delivered once; the aggregator dedupes
    handle = start_shuffler(registry, store, aggregator.target, settings=FAST)
    try:
        wait_for(lambda: aggregator.total() == 150)
        wait_for(lambda: store.inflight_ids(RAPPOR) == [])
    finally:
        handle.stop(grace=2)
    assert b"A" * 16 in aggregator.batches


def test_old_windows_are_disposed_never_forwarded(aggregator: RecordingAggregator) -> None:
    registry = make_registry(min_batch=10, max_batch=100, max_delay=0.01, disposal_days=2)
    fp = registry[RAPPOR].fingerprint
    now_window = registry.window_of(time.time())
    store = MemoryStore()
    old = QueueKey(window=now_window - 3, fingerprint=fp)
    fresh = QueueKey(window=now_window - 1, fingerprint=fp)
    store.append([PendingWrite.of(RAPPOR, old, ids_chunk(np.arange(50, dtype=np.int64)))])
    store.append([PendingWrite.of(RAPPOR, old, ids_chunk(np.arange(50, 100, dtype=np.int64)))])
    assert store.take(RAPPOR, old, min_batch=10, max_batch=50, batch_id=b"B" * 16)
    store.append([PendingWrite.of(RAPPOR, fresh, ids_chunk(np.arange(20, dtype=np.int64)))])
    handle = start_shuffler(registry, store, aggregator.target, settings=FAST)
    try:
        wait_for(lambda: aggregator.total() == 20)
        wait_for(lambda: store.pending(RAPPOR) == {} and store.inflight_ids(RAPPOR) == [])
    finally:
        handle.stop(grace=2)
    assert [b.key.window for b in aggregator.all_reports()] == [now_window - 1]
    assert handle.metrics.disposed_reports.labels(RAPPOR)._value.get() == 100


def test_drop_probability_thins_reports_before_storage(aggregator: RecordingAggregator) -> None:
    registry = make_registry(min_batch=10, max_batch=100_000, max_delay=0.01, drop=0.5)
    fp = registry[RAPPOR].fingerprint
    store = MemoryStore()
    with serving(registry, store, None, settings=FAST) as (handle, stub):
        for i in range(20):
            ids = np.arange(1000 * i, 1000 * (i + 1), dtype=np.int64)
            assert stub.Submit(columns_request(ids, fp), timeout=10).accepted == 1000
    kept = sum(store.pending(RAPPOR).values())
    # Binomial(20000, 0.5): sd 70.7; ±7 sd fails with probability < 3e-12.
    assert abs(kept - 10_000) < 7 * 70.8
    dropped = handle.metrics.dropped_reports.labels(RAPPOR)._value.get()
    assert dropped + kept == 20_000


class SlowStore(MemoryStore):
    """A store whose writes take 20 ms, so concurrent requests must queue behind one."""

    def append(self, writes: Sequence[PendingWrite]) -> None:
        time.sleep(0.02)
        super().append(writes)


@pytest.mark.parametrize(
    ("store_kind", "delay_ms"),
    [("blocking", 0.0), ("blocking", 2.0)]
    + [(kind, 300.0) for kind in ("memory", "redis", "rediss", "unix")],
)
def test_concurrent_requests_share_store_writes(
    store_kind: str, delay_ms: float, request: pytest.FixtureRequest
) -> None:
    """100 requests sent at once share a few writes, and every acknowledged report is
    stored: on the server's own write path on the event loop (inline memory append; the
    asyncio Redis connection over redis://, rediss:// and unix://; a 300 ms gather
    window), and from the writer thread for a store without an event-loop appender (a
    memory store subclass whose writes block, so requests queue behind one)."""
    from crowdmix.shuffler.redis_store import RedisStore
    from crowdmix.shuffler.store import async_appender

    registry = make_registry()
    fp = registry[RAPPOR].fingerprint
    store: ShufflerStore
    if store_kind in ("blocking", "memory"):
        store = SlowStore() if store_kind == "blocking" else MemoryStore()
    else:
        store = RedisStore(request.getfixturevalue(f"{store_kind}_url"))
    assert (async_appender(store) is None) == (store_kind == "blocking")
    settings = ShufflerSettings(commit_max_delay_ms=delay_ms)
    try:
        with serving(registry, store, None, settings=settings) as (handle, stub):
            futures = [
                stub.Submit.future(columns_request(np.arange(10, dtype=np.int64), fp), timeout=10)
                for _ in range(100)
            ]
            assert all(f.result().accepted == 10 for f in futures)
            # 100 requests in a 300 ms window or queued behind 20 ms writes: a few writes
            assert 1 <= handle.metrics.store_writes._value.get() <= 25
            assert sum(store.pending(RAPPOR).values()) == 1000
    finally:
        store.close()


def test_commit_window_default_is_one_millisecond() -> None:
    assert ShufflerSettings().commit_delay_seconds == 0.001
    assert ShufflerSettings(commit_max_delay_ms=2.5).commit_delay_seconds == 0.0025


def test_store_down_is_unavailable_and_nothing_is_acknowledged(
    private_redis: Any,
) -> None:
    from crowdmix.shuffler.redis_store import RedisStore

    registry = make_registry()
    fp = registry[RAPPOR].fingerprint
    store = RedisStore(private_redis.url, timeout=2.0)
    try:
        with serving(registry, store, None, settings=ShufflerSettings()) as (_, stub):
            assert stub.Submit(columns_request(np.arange(10), fp), timeout=10).accepted == 10
            private_redis.stop()  # clean shutdown: the AOF keeps the 10 acknowledged
            with pytest.raises(grpc.RpcError) as err:
                stub.Submit(columns_request(np.arange(10), fp), timeout=10)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "Traceback" not in err.value.details()
            private_redis.start()
            assert stub.Submit(columns_request(np.arange(5), fp), timeout=10).accepted == 5
            assert sum(store.pending(RAPPOR).values()) == 15
    finally:
        store.close()


class UnconfirmedStore(MemoryStore):
    """A store whose write is sent but never confirmed (e.g. a Redis reply timeout)."""

    def __init__(self) -> None:
        super().__init__()
        self.attempts: list[PendingWrite] = []

    def append(self, writes: Sequence[PendingWrite]) -> None:
        from crowdmix.shuffler.errors import StoreOutcomeUnknown

        self.attempts.extend(writes)
        raise StoreOutcomeUnknown("redis: TimeoutError: timed out")


class BuggyStore(UnconfirmedStore):
    """A store whose write fails with an unexpected exception (a bug, not a store error)."""

    def append(self, writes: Sequence[PendingWrite]) -> None:
        self.attempts.extend(writes)
        raise RuntimeError("bug")


@pytest.mark.parametrize("store_class", [UnconfirmedStore, BuggyStore])
def test_an_unconfirmed_write_is_deadline_exceeded_not_unavailable(
    store_class: type[UnconfirmedStore],
) -> None:
    """A write that may have run (no reply, or a store bug mid-write) is
    DEADLINE_EXCEEDED, not UNAVAILABLE; the SDK retries it with the same report id
    (the aggregator drops a repeated id, so the retry cannot count the report twice)."""
    from crowdmix.client.errors import TransportError
    from crowdmix.client.report import Report
    from crowdmix.client.transport import ShufflerClient
    from crowdmix.shuffler.columns import decode_chunks

    registry = make_registry()
    fp = registry[RAPPOR].fingerprint
    store = store_class()
    with serving(registry, store, None, settings=ShufflerSettings()) as (handle, stub):
        with pytest.raises(grpc.RpcError) as err:
            stub.Submit(columns_request(np.arange(10), fp), timeout=10)
        # the SDK's transport retries it (same report id each time), then keeps it queued
        sdk = ShufflerClient(
            f"127.0.0.1:{handle.port}",
            max_attempts=3,
            backoff_base=0.01,
            sealing="off",  # a plaintext shuffler
        )
        nb = registry[RAPPOR].report_bytes
        report = Report(metric=RAPPOR, cohort=0, bits=bytes(nb), params_fingerprint=fp)
        sdk.submit(report)
        with pytest.raises(TransportError, match="DEADLINE_EXCEEDED"):
            sdk.flush()
        assert sdk.failed == 0 and sdk.queued == 1  # kept for the next flush, same id
        sdk.close(flush=False)
    assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert err.value.details().startswith("store_outcome_unknown")
    assert "Traceback" not in err.value.details() and "bug" not in err.value.details()
    assert handle.metrics.rejected_requests.labels("store_outcome_unknown")._value.get() == 4
    sdk_ids = [decode_chunks(w.blob).report_ids() for w in store.attempts[1:]]
    assert sdk_ids == [report.report_id] * 3 and len(report.report_id) == 16


def _submit_a_batch_the_aggregator_refuses(
    registry: Registry, stub: Any, aggregator: RecordingAggregator
) -> None:
    """20 reports of OUE, a metric the aggregator refuses: one batch, refused once."""
    aggregator.refuse = {OUE}
    oue = pb.ReportColumns(
        metric=OUE, params_fingerprint=registry[OUE].fingerprint, count=20, report_bytes=1,
        cohorts=[0] * 20, bits=b"\x01" * 20,
    )  # fmt: skip
    stub.Submit(submit_request(columns=[oue]), timeout=10)
    wait_for(lambda: aggregator.refused == 1)


def test_a_refused_batch_is_parked_not_retried_forever(aggregator: RecordingAggregator) -> None:
    registry = make_registry(min_batch=10, max_batch=100, max_delay=0.01)
    store = MemoryStore()
    with serving(registry, store, aggregator.target, settings=FAST) as (handle, stub):
        _submit_a_batch_the_aggregator_refuses(registry, stub, aggregator)
        fp = registry[RAPPOR].fingerprint
        stub.Submit(columns_request(np.arange(30, dtype=np.int64), fp), timeout=10)
        wait_for(lambda: aggregator.total() == 30)  # other releases are not blocked
        time.sleep(0.2)
    assert aggregator.refused == 1  # not re-sent in a loop
    assert len(store.inflight_ids(OUE)) == 1  # kept for the next start-up
    assert handle.metrics.parked_batches._value.get() == 1


def test_a_refused_batch_is_offered_again_after_parked_retry_seconds(
    aggregator: RecordingAggregator,
) -> None:
    """Once the aggregator takes it (an operator fixed its registry), the parked batch
    is delivered without a restart, and the gauge goes back to 0."""
    registry = make_registry(min_batch=10, max_batch=100, max_delay=0.01)
    store = MemoryStore()
    settings = ShufflerSettings(tick_seconds=0.01, parked_retry_seconds=0.5)
    with serving(registry, store, aggregator.target, settings=settings) as (handle, stub):
        _submit_a_batch_the_aggregator_refuses(registry, stub, aggregator)
        # the gauge moves when the refusal reaches the shuffler, just after the count
        wait_for(lambda: handle.metrics.parked_batches._value.get() == 1)
        aggregator.refuse = set()
        wait_for(lambda: aggregator.total() == 20)
        wait_for(lambda: not store.inflight_ids(OUE))
    assert aggregator.refused == 1
    assert handle.metrics.parked_batches._value.get() == 0


def test_a_store_error_while_retrying_parked_batches_keeps_them_parked() -> None:
    from crowdmix.shuffler.errors import ForwardError, StoreUnavailable
    from crowdmix.shuffler.forwarding import Releaser
    from crowdmix.shuffler.metrics import ShufflerMetrics
    from crowdmix.shuffler.store import InFlightBatch

    class FlakyStore(MemoryStore):
        fail = False

        def load_inflight(self, metric: str, batch_id: bytes) -> InFlightBatch | None:
            if self.fail:
                raise StoreUnavailable("redis: down")
            return super().load_inflight(metric, batch_id)

    registry = make_registry(min_batch=10, max_batch=100)
    key = QueueKey(window=registry.window_of(time.time()), fingerprint=registry[RAPPOR].fingerprint)
    store = FlakyStore()
    store.append([PendingWrite.of(RAPPOR, key, ids_chunk(np.arange(20, dtype=np.int64)))])
    refuse, sent = [True], []

    def send(batch: InFlightBatch) -> None:
        if refuse[0]:
            raise ForwardError("refused", retryable=False)
        sent.append(batch)

    metrics = ShufflerMetrics()
    releaser = Releaser(registry, store, send, metrics=metrics, parked_retry_seconds=0.0)
    releaser.run_once(lambda: True, final=True)
    assert len(releaser.parked) == 1 and metrics.parked_batches._value.get() == 1
    store.fail = True
    with pytest.raises(StoreUnavailable):
        releaser.retry_parked(lambda: True)
    assert len(releaser.parked) == 1 and metrics.parked_batches._value.get() == 1  # not forgotten
    store.fail, refuse[0] = False, False
    assert releaser.retry_parked(lambda: True) == 1
    assert not releaser.parked and metrics.parked_batches._value.get() == 0
    assert len(sent) == 1 and sorted(ids_of(sent[0].chunk)) == list(range(20))
    assert not store.inflight_ids(RAPPOR)


class VerySlowStore(MemoryStore):
    """Writes take a second: a shutdown begins while one is in progress."""

    def append(self, writes: Sequence[PendingWrite]) -> None:
        time.sleep(1.0)
        super().append(writes)


def test_shutdown_mid_write_acknowledges_every_stored_report() -> None:
    """stop() with a grace shorter than the write: gRPC would answer calls it cancels
    UNAVAILABLE ("nothing stored, retry"), so the write in progress must finish and its
    callers get their answer first; calls refused meanwhile store nothing."""
    import threading

    registry = make_registry()
    fp = registry[RAPPOR].fingerprint
    store = VerySlowStore()
    handle = start_shuffler(registry, store, None, settings=ShufflerSettings())
    with grpc.insecure_channel(f"127.0.0.1:{handle.port}") as ch:
        stub = crowdmix_pb2_grpc.ShufflerStub(ch)
        futures = [
            stub.Submit.future(columns_request(np.arange(10, dtype=np.int64), fp), timeout=20)
            for _ in range(30)
        ]
        time.sleep(0.3)  # the first write is in progress, the rest are waiting for it
        stopper = threading.Thread(target=handle.stop, kwargs={"grace": 0.1})
        stopper.start()
        codes = [f.code() for f in futures]
        stopper.join(30)
    ok = codes.count(grpc.StatusCode.OK)
    assert ok >= 1
    assert set(codes) <= {grpc.StatusCode.OK, grpc.StatusCode.UNAVAILABLE}
    assert sum(store.pending(RAPPOR).values()) == 10 * ok  # stored iff acknowledged


def test_a_queue_forwards_two_batches_at_once_and_every_one_before_the_pass_ends() -> None:
    """Once the aggregator has taken a batch, the next two are sent at once: they meet at a
    barrier (one at a time, it would time out); the pass returns only when every batch it
    took is acknowledged, each report forwarded once. One in flight keeps the old order."""
    import threading

    from crowdmix.shuffler.forwarding import Releaser
    from crowdmix.shuffler.store import InFlightBatch

    registry = make_registry(min_batch=10, max_batch=100)
    key = QueueKey(window=registry.window_of(time.time()), fingerprint=registry[RAPPOR].fingerprint)
    for in_flight in (2, 1):
        store = MemoryStore()
        store.append([PendingWrite.of(RAPPOR, key, ids_chunk(np.arange(500, dtype=np.int64)))])
        meet = threading.Barrier(2, timeout=20)
        sent: list[InFlightBatch] = []

        def send(
            batch: InFlightBatch,
            meet: threading.Barrier | None = meet if in_flight == 2 else None,
            sent: list[InFlightBatch] = sent,
        ) -> None:
            if meet is not None and sent:  # the first alone: nothing is known to answer yet
                meet.wait()  # BrokenBarrierError here: the forwards did not overlap
            sent.append(batch)

        releaser = Releaser(registry, store, send, forwards_in_flight=in_flight)
        assert releaser.run_once(lambda: False) == 5
        assert sorted(int(i) for b in sent for i in ids_of(b.chunk)) == list(range(500))
        assert not store.inflight_ids(RAPPOR) and not store.pending(RAPPOR)
    with pytest.raises(ValueError, match="forwards_in_flight"):
        Releaser(registry, MemoryStore(), lambda b: None, forwards_in_flight=0)


_EXIT_WHILE_FORWARDING = """
import threading, time
import numpy as np
from crowdmix.shuffler.errors import ForwardError
from crowdmix.shuffler.forwarding import Releaser
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.store import PendingWrite, QueueKey
from tests.shuffler.helpers import RAPPOR, make_registry
from tests.shuffler.test_pipeline import ids_chunk

registry = make_registry(min_batch=10, max_batch=100)
key = QueueKey(window=registry.window_of(time.time()), fingerprint=registry[RAPPOR].fingerprint)
store = MemoryStore()
store.append([PendingWrite.of(RAPPOR, key, ids_chunk(np.arange(500, dtype=np.int64)))])
tried = threading.Event()

def send(batch):
    tried.set()
    raise ForwardError("aggregator down")

releaser = Releaser(registry, store, send)
run = dict(tick=0.05, grace=1.0)
threading.Thread(target=releaser.run, args=(threading.Event(),), kwargs=run, daemon=True).start()
assert tried.wait(60)
"""


def test_the_process_can_exit_while_a_forward_retries() -> None:
    """The releaser is a daemon thread: a process that ends without stopping it (a failed
    start-up step after the releaser started) must not wait forever for a forward that
    retries an unreachable aggregator; the batch stays in flight for the next start-up."""
    import subprocess
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_WHILE_FORWARDING],
        env=env,
        capture_output=True,
        timeout=60,  # a hang fails here; an exit takes well under a second
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]


_EXIT_WHILE_WRITING = """
import asyncio, sys, threading, time
import numpy as np
from crowdmix.shuffler.commit import GroupCommitter
from crowdmix.shuffler.redis_store import RedisStore
from tests.shuffler.helpers import RAPPOR, make_registry
from tests.shuffler.test_pipeline import ids_chunk

writing = threading.Event()

class ThreadWrittenStore(RedisStore):
    def async_appender(self):
        return None  # the committer writes from its writer thread

    def append(self, writes):
        writing.set()
        super().append(writes)  # waits on the paused Redis

registry = make_registry()
window = registry.window_of(time.time())
parts = {(RAPPOR, registry[RAPPOR].fingerprint, window): ids_chunk(np.arange(10, dtype=np.int64))}

async def main():
    committer = GroupCommitter(ThreadWrittenStore(sys.argv[1], timeout=600), registry)
    asyncio.get_running_loop().create_task(committer.commit(parts))
    assert await asyncio.to_thread(writing.wait, 60)

asyncio.run(main())  # returns without aclose: a failed start-up step
"""


def test_the_process_can_exit_while_a_store_write_waits(private_redis: RedisServer) -> None:
    """The committer writes from a daemon thread when the store has no event-loop
    appender: a process that ends without closing it must not wait at exit for a write
    stuck on a Redis that does not answer (here paused for writes)."""
    import subprocess
    import sys

    import redis

    client = redis.Redis.from_url(private_redis.url)
    client.execute_command("CLIENT", "PAUSE", 120_000, "WRITE")
    try:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        done = subprocess.run(
            [sys.executable, "-c", _EXIT_WHILE_WRITING, private_redis.url],
            env=env,
            capture_output=True,
            timeout=60,  # a hang fails here; an exit takes well under a second
            check=False,
        )
    finally:
        client.execute_command("CLIENT", "UNPAUSE")
        client.close()
    assert done.returncode == 0, done.stderr.decode()[-2000:]
