"""The Redis store's per-process index of report ids against a real redis-server: it must
notice a list that lost its tail and was refilled (F1), keep only recent windows in
memory (F4), and bound its retries (F7)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import redis

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.daemon.ingest import IngestBatch, Ingestor
from crowdmix.aggregator.errors import StoreUnavailable
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.core.registry import Registry
from tests.service.helpers import direct_count, random_batch, write_registry
from tests.service.test_store_contract import rows, same, with_ids

P = "crowdmix:agg:{pages}:"


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return write_registry(tmp_path)[1]


@pytest.fixture
def raw(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()


def fresh(rng: np.random.Generator, registry: Registry, n: int, window: int) -> IngestBatch:
    config = registry["pages"]
    return with_ids(random_batch(rng, config, n, window=window), rng.integers(0, 256, (n, 16)))


def lose_last_batch(raw: redis.Redis, batch: IngestBatch) -> None:
    """What Redis forgets when it loses its last write (an AOF with appendfsync everysec
    after a power cut, or a failover to a replica that lagged): every key the apply
    script changed for ``batch``."""
    w = f"w:{batch.window}:"
    raw.rpop(P + w + "rids")
    raw.rpop(P + w + "rtails")
    raw.decrby(P + w + "nrids", batch.count)
    raw.srem(P + "ids", batch.batch_id)
    raw.srem(P + w + "batches", batch.batch_id)
    raw.hdel(P + w + "deltas", batch.batch_id)
    raw.hincrby(P + w + "sizes", str(batch.count), -1)


def test_an_index_whose_list_lost_its_tail_and_was_refilled_is_rebuilt(
    redis_url: str, raw: redis.Redis, registry: Registry
) -> None:
    """exp_stale.py: process A counted x0 and x1; Redis loses x1; process B counts x2,
    so the list has its old length again. A must neither count x2's reports a second
    time nor drop x1's re-sent reports (they are no longer counted anywhere)."""
    rng = np.random.default_rng(31)
    clock = lambda: 5 * registry.window_seconds  # noqa: E731
    a, b = RedisCountStore.from_url(redis_url), RedisCountStore.from_url(redis_url)
    ia, ib = Ingestor(registry, a, clock=clock), Ingestor(registry, b, clock=clock)
    x0, x1, x2 = (fresh(rng, registry, 100, 5) for _ in range(3))
    assert (ia.ingest(x0).applied, ia.ingest(x1).applied) == (100, 100)
    lose_last_batch(raw, x1)
    assert ib.ingest(x2).applied == 100
    assert raw.llen(P + "w:5:rids") == 2  # the length A synced: only the tail tells
    retry = ia.ingest(rows(x2, np.arange(100)))  # a device retried x2's reports, via A
    assert (retry.applied, retry.duplicate_reports) == (0, 100)
    resent = ia.ingest(x1)  # the shuffler re-sends x1: its reports are counted nowhere now
    assert (resent.applied, resent.duplicate, resent.duplicate_reports) == (100, False, 0)
    assert a.index_rebuilds >= 1
    assert same(a.load("pages"), direct_count(registry["pages"], [x0, x1, x2]))
    # and the rebuilt index is right: every report of the three batches is a duplicate now
    again = ia.ingest(rows(x0, np.arange(100)))
    assert (again.applied, again.duplicate_reports) == (0, 100)
    a.close()
    b.close()


def test_retention_deletes_a_windows_tails_with_its_ids(
    redis_url: str, raw: redis.Redis, registry: Registry
) -> None:
    """One tail per id blob, kept in step by the apply script and deleted with the ids."""
    rng = np.random.default_rng(35)
    clock = lambda: 5 * registry.window_seconds  # noqa: E731
    a = RedisCountStore.from_url(redis_url)
    ia = Ingestor(registry, a, clock=clock)
    x0, x1 = (fresh(rng, registry, 50, 5) for _ in range(2))
    assert ia.ingest(x0).applied == 50
    assert ia.ingest(x1).applied == 50
    assert raw.llen(P + "w:5:rtails") == raw.llen(P + "w:5:rids") == 2
    assert a.dispose_ids("pages", 7) > 0
    assert not raw.exists(P + "w:5:rtails", P + "w:5:rids")
    a.close()


