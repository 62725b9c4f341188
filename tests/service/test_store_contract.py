"""One contract suite, run against every count store backend (memory and real Redis)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.counting.basic import IndexCounts
from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.aggregator.daemon.ingest import IngestBatch, Ingestor
from crowdmix.aggregator.errors import InvalidBatch, ParamsConflict, WindowDisposed
from crowdmix.aggregator.store import load_batch_sizes, load_counts, stored_metric
from crowdmix.aggregator.store.base import NO_REPORT_IDS, CountStore, StoredCounts
from crowdmix.aggregator.store.codec import (
    decode_counts,
    describe_metric,
    encode_counts,
    metric_from_description,
)
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.core.registry import MetricConfig, Registry
from tests.service.helpers import direct_count, random_batch, write_registry


@pytest.fixture
def registry(tmp_path: Path) -> Registry:
    return write_registry(tmp_path)[1]


@pytest.fixture(params=["memory", "redis", "rediss", "unix", "cluster"])
def store(request: pytest.FixtureRequest) -> Iterator[CountStore]:
    """Memory, and Redis over every URL kind the store accepts (``redis://``,
    ``rediss://`` with client certificates, ``unix://``, ``redis+cluster://``: a 3-master
    cluster)."""
    if request.param == "memory":
        s: CountStore = MemoryCountStore()
    else:
        # fold_chunk=3 so folding takes several rounds in these small tests
        url = request.getfixturevalue(f"{request.param}_url")
        s = RedisCountStore.from_url(url, fold_chunk=3)
    yield s
    s.close()


def counts_of(registry: Registry, metric: str, rng: np.random.Generator, n: int) -> CohortCounts:
    config = registry[metric]
    b = random_batch(rng, config, n, window=1)
    acc = accumulator_for(config)
    acc.add(b.cohorts, np.frombuffer(b.bits, np.uint8).reshape(n, config.report_bytes))
    assert isinstance(acc, CohortCounts)
    return acc


def same(a: StoredCounts | None, b: CohortCounts | StoredCounts) -> bool:
    assert a is not None
    return bool(np.array_equal(a.totals, b.totals) and np.array_equal(a.ones, b.ones))


def test_apply_then_load_and_duplicate_is_counted_once(
    store: CountStore, registry: Registry
) -> None:
    rng = np.random.default_rng(1)
    fp = registry["pages"].fingerprint
    delta = counts_of(registry, "pages", rng, 300)
    assert store.load("pages") is None
    assert store.apply("pages", 7, b"a" * 16, fp, delta) is True
    assert same(store.load("pages"), delta)
    # the same id again: acknowledged as a duplicate, counted zero times (any window)
    assert store.apply("pages", 7, b"a" * 16, fp, delta) is False
    assert store.apply("pages", 8, b"a" * 16, fp, delta) is False
    assert same(store.load("pages"), delta)
    assert store.windows("pages") == [7]
    assert store.applied_batches("pages") == 1
    assert store.metrics() == ["pages"]


def test_windows_are_kept_apart_and_merge_on_request(store: CountStore, registry: Registry) -> None:
    rng = np.random.default_rng(2)
    fp = registry["pages"].fingerprint
    d1, d2, d3 = (counts_of(registry, "pages", rng, n) for n in (100, 200, 50))
    store.apply("pages", 20000, os.urandom(16), fp, d1)
    store.apply("pages", 20001, os.urandom(16), fp, d2)
    store.apply("pages", 20001, os.urandom(16), fp, d3)
    assert store.windows("pages") == [20000, 20001]
    assert same(store.load("pages", [20000]), d1)
    w2 = StoredCounts.of(d2) + StoredCounts.of(d3)
    assert same(store.load("pages", [20001]), w2)
    assert same(store.load("pages"), StoredCounts.of(d1) + w2)
    assert same(store.load("pages", [20000, 20001, 5]), StoredCounts.of(d1) + w2)
    assert store.load("pages", [5]) is None
    assert store.maintain() >= 0  # housekeeping never changes what is counted
    assert same(store.load("pages"), StoredCounts.of(d1) + w2)


def test_batch_sizes_are_recorded_once_per_batch_and_window(
    store: CountStore, registry: Registry
) -> None:
    rng = np.random.default_rng(3)
    fp = registry["pages"].fingerprint
    d1, d2, d3 = (counts_of(registry, "pages", rng, n) for n in (100, 200, 100))
    assert store.batch_sizes("pages") == {}
    store.apply("pages", 1, b"1" * 16, fp, d1)
    store.apply("pages", 2, b"2" * 16, fp, d2)
    store.apply("pages", 2, b"3" * 16, fp, d3)
    store.apply("pages", 2, b"3" * 16, fp, d3)  # a duplicate adds no batch
    assert store.maintain() >= 0  # folding keeps the sizes
    assert store.batch_sizes("pages") == {100: 2, 200: 1}
    assert store.batch_sizes("pages", [2]) == {100: 1, 200: 1}
    assert store.batch_sizes("pages", [9]) == {}
    assert load_batch_sizes(store, "pages") == [100, 100, 200]
    # The smallest same-cohort crowd of any batch, measured from its cohort totals.
    crowds = {w: min(int(t) for t in d.totals if t > 0) for w, d in ((1, d1), (2, d2))}
    crowds[2] = min(crowds[2], min(int(t) for t in d3.totals if t > 0))
    assert store.smallest_crowd("pages", [1]) == crowds[1]
    assert store.smallest_crowd("pages", [2]) == crowds[2]
    assert store.smallest_crowd("pages") == min(crowds.values())
    assert store.smallest_crowd("pages", [9]) is None


def test_metrics_have_separate_ids_and_counts(store: CountStore, registry: Registry) -> None:
    rng = np.random.default_rng(3)
    pages = counts_of(registry, "pages", rng, 100)
    other = counts_of(registry, "pages", rng, 10)
    store.apply("pages", 1, b"x" * 16, registry["pages"].fingerprint, pages)
    # the same batch id under another metric name is another batch
    assert store.apply("pages.v2", 1, b"x" * 16, 99, other) is True
    assert same(store.load("pages"), pages)
    assert same(store.load("pages.v2"), other)
    assert store.metrics() == ["pages", "pages.v2"]


def test_params_conflict_changes_nothing(store: CountStore, registry: Registry) -> None:
    rng = np.random.default_rng(4)
    fp = registry["pages"].fingerprint
    delta = counts_of(registry, "pages", rng, 100)
    store.apply("pages", 1, os.urandom(16), fp, delta)
    new_id = os.urandom(16)
    with pytest.raises(ParamsConflict, match="fingerprint"):
        store.apply("pages", 1, new_id, fp ^ 1, delta)
    assert same(store.load("pages"), delta)
    assert store.applied_batches("pages") == 1
    # the rejected id was not recorded: with the right params it applies
    assert store.apply("pages", 1, new_id, fp, delta) is True


def test_folding_keeps_counts_exact(store: CountStore, registry: Registry) -> None:
    rng = np.random.default_rng(5)
    fp = registry["pages"].fingerprint
    deltas = [counts_of(registry, "pages", rng, int(n)) for n in rng.integers(1, 400, 20)]
    expected = StoredCounts.of(deltas[0])
    for i, d in enumerate(deltas):
        store.apply("pages", 3, os.urandom(16), fp, d)
        if i:
            expected = expected + StoredCounts.of(d)
        if i % 7 == 0:
            store.maintain()
            assert same(store.load("pages"), expected)
    store.maintain()
    assert same(store.load("pages"), expected)
    if isinstance(store, RedisCountStore):
        assert store.pending("pages", 3) == 0


def test_concurrent_threads_apply_each_batch_once(store: CountStore, registry: Registry) -> None:
    """8 threads re-send overlapping batch ids while one thread folds: each id counted once."""
    rng = np.random.default_rng(6)
    fp = registry["pages"].fingerprint
    batches = [(os.urandom(16), counts_of(registry, "pages", rng, 50)) for _ in range(40)]
    expected = StoredCounts.of(batches[0][1])
    for _, d in batches[1:]:
        expected = expected + StoredCounts.of(d)
    outcomes: list[bool] = []
    lock = threading.Lock()
    stop = threading.Event()

    def sender(seed: int) -> None:
        order = np.random.default_rng(seed).permutation(len(batches))
        for i in order[: len(batches) // 2 + seed]:
            bid, d = batches[int(i)]
            ok = store.apply("pages", 4, bid, fp, d)
            with lock:
                outcomes.append(ok)

    def folder() -> None:
        while not stop.is_set():
            store.maintain()

    f = threading.Thread(target=folder)
    f.start()
    threads = [threading.Thread(target=sender, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        # every batch once more, from here: only the ones nobody sent yet apply
        for bid, d in batches:
            with lock:
                outcomes.append(store.apply("pages", 4, bid, fp, d))
    finally:  # a store that raises fails the test, not hangs the run on the folder
        stop.set()
        f.join()
    assert sum(outcomes) == len(batches)  # exactly one "applied" per id
    assert same(store.load("pages"), expected)
    assert store.applied_batches("pages") == len(batches)


def test_load_counts_returns_the_metrics_accumulator(store: CountStore, registry: Registry) -> None:
    rng = np.random.default_rng(7)
    config = registry["browser"]
    batches = [random_batch(rng, config, 200, window=9) for _ in range(3)]
    ingestor = Ingestor(registry, store, clock=lambda: 9 * registry.window_seconds)
    for b in batches:
        ingestor.ingest(b)
    counts = load_counts(store, config)
    assert isinstance(counts, IndexCounts)
    assert counts == direct_count(config, batches)
    plain = load_counts(store, "browser", windows=[9])
    assert np.array_equal(plain.ones, counts.ones)
    with pytest.raises(LookupError, match="browser"):
        load_counts(store, "browser", windows=[10])
    with pytest.raises(LookupError, match="no counts stored"):
        load_counts(store, "unknown")


def test_load_counts_from_a_redis_url(redis_url: str, registry: Registry) -> None:
    rng = np.random.default_rng(8)
    store = RedisCountStore.from_url(redis_url)
    delta = counts_of(registry, "pages", rng, 500)
    store.apply("pages", 2, os.urandom(16), registry["pages"].fingerprint, delta)
    store.close()
    counts = load_counts(redis_url, registry["pages"], windows=[2])
    assert counts == delta


@settings(max_examples=60, deadline=None)
@given(
    m=st.integers(1, 5),
    k=st.integers(1, 40),
    top=st.sampled_from([0, 1, 255, 256, 65535, 65536, 2**32 - 1, 2**32, 2**40]),
    seed=st.integers(0, 2**32 - 1),
)
def test_blob_roundtrip_uses_the_narrowest_dtype(m: int, k: int, top: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    totals = rng.integers(0, top + 1, size=m, dtype=np.int64)
    ones = rng.integers(0, top + 1, size=(m, k), dtype=np.int64)
    ones.flat[0] = top
    blob = encode_counts(StoredCounts(totals, ones))
    back = decode_counts(blob)
    assert np.array_equal(back.totals, totals) and np.array_equal(back.ones, ones)
    width = 1 if top < 2**8 else 2 if top < 2**16 else 4 if top < 2**32 else 8
    assert len(blob) == 16 + width * m * (k + 1)


def test_the_metric_description_travels_with_the_counts(
    store: CountStore, registry: Registry
) -> None:
    rng = np.random.default_rng(9)
    for name in ("pages", "browser"):
        config = registry[name]
        assert store.description(name) is None
        ingestor = Ingestor(registry, store, clock=lambda: 3 * registry.window_seconds)
        ingestor.ingest(random_batch(rng, config, 50, window=3))
        restored = stored_metric(store, name)
        assert restored is not None
        assert restored.fingerprint == config.fingerprint
        assert (restored.rappor, restored.basic, restored.domain) == (
            config.rappor,
            config.basic,
            config.domain,
        )
    # by name alone, the report job gets the metric's own accumulator
    assert isinstance(load_counts(store, "browser"), IndexCounts)
    changed = MetricConfig(name="pages", rappor=replace(registry["pages"].rappor, f=0.25))  # type: ignore[type-var]
    with pytest.raises(ParamsConflict, match="other params"):
        load_counts(store, changed)


@pytest.mark.parametrize("name", ["pages", "browser"])
def test_describe_metric_roundtrip(registry: Registry, name: str) -> None:
    config = registry[name]
    back = metric_from_description(name, describe_metric(config))
    assert back.fingerprint == config.fingerprint and back.encoding == config.encoding


# -- report ids ----------------------------------------------------------------


def with_ids(batch: IngestBatch, ids: np.ndarray) -> IngestBatch:
    return replace(batch, report_ids=np.ascontiguousarray(ids, dtype=np.uint8).tobytes())


def rows(batch: IngestBatch, keep: np.ndarray) -> IngestBatch:
    """The batch's reports at ``keep`` (with their ids), under a fresh batch id."""
    nb = batch.report_bytes
    bits = np.frombuffer(batch.bits, np.uint8).reshape(batch.count, nb)[keep]
    ids = np.frombuffer(batch.report_ids, np.uint8).reshape(batch.count, 16)[keep]
    return replace(
        batch,
        batch_id=os.urandom(16),
        count=int(bits.shape[0]),
        cohorts=batch.cohorts[keep],
        bits=bits.tobytes(),
        report_ids=ids.tobytes(),
    )