def test_a_lost_tail_refilled_past_the_old_length_is_noticed_on_read(
    redis_url: str, raw: redis.Redis, registry: Registry
) -> None:
    """The list regrows beyond what A synced: A verifies the last blob it read before it
    reads only the new ones."""
    rng = np.random.default_rng(32)
    clock = lambda: 5 * registry.window_seconds  # noqa: E731
    a, b = RedisCountStore.from_url(redis_url), RedisCountStore.from_url(redis_url)
    ia, ib = Ingestor(registry, a, clock=clock), Ingestor(registry, b, clock=clock)
    x0, x1, x2, x3 = (fresh(rng, registry, 60, 5) for _ in range(4))
    ia.ingest(x0)
    ia.ingest(x1)
    lose_last_batch(raw, x1)
    ib.ingest(x2)
    ib.ingest(x3)  # three blobs now: x0, x2, x3
    r1 = ia.ingest(x1)
    assert (r1.applied, r1.duplicate_reports) == (60, 0)
    r2 = ia.ingest(rows(x2, np.arange(60)))
    assert (r2.applied, r2.duplicate_reports) == (0, 60)
    assert same(a.load("pages"), direct_count(registry["pages"], [x0, x1, x2, x3]))
    a.close()
    b.close()


def test_only_recent_windows_stay_cached_and_a_late_batch_is_still_deduplicated(
    redis_url: str, registry: Registry
) -> None:
    """F4: the index of an old window is evicted; a late batch for it rebuilds the index
    from Redis (read in pages) and is de-duplicated exactly."""
    rng = np.random.default_rng(33)
    store = RedisCountStore.from_url(redis_url, cached_windows=2, page_blobs=2)
    ingestor = Ingestor(registry, store, clock=lambda: 9 * registry.window_seconds)
    old = [fresh(rng, registry, 50, 5) for _ in range(5)]  # 5 blobs: 3 pages of 2
    for b in old:
        assert ingestor.ingest(b).applied == 50
    recent = [fresh(rng, registry, 40, w) for w in (7, 8, 9)]
    for b in recent:
        assert ingestor.ingest(b).applied == 40
    assert sorted(w for (_, w) in store._id_cache) == [8, 9]  # the two most recent
    rebuilds = store.index_rebuilds
    late_new = fresh(rng, registry, 30, 5)
    # 20 reports of old[0], 20 of old[4] (in different pages), 30 new
    late = concat(rows(old[0], np.arange(20)), rows(old[4], np.arange(30, 50)), late_new)
    result = ingestor.ingest(late)
    assert (result.applied, result.duplicate_reports) == (30, 40)
    assert store.index_rebuilds > rebuilds
    assert sorted(w for (_, w) in store._id_cache) == [8, 9]  # the late one is not kept
    assert same(store.load("pages"), direct_count(registry["pages"], [*old, *recent, late_new]))
    store.close()


def concat(*parts: IngestBatch) -> IngestBatch:
    return replace(
        parts[0],
        batch_id=os.urandom(16),
        count=sum(p.count for p in parts),
        cohorts=np.concatenate([p.cohorts for p in parts]),
        bits=b"".join(p.bits for p in parts),
        report_ids=b"".join(p.report_ids for p in parts),
    )


def test_apply_retries_are_bounded_and_counts_without_ids_never_check_the_list(
    redis_url: str, raw: redis.Redis, registry: Registry
) -> None:
    """F7: another process appends ids before each of our script runs: the apply gives up
    after ``max_apply_attempts`` with StoreUnavailable (nothing counted) instead of
    looping; counts applied without report ids (``CountStore.apply``) do not check it."""
    rng = np.random.default_rng(34)
    store = RedisCountStore.from_url(redis_url, max_apply_attempts=3)
    ingestor = Ingestor(registry, store, clock=lambda: 5 * registry.window_seconds)
    real = store._apply

    def contended(*args: Any, **kwargs: Any) -> Any:  # another process, just in time
        blob = os.urandom(16)  # its ids, and their tail beside them as its apply keeps it
        raw.rpush(P + "w:5:rids", blob)
        raw.rpush(P + "w:5:rtails", blob + blob + b"16")
        return real(*args, **kwargs)

    store._apply = contended  # type: ignore[assignment]
    batch = fresh(rng, registry, 20, 5)
    with pytest.raises(StoreUnavailable, match="3 attempts"):
        ingestor.ingest(batch)
    assert store.apply_retries == 3
    assert store.load("pages") is None and not store.is_applied("pages", batch.batch_id)
    plain = random_batch(rng, registry["pages"], 20, window=5)
    counts = accumulator_for(registry["pages"])
    counts.add(plain.cohorts, np.frombuffer(plain.bits, np.uint8).reshape(20, -1))
    assert store.apply("pages", 5, plain.batch_id, registry["pages"].fingerprint, counts)
    store._apply = real  # type: ignore[assignment]
    assert ingestor.ingest(batch).applied == 20
    store.close()