def test_a_report_id_counted_before_in_its_window_is_dropped_atomically(
    store: CountStore, registry: Registry
) -> None:
    """A device retried: some reports arrive again in a later batch (and within one
    batch); each counts once, the rest of the batch counts, nothing is half-applied."""
    rng = np.random.default_rng(21)
    config = registry["pages"]
    ingestor = Ingestor(registry, store, clock=lambda: 5 * registry.window_seconds)
    first = with_ids(random_batch(rng, config, 400, window=5), rng.integers(0, 256, (400, 16)))
    assert ingestor.ingest(first).applied == 400
    # a second batch: 100 repeats of the first, 150 new reports, and 50 repeats of those
    fresh = with_ids(random_batch(rng, config, 150, window=5), rng.integers(0, 256, (150, 16)))
    second = rows(
        replace(
            fresh,
            count=550,
            cohorts=np.concatenate([first.cohorts, fresh.cohorts]),
            bits=first.bits + fresh.bits,
            report_ids=first.report_ids + fresh.report_ids,
        ),
        np.concatenate([np.arange(100, 200), 400 + np.arange(150), 400 + np.arange(50)]),
    )
    result = ingestor.ingest(second)
    assert (result.applied, result.duplicate_reports) == (150, 150)
    assert same(store.load("pages"), direct_count(config, [first, fresh]))
    # the same batch again is a duplicate batch: nothing more
    assert ingestor.ingest(second).duplicate
    # the same ids in the next window are other reports: a report names its window and
    # every copy of it is filed there, so de-duplication is within one window
    later = Ingestor(registry, store, clock=lambda: 6 * registry.window_seconds)
    assert later.ingest(replace(first, batch_id=os.urandom(16), window=6)).applied == 400
    assert store.batch_sizes("pages", [5]) == {400: 1, 150: 1}