def test_four_processes_apply_overlapping_and_resent_batches_concurrently(
    redis_url: str, registry: Registry
) -> None:
    """exp_concurrent.py: four stores (own caches, locks, connections: four aggregator
    processes) on one Redis apply overlapping batches and re-sent batch ids from four
    threads: every report of the pool is counted exactly once."""
    import threading

    rng = np.random.default_rng(35)
    config = registry["pages"]
    pool = fresh(rng, registry, 1200, 5)
    picks = [rng.choice(1200, size=300, replace=False) for _ in range(24)] + [np.arange(1200)]
    batches = [rows(pool, np.sort(p)) for p in picks]
    batches += batches[:6]  # the shuffler re-offers some batches
    order = rng.permutation(len(batches))
    stores = [RedisCountStore.from_url(redis_url) for _ in range(4)]
    clock = lambda: 5 * registry.window_seconds  # noqa: E731
    counted: list[int] = []
    barrier = threading.Barrier(4)

    def worker(i: int) -> None:
        ingestor = Ingestor(registry, stores[i], clock=clock)
        barrier.wait()
        for j in order[i::4]:
            counted.append(ingestor.ingest(batches[j]).applied)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counted) == 1200
    assert same(stores[0].load("pages"), direct_count(config, [pool]))
    for s in stores:
        s.close()


def test_the_apply_script_itself_refuses_a_list_refilled_after_the_read(
    redis_url: str, raw: redis.Redis, registry: Registry
) -> None:
    """The loss and the refill happen between A's read of the lists and its apply script
    (a failover in that instant): the script compares the last blob, not only the length,
    so A reads again instead of counting B's reports a second time."""
    rng = np.random.default_rng(36)
    clock = lambda: 5 * registry.window_seconds  # noqa: E731
    a, b = RedisCountStore.from_url(redis_url), RedisCountStore.from_url(redis_url)
    ia, ib = Ingestor(registry, a, clock=clock), Ingestor(registry, b, clock=clock)
    x0, x1, z = (fresh(rng, registry, 100, 5) for _ in range(3))
    ia.ingest(x0)
    ia.ingest(x1)
    real = a._apply
    fired: list[int] = []

    def failover_first(*args: Any, **kwargs: Any) -> Any:
        if not fired:
            fired.append(1)
            lose_last_batch(raw, x1)
            assert ib.ingest(z).applied == 100  # the list has A's length again
        return real(*args, **kwargs)

    a._apply = failover_first  # type: ignore[assignment]
    retry = ia.ingest(rows(z, np.arange(100)))
    assert (retry.applied, retry.duplicate_reports) == (0, 100)
    assert a.apply_retries == 1
    assert same(a.load("pages"), direct_count(registry["pages"], [x0, z]))
    a.close()
    b.close()


def test_ids_another_process_appends_between_the_read_and_the_apply_are_checked(
    redis_url: str, registry: Registry
) -> None:
    """Process A has read window 6's list while applying a batch; process B then counts
    the retries (also window 6: a report keeps its window) of the reports A applies next;
    B's append lands between A's read of the list and A's apply script. The script
    compares the list, so A reads again and drops every first copy: each counts once."""
    rng = np.random.default_rng(40)
    clock = lambda: 6 * registry.window_seconds  # noqa: E731
    a, b = RedisCountStore.from_url(redis_url), RedisCountStore.from_url(redis_url)
    ia, ib = Ingestor(registry, a, clock=clock), Ingestor(registry, b, clock=clock)
    warm = fresh(rng, registry, 10, 6)
    assert ia.ingest(warm).applied == 10
    first = fresh(rng, registry, 60, 6)
    retry = replace(first, batch_id=os.urandom(16))
    real = a._apply
    fired: list[int] = []

    def retry_lands_first(*args: Any, **kwargs: Any) -> Any:
        if not fired:
            fired.append(1)
            assert ib.ingest(retry).applied == 60
        return real(*args, **kwargs)

    a._apply = retry_lands_first  # type: ignore[assignment]
    late = ia.ingest(first)
    assert (late.applied, late.duplicate_reports) == (0, 60)
    assert a.apply_retries == 1
    assert same(a.load("pages"), direct_count(registry["pages"], [warm, retry]))
    a.close()
    b.close()