def test_ids_sharing_their_first_8_bytes_are_other_reports_and_the_first_copy_counts(
    store: CountStore, registry: Registry
) -> None:
    """Within a batch, ids equal in their first 8 bytes but not their last are distinct
    reports; a repeated id counts once, as its first copy (the others are dropped)."""
    rng = np.random.default_rng(22)
    config = registry["pages"]
    ingestor = Ingestor(registry, store, clock=lambda: 5 * registry.window_seconds)
    ids = rng.integers(0, 256, (300, 16), dtype=np.uint8)
    ids[100:200, :8] = ids[:100, :8]  # 100 pairs that differ in their last 8 bytes only
    batch = with_ids(random_batch(rng, config, 300, window=5), ids)
    again = rows(batch, np.r_[np.arange(300), np.arange(150, 250)])  # 100 ids twice...
    bits = np.frombuffer(again.bits, np.uint8).reshape(400, -1).copy()
    bits[300:] = np.roll(bits[300:], 1, axis=0)  # ...their second copies with other bits
    result = ingestor.ingest(replace(again, bits=bits.tobytes()))
    assert (result.applied, result.duplicate_reports) == (300, 100)
    assert same(store.load("pages"), direct_count(config, [batch]))


def test_a_batch_without_report_ids_or_with_a_zero_id_is_refused(
    store: CountStore, registry: Registry
) -> None:
    """Every report carries an id: a batch without them, or with an all-zero one, is
    refused as a whole and leaves nothing behind."""
    rng = np.random.default_rng(22)
    config = registry["pages"]
    ingestor = Ingestor(registry, store, clock=lambda: 5 * registry.window_seconds)
    batch = random_batch(rng, config, 100, window=5)
    zero = batch.report_ids[:160] + bytes(16) + batch.report_ids[176:]
    for bad, reason in ((b"", "length"), (zero, "report_id")):
        with pytest.raises(InvalidBatch) as info:
            ingestor.ingest(replace(batch, report_ids=bad))
        assert info.value.reason == reason
    assert store.load("pages") is None and store.applied_batches("pages") == 0
    assert ingestor.ingest(batch).applied == 100


def test_retention_deletes_the_ids_of_old_windows_and_refuses_their_batches(
    store: CountStore, registry: Registry
) -> None:
    rng = np.random.default_rng(23)
    config = registry["pages"]
    day = registry.window_seconds
    now = [10 * day]
    ingestor = Ingestor(registry, store, clock=lambda: now[0])
    old = with_ids(random_batch(rng, config, 50, window=10), rng.integers(0, 256, (50, 16)))
    assert ingestor.ingest(old).applied == 50
    assert store.applied_batches("pages") == 1
    # past disposal_days plus one window: the ids go, the counts stay
    now[0] += config.shuffle.disposal_days * 86400 + 2 * day
    assert ingestor.dispose_ids() == 51  # one batch id, 50 report ids
    assert store.applied_batches("pages") == 0
    assert same(store.load("pages"), direct_count(config, [old]))
    # the batch comes back (a shuffler with a wrong clock): refused, not counted twice
    with pytest.raises(InvalidBatch, match="disposal_days"):
        ingestor.ingest(old)
    # and the store refuses it by itself too (a race with an ingest that passed the check)
    with pytest.raises(WindowDisposed):
        store.apply(
            "pages", 10, os.urandom(16), config.fingerprint, counts_of(registry, "pages", rng, 5)
        )
    assert same(store.load("pages"), direct_count(config, [old]))


class _LookTogether:
    """The store, but ``is_applied`` answers only once both deliveries of a batch have
    looked: two gRPC workers given the same batch at once, both past the Ingestor's cheap
    look (it is not atomic with the apply), so the store's own batch-id check in
    ``apply_reports`` must answer the second. Everything else is the store's."""

    def __init__(self, store: CountStore, meet: threading.Barrier) -> None:
        self._store, self._meet = store, meet

    def is_applied(self, metric: str, batch_id: bytes) -> bool:
        seen = self._store.is_applied(metric, batch_id)
        self._meet.wait()  # BrokenBarrierError here: the two deliveries did not overlap
        return seen

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


def test_overlapping_batches_applied_concurrently_count_each_report_and_each_repeat_once(
    store: CountStore, registry: Registry
) -> None:
    """Two pairs of threads apply batches drawn from one pool of 1200 reports,
    overlapping in their report ids (applies retried when another process appended ids
    meanwhile). The two threads of a pair deliver each batch at the same moment, so the
    store's batch-id check answers one of them, and then each re-sends it (answered by
    the Ingestor's look). The drop, the count and the count of repeats are one atomic
    step, so the final counts are exactly the pool's, each report once, and the repeats
    are the reports offered once minus those counted (a re-sent batch is never a repeat,
    whichever check answers it)."""
    rng = np.random.default_rng(24)
    config = registry["pages"]
    pool = with_ids(random_batch(rng, config, 1200, window=5), rng.integers(0, 256, (1200, 16)))
    picks = [rng.choice(1200, size=300, replace=False) for _ in range(24)]
    picks.append(np.arange(1200))  # every report at least once
    batches = [rows(pool, np.sort(p)) for p in picks]
    clock = lambda: 5 * registry.window_seconds  # noqa: E731
    ingestor = Ingestor(registry, store, clock=clock)
    counted: list[int] = []
    raced: list[bool] = []
    resent: list[bool] = []

    def worker(mine: list[IngestBatch], meet: threading.Barrier) -> None:
        racing = Ingestor(registry, _LookTogether(store, meet), clock=clock)  # type: ignore[arg-type]
        try:
            for b in mine:
                result = racing.ingest(b)
                counted.append(result.applied)
                raced.append(result.duplicate)
                resent.append(ingestor.ingest(b).duplicate)  # a duplicate batch, not a repeat
        except BaseException:
            meet.abort()  # the other thread of the pair stops waiting at its next look
            raise

    pairs = [threading.Barrier(2, timeout=60) for _ in range(2)]
    threads = [
        threading.Thread(target=worker, args=(batches[i % 2 :: 2], pairs[i % 2])) for i in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(counted) == 1200
    # of each pair, one answered by apply_reports itself: both had passed the look
    assert len(raced) == 2 * len(batches) and raced.count(True) == len(batches)
    assert len(resent) == 2 * len(batches) and all(resent)
    assert same(store.load("pages"), direct_count(config, [pool]))
    assert store.duplicate_reports("pages", [5]) == sum(b.count for b in batches) - 1200


def test_report_id_index_finds_exactly_the_ids_it_holds() -> None:
    """The numpy hash index: exact membership over growth, ids sharing their first 8 bytes
    kept apart, the all-zero id never stored."""
    from crowdmix.aggregator.store.report_ids import ReportIdIndex

    rng = np.random.default_rng(25)
    index = ReportIdIndex(capacity=16)
    held = rng.integers(0, 256, (5000, 16), dtype=np.uint8)
    held[1::2, :8] = held[0::2, :8]  # pairs that differ only in their last 8 bytes
    for part in np.array_split(held, 7):
        index.add(part.tobytes())
    assert len(index) == 5000
    probe = np.concatenate([held[::3], rng.integers(0, 256, (2000, 16), dtype=np.uint8)])
    probe[-1] = held[1] ^ np.r_[np.zeros(8, np.uint8), np.ones(8, np.uint8)]  # same hi only
    expected = np.arange(len(held[::3]))
    assert index.present(probe.tobytes()).tolist() == expected.tolist()
    index.add(bytes(16))
    assert len(index) == 5000 and index.present(bytes(16)).size == 0


def test_two_redis_stores_sharing_redis_check_each_others_ids(redis_url: str) -> None:
    """Two aggregator processes (two stores, each with its own id cache) on one Redis:
    a report id counted through one is dropped through the other."""
    import tempfile

    registry = write_registry(Path(tempfile.mkdtemp()))[1]
    config = registry["pages"]
    rng = np.random.default_rng(26)
    a, b = (RedisCountStore.from_url(redis_url) for _ in range(2))
    clock = lambda: 5 * registry.window_seconds  # noqa: E731
    ia, ib = Ingestor(registry, a, clock=clock), Ingestor(registry, b, clock=clock)
    batch = with_ids(random_batch(rng, config, 300, window=5), rng.integers(0, 256, (300, 16)))
    assert ia.ingest(batch).applied == 300
    assert ib.ingest(rows(batch, np.arange(100, 300))).duplicate_reports == 200
    assert ia.ingest(rows(batch, np.arange(0, 50))).duplicate_reports == 50
    assert same(a.load("pages"), direct_count(config, [batch]))
    a.close()
    b.close()


def test_a_first_copy_that_arrives_after_its_retry_is_dropped(
    store: CountStore, registry: Registry
) -> None:
    """The device's first request was stored by one shuffler (reply lost), its retry by
    another, both in window 5, the window the reports name. The aggregator was down;
    when it is back, the shuffler re-sends its in-flight batches in no particular
    order, a day later: each report still counts once, in window 5."""
    rng = np.random.default_rng(31)
    config = registry["pages"]
    ingestor = Ingestor(registry, store, clock=lambda: 6 * registry.window_seconds)
    first = with_ids(random_batch(rng, config, 40, window=5), rng.integers(0, 256, (40, 16)))
    new = with_ids(random_batch(rng, config, 30, window=5), rng.integers(0, 256, (30, 16)))
    retry = replace(
        rows(first, np.arange(10, 40)),
        count=60,
        cohorts=np.concatenate([first.cohorts[10:], new.cohorts]),
        bits=first.bits[10 * first.report_bytes :] + new.bits,
        report_ids=first.report_ids[10 * 16 :] + new.report_ids,
    )
    assert ingestor.ingest(retry).applied == 60
    late = ingestor.ingest(first)
    assert (late.applied, late.duplicate_reports) == (10, 30)
    assert same(store.load("pages", [5]), direct_count(config, [first, new]))
    assert store.windows("pages") == [5]


def test_a_resent_batch_is_answered_before_it_is_counted(
    store: CountStore, registry: Registry
) -> None:
    """A batch id applied before: a duplicate, without counting the batch again (its
    reports are not even looked at once the O(1) shape checks pass), whatever changed
    since in the registry or round file it was checked against."""
    rng = np.random.default_rng(28)
    config = registry["pages"]
    counted: list[int] = []

    def accumulator(c: MetricConfig) -> CohortCounts:
        counted.append(1)
        acc = accumulator_for(c)
        assert isinstance(acc, CohortCounts)
        return acc

    ingestor = Ingestor(
        registry, store, clock=lambda: 5 * registry.window_seconds, accumulator=accumulator
    )
    batch = with_ids(random_batch(rng, config, 50, window=5), rng.integers(0, 256, (50, 16)))
    assert ingestor.ingest(batch).applied == 50
    assert store.is_applied("pages", batch.batch_id)
    assert not store.is_applied("pages", os.urandom(16))
    calls = len(counted)
    again = ingestor.ingest(batch)
    assert (again.duplicate, again.applied) == (True, 0)
    assert len(counted) == calls  # not counted a second time
    with pytest.raises(InvalidBatch):  # a bad shape is still refused
        ingestor.ingest(replace(batch, report_bytes=batch.report_bytes + 1))
    assert ingestor.ingest(replace(batch, fingerprint=batch.fingerprint ^ 1)).duplicate
    assert same(store.load("pages"), direct_count(config, [batch]))


# -- repeated report ids per window (a shuffled histogram's statement needs them) ---------


def test_reports_dropped_before_counting_are_recorded_per_window_with_the_batch(
    store: CountStore, registry: Registry
) -> None:
    """``dropped`` is added by reason to its window in the apply step, once per batch id:
    a re-sent batch, a refused one or another window's adds nothing; negative is refused."""
    rng = np.random.default_rng(37)
    fp = registry["pages"].fingerprint

    def apply(window: int, batch_id: bytes, fingerprint: int = fp, **drops: int) -> bool:
        delta = counts_of(registry, "pages", rng, 5)
        return store.apply_reports("pages", window, batch_id, fingerprint, delta,
                                   NO_REPORT_IDS, dropped=drops).applied  # fmt: skip

    assert store.dropped_reports("pages", [3]) == {}
    assert apply(3, b"a" * 16, round=4, not_authentic=1, payload=0)
    assert apply(3, b"b" * 16, round=2)
    assert not apply(3, b"a" * 16, round=4)  # re-sent: changes nothing
    with pytest.raises(ParamsConflict):
        apply(3, b"c" * 16, fingerprint=12345, round=9)
    with pytest.raises(ValueError, match="drops"):
        apply(3, b"d" * 16, round=-1)
    assert apply(4, b"e" * 16, round=1)
    assert store.dropped_reports("pages", [3]) == {"round": 6, "not_authentic": 1}
    assert store.dropped_reports("pages", [3, 4, 9]) == {"round": 7, "not_authentic": 1}


def test_repeated_report_ids_are_counted_per_window_with_the_batch(
    store: CountStore, registry: Registry
) -> None:
    """Repeats within a batch and of earlier batches of the window are counted in the
    apply step; a re-sent batch (same batch id) is not a repeat; the same ids in another
    window are not either; a refused batch adds nothing; folding and retention keep the
    count."""
    rng = np.random.default_rng(31)
    config = registry["pages"]
    day = registry.window_seconds
    now = [6 * day]
    ingestor = Ingestor(registry, store, clock=lambda: now[0])
    first = with_ids(random_batch(rng, config, 400, window=5), rng.integers(0, 256, (400, 16)))
    assert ingestor.ingest(first).applied == 400
    assert store.duplicate_reports("pages", [5]) == 0
    # 100 repeats of the first batch, 150 new reports and 50 repeats of those
    fresh = with_ids(random_batch(rng, config, 150, window=5), rng.integers(0, 256, (150, 16)))
    pool = replace(
        fresh,
        count=550,
        cohorts=np.concatenate([first.cohorts, fresh.cohorts]),
        bits=first.bits + fresh.bits,
        report_ids=first.report_ids + fresh.report_ids,
    )
    second = rows(
        pool, np.concatenate([np.arange(100, 200), 400 + np.arange(150), 400 + np.arange(50)])
    )
    assert ingestor.ingest(second).duplicate_reports == 150
    assert store.duplicate_reports("pages", [5]) == 150
    # the shuffler re-sends the same batch (same batch id): not a repeated report
    assert ingestor.ingest(second).duplicate
    assert store.apply_reports(
        "pages", 5, second.batch_id, config.fingerprint, counts_of(registry, "pages", rng, 3),
        NO_REPORT_IDS, repeated=7,
    ).applied is False  # fmt: skip
    assert store.duplicate_reports("pages", [5]) == 150
    # the same ids in the next window: other reports there, no repeat in either window
    other_window = replace(rows(pool, np.arange(30)), window=6)
    assert ingestor.ingest(other_window).duplicate_reports == 0
    assert [store.duplicate_reports("pages", [w]) for w in (5, 6)] == [150, 0]
    # a window without repeats says 0; one the store never counted says 0 too
    other = with_ids(random_batch(rng, config, 60, window=4), rng.integers(0, 256, (60, 16)))
    assert ingestor.ingest(other).applied == 60
    assert store.duplicate_reports("pages", [4]) == 0
    assert store.duplicate_reports("pages", [2]) == 0
    # a refused batch (other params) changes nothing
    with pytest.raises(ParamsConflict):
        store.apply_reports(
            "pages", 4, os.urandom(16), 12345, counts_of(registry, "pages", rng, 3),
            NO_REPORT_IDS, repeated=9,
        )  # fmt: skip
    assert store.duplicate_reports("pages", [4]) == 0
    # a first copy that arrives after its retry, in the same window
    early = rows(pool, np.arange(300, 310))
    assert ingestor.ingest(early).duplicate_reports == 10
    assert [store.duplicate_reports("pages", [w]) for w in (4, 5, 6)] == [0, 160, 0]
    # folding and disposing of the ids keep the count (the counts stay, so must it)
    assert store.maintain() >= 0
    now[0] += config.shuffle.disposal_days * 86400 + 4 * day
    assert ingestor.dispose_ids() > 0
    assert [store.duplicate_reports("pages", [w]) for w in (4, 5, 6)] == [0, 160, 0]


def test_repeats_survive_a_redis_kill(tmp_path: Path) -> None:
    """Durable: the count is in the AOF entry of the batch it came with, so a SIGKILL
    after the apply returned (fsync always, as the aggregator's Redis runs) keeps it."""
    from crowdmix.cluster import RedisServer as FsyncRedis

    _, registry = write_registry(tmp_path)
    rng = np.random.default_rng(33)
    config = registry["pages"]
    server = FsyncRedis(appendonly=True, directory=str(tmp_path / "redis"), fsync="always")
    server.start()
    try:
        store = RedisCountStore.from_url(server.url)
        ingestor = Ingestor(registry, store, clock=lambda: 5 * registry.window_seconds)
        first = with_ids(random_batch(rng, config, 200, window=5), rng.integers(0, 256, (200, 16)))
        ingestor.ingest(first)
        assert ingestor.ingest(rows(first, np.arange(40))).duplicate_reports == 40
        server.kill()
        server.start()
        assert store.duplicate_reports("pages", [5]) == 40
        store.close()
    finally:
        server.cleanup()


def test_a_window_whose_repeat_count_was_lost_is_unknown(redis_url: str) -> None:
    """A window holding counts but no record of its repeats (the counter was lost): unknown
    (None), not 0, so a histogram's central figure is withheld for it."""
    import redis as redis_py

    store = RedisCountStore.from_url(redis_url)
    store.apply("h", 9, os.urandom(16), 1, CohortCounts(1, 4))  # empty: no window
    delta = CohortCounts(1, 4)
    delta.totals, delta.ones = np.array([3]), np.array([[1, 0, 2, 0]])
    store.apply("h", 9, os.urandom(16), 1, delta)
    store.apply("h", 10, os.urandom(16), 1, delta)
    assert store.duplicate_reports("h", [9]) == 0
    client = redis_py.Redis.from_url(redis_url)
    client.delete("crowdmix:agg:{h}:w:10:dupids")
    client.close()
    assert store.duplicate_reports("h", [10]) is None
    assert store.duplicate_reports("h") is None
    assert store.duplicate_reports("h", [9]) == 0
    store.close()


def test_sealing_and_the_window_length_are_noted_per_window(
    store: CountStore, registry: Registry
) -> None:
    rng = np.random.default_rng(21)
    fp = registry["pages"].fingerprint
    assert store.sealing("pages") is None and store.window_seconds("pages") is None
    for window in (5, 6):
        store.apply("pages", window, os.urandom(16), fp, counts_of(registry, "pages", rng, 50))
    store.note_batch("pages", 5, sealed=True, window_seconds=3600)
    # window 6 counted by an aggregator that noted nothing: unknown, never "sealed"
    assert store.sealing("pages", [5]) is True and store.sealing("pages") is None
    store.note_batch("pages", 6, sealed=True, window_seconds=3600)
    store.note_batch("pages", 6, sealed=True, window_seconds=3600)  # idempotent
    assert store.sealing("pages") is True and store.window_seconds("pages") == 3600
    store.note_batch("pages", 6, sealed=False, window_seconds=3600)  # one clear batch
    assert store.sealing("pages") is False and store.sealing("pages", [5]) is True
    assert store.sealing("pages", [7]) is None  # nothing stored there
