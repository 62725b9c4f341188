"""One contract, every store: memory and real Redis, the latter over every way to
reach it (``redis://``, ``rediss://``, ``unix://``), with appends made directly and
through the event-loop appender the server's group commit uses
(tests/shuffler/conftest.py's ``every_store``)."""

from __future__ import annotations

import os
import threading
from collections import Counter
from typing import Any

import numpy as np
import pytest

from crowdmix.shuffler.columns import Chunk
from crowdmix.shuffler.store import PendingWrite, QueueKey, ShufflerStore
from tests.shuffler.helpers import OUE, RAPPOR, as_multiset, report_ids, unique_chunk


@pytest.fixture
def store(every_store: ShufflerStore) -> ShufflerStore:
    """This module's ``store``: every backend, every path (not just memory and redis://)."""
    return every_store


KEY = QueueKey(window=20000, fingerprint=0xDEADBEEF12345678)
OTHER = QueueKey(window=20001, fingerprint=0xDEADBEEF12345678)


def _bid() -> bytes:
    return os.urandom(16)


def test_append_counts_per_queue(store: ShufflerStore) -> None:
    assert store.pending(RAPPOR) == {}
    store.append(
        [
            PendingWrite.of(RAPPOR, KEY, unique_chunk(30)),
            PendingWrite.of(RAPPOR, OTHER, unique_chunk(5, 100)),
            PendingWrite.of(OUE, KEY, Chunk(1, np.zeros(3, np.uint32), b"\x01\x02\x04")),
        ]
    )
    store.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(12, 30))])
    assert store.pending(RAPPOR) == {KEY: 42, OTHER: 5}
    assert store.pending(OUE) == {KEY: 3}
    assert store.pending("nothing_here") == {}


def test_take_refuses_below_min_batch_and_changes_nothing(store: ShufflerStore) -> None:
    store.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(9))])
    assert store.take(RAPPOR, KEY, min_batch=10, max_batch=100, batch_id=_bid()) is None
    assert store.take(RAPPOR, OTHER, min_batch=1, max_batch=100, batch_id=_bid()) is None
    assert store.pending(RAPPOR) == {KEY: 9}
    assert store.inflight_ids(RAPPOR) == []


def test_take_splits_chunks_to_exactly_max_batch(store: ShufflerStore) -> None:
    for i in range(3):
        store.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(30, 30 * i))])
    first = store.take(RAPPOR, KEY, min_batch=10, max_batch=50, batch_id=_bid())
    assert first is not None and first.chunk.count == 50
    assert first.key == KEY and first.metric == RAPPOR
    # oldest first, and the split chunk keeps its tail pending
    assert report_ids(first.chunk).tolist() == list(range(50))
    assert np.array_equal(first.chunk.cohorts, np.arange(50) % 8)
    assert store.pending(RAPPOR) == {KEY: 40}
    second = store.take(RAPPOR, KEY, min_batch=40, max_batch=50, batch_id=_bid())
    assert second is not None
    assert report_ids(second.chunk).tolist() == list(range(50, 90))
    assert store.pending(RAPPOR) == {}
    assert store.take(RAPPOR, KEY, min_batch=1, max_batch=50, batch_id=_bid()) is None


def test_take_of_many_small_chunks_takes_the_oldest_in_order(store: ShufflerStore) -> None:
    """Hundreds of one- and two-report chunks (device-style requests): a batch is the
    oldest whole chunks that fit, in order, then a split one; counted across pages."""
    sizes = [1 + i % 2 for i in range(700)]  # 1050 reports
    start = 0
    for n in sizes:
        store.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(n, start))])
        start += n
    taken = []
    for max_batch, expected in ((600, 600), (301, 301), (200, 149)):  # the last: all left
        got = store.take(RAPPOR, KEY, min_batch=1, max_batch=max_batch, batch_id=_bid())
        assert got is not None and got.chunk.count == expected
        taken += report_ids(got.chunk).tolist()
    assert taken == list(range(1050))
    assert store.pending(RAPPOR) == {}


def test_inflight_survives_until_ack(store: ShufflerStore) -> None:
    store.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(20))])
    bid = _bid()
    batch = store.take(RAPPOR, KEY, min_batch=5, max_batch=100, batch_id=bid)
    assert batch is not None and batch.batch_id == bid
    assert store.inflight_ids(RAPPOR) == [bid]
    loaded = store.load_inflight(RAPPOR, bid)
    assert loaded is not None and loaded.key == KEY
    assert as_multiset(loaded.chunk) == as_multiset(unique_chunk(20))
    assert store.load_inflight(RAPPOR, _bid()) is None
    assert store.ack(RAPPOR, bid) is True
    assert store.ack(RAPPOR, bid) is False
    assert store.inflight_ids(RAPPOR) == []
    assert store.load_inflight(RAPPOR, bid) is None


def test_dispose_discards_one_queue(store: ShufflerStore) -> None:
    store.append(
        [
            PendingWrite.of(RAPPOR, KEY, unique_chunk(7)),
            PendingWrite.of(RAPPOR, OTHER, unique_chunk(3)),
        ]
    )
    assert store.dispose(RAPPOR, KEY) == 7
    assert store.dispose(RAPPOR, KEY) == 0
    assert store.pending(RAPPOR) == {OTHER: 3}
    assert store.take(RAPPOR, KEY, min_batch=1, max_batch=10, batch_id=_bid()) is None


def test_concurrent_takes_never_share_a_report(store: ShufflerStore) -> None:
    n = 5000
    for i in range(0, n, 250):
        store.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(250, i))])
    taken: list[Counter[int]] = []
    lock = threading.Lock()

    def worker() -> None:
        got: Counter[int] = Counter()
        while True:
            b = store.take(RAPPOR, KEY, min_batch=100, max_batch=137, batch_id=_bid())
            if b is None:
                break
            assert b.chunk.count >= 100
            got.update(report_ids(b.chunk).tolist())
        with lock:
            taken.append(got)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    union: Counter[int] = Counter()
    for got in taken:
        union.update(got)
    left = sum(store.pending(RAPPOR).values())
    assert max(union.values()) == 1  # no report in two batches
    assert sum(union.values()) + left == n
    assert left < 100  # everything releasable was released
    assert len(store.inflight_ids(RAPPOR)) == len(set(store.inflight_ids(RAPPOR)))


def test_redis_keys_are_hash_tagged_by_metric(redis_url: str) -> None:
    """Every key of a metric carries {metric}: one Redis Cluster slot, so the Lua move works."""
    import redis

    from crowdmix.shuffler.redis_store import RedisStore

    s = RedisStore(redis_url)
    s.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(20))])
    assert s.take(RAPPOR, KEY, min_batch=5, max_batch=10, batch_id=_bid()) is not None
    keys = [k.decode() for k in redis.Redis.from_url(redis_url).keys("*")]
    assert len(keys) == 5  # pending hash, queue + counts lists, in-flight hash, batch list
    assert all(f"{{{RAPPOR}}}" in k for k in keys)
    s.close()


def test_merge_blob_equals_merge_then_to_blob() -> None:
    from crowdmix.shuffler.columns import Rows, merge, merge_blob

    parts = [
        Rows(2, [3], b"\x01\x02"),
        unique_chunk(5, 10),
        Rows(2, [0, 7], b"\xaa\xbb\xcc\xdd"),
    ]
    blob, n = merge_blob(parts)
    assert n == 8
    assert blob == merge(parts).to_blob()


@pytest.mark.parametrize("path", ["direct", "loop"])
def test_redis_append_reloads_a_flushed_script_and_reconnects(
    private_redis: Any, path: str
) -> None:
    """An append (``append`` itself, and the server's: the event loop's connection) after
    SCRIPT FLUSH and across a Redis restart: the script is loaded again, a stopped Redis
    is the retryable error, and the connection comes back by itself."""
    import redis

    from crowdmix.shuffler.errors import StoreOutcomeUnknown, StoreUnavailable
    from crowdmix.shuffler.redis_store import RedisStore
    from tests.shuffler.conftest import LoopAppended

    store = RedisStore(private_redis.url, timeout=2.0)
    s: Any = LoopAppended(store) if path == "loop" else store
    s.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(3))])
    redis.Redis.from_url(private_redis.url).script_flush()  # EVALSHA now answers NOSCRIPT
    s.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(4, 3))])
    assert s.pending(RAPPOR) == {KEY: 7}
    private_redis.stop()
    with pytest.raises(StoreUnavailable) as raised:
        s.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(1))])
    assert not isinstance(raised.value, StoreOutcomeUnknown)  # noticed before sending
    private_redis.start()  # AOF: the 7 acknowledged reports are back
    s.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(2, 7))])
    assert s.pending(RAPPOR) == {KEY: 9}
    batch = s.take(RAPPOR, KEY, min_batch=1, max_batch=100, batch_id=_bid())
    assert batch is not None and sorted(report_ids(batch.chunk).tolist()) == list(range(9))
    s.close()


@pytest.mark.parametrize("path", ["direct", "loop"])
def test_redis_append_whose_reply_is_lost_is_an_unknown_outcome(
    private_redis: Any, path: str
) -> None:
    """Redis ran the append, then the connection dropped before its reply came: the
    error says the outcome is unknown, never "nothing was stored" (StoreUnavailable
    alone), which would invite the sender to send the stored reports again; on
    ``append`` itself as on the server's event-loop appender."""
    from crowdmix.shuffler.errors import StoreOutcomeUnknown
    from crowdmix.shuffler.redis_store import RedisStore
    from tests.redis_proxy import DropOneReply
    from tests.shuffler.conftest import LoopAppended

    proxy = DropOneReply(private_redis.port, f"q:{KEY.field}".encode())
    store = RedisStore(proxy.url, timeout=5.0)
    s: Any = LoopAppended(store) if path == "loop" else store
    try:
        s.append([PendingWrite.of(RAPPOR, OTHER, unique_chunk(2))])  # connected, script loaded
        proxy.armed.set()
        with pytest.raises(StoreOutcomeUnknown):
            s.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(3))])
        assert proxy.dropped.is_set()  # Redis answered: the write ran
        assert s.pending(RAPPOR) == {OTHER: 2, KEY: 3}  # once
        s.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(4, 3))])  # reconnects
        assert s.pending(RAPPOR) == {OTHER: 2, KEY: 7}
    finally:
        s.close()
        proxy.close()


def with_report_ids(chunk: Chunk, start: int) -> Chunk:
    """The chunk with report id i (16 bytes, little-endian start + i) on report i."""
    ids = np.zeros((chunk.count, 2), dtype="<u8")
    ids[:, 0] = np.arange(start, start + chunk.count) + 1
    return Chunk(chunk.report_bytes, chunk.cohorts, chunk.bits, ids.tobytes())


def id_numbers(chunk: Chunk) -> list[int]:
    return (np.frombuffer(chunk.report_ids(), dtype="<u8")[0::2]).astype(np.int64).tolist()


def test_report_ids_travel_with_their_reports_through_splits(store: ShufflerStore) -> None:
    """Ids stay with their reports through append, split takes and in-flight loads; a
    chunk written without ids (before report ids existed) reads back as "no id" (0)."""
    store.append([PendingWrite.of(RAPPOR, KEY, with_report_ids(unique_chunk(30), 0))])
    store.append([PendingWrite.of(RAPPOR, KEY, unique_chunk(30, 30))])  # an old, id-less chunk
    store.append([PendingWrite.of(RAPPOR, KEY, with_report_ids(unique_chunk(30, 60), 60))])
    first = store.take(RAPPOR, KEY, min_batch=10, max_batch=45, batch_id=_bid())
    assert first is not None
    assert report_ids(first.chunk).tolist() == list(range(45))
    assert id_numbers(first.chunk) == [i + 1 for i in range(30)] + [0] * 15
    second = store.take(RAPPOR, KEY, min_batch=10, max_batch=40, batch_id=_bid())
    assert second is not None
    assert id_numbers(second.chunk) == [0] * 15 + [i + 1 for i in range(60, 85)]
    loaded = store.load_inflight(RAPPOR, second.batch_id)
    assert loaded is not None and loaded.chunk.ids == second.chunk.ids
    # a permutation moves each id with its report
    order = np.arange(second.chunk.count)[::-1].copy()
    shuffled = second.chunk.select(order)
    assert id_numbers(shuffled) == id_numbers(second.chunk)[::-1]
    assert report_ids(shuffled).tolist() == report_ids(second.chunk).tolist()[::-1]


# -- a metric released per window (shuffled histograms), over every store ------------

HIST = "screens"
HOUR = 3600
GRACE = 120.0


def _window_registry() -> Any:
    from crowdmix.core.registry import parse_registry

    return parse_registry(
        {
            "metrics": {
                HIST: {  # release = "window" is a histogram's default in a registry file
                    "encoding": "shuffled-histogram",
                    "domain_size": 1000,  # 2-byte reports, like unique_chunk's
                    "fake_slots": 1,
                    "fake_probability": 0.5,
                    "shuffle": {"min_batch": 10, "release_grace_seconds": GRACE},
                },
                RAPPOR: {
                    "encoding": "rappor",
                    **{"k": 16, "h": 2, "m": 8, "f": 0.5, "p": 0.5, "q": 0.75},
                    "shuffle": {"min_batch": 10, "max_batch": 100, "max_delay_seconds": 1e-9},
                },
            },
            "collection": {"window_seconds": HOUR},
        }
    )


def test_a_window_metric_is_released_whole_once_it_is_closed_and_its_grace_is_over(
    store: ShufflerStore,
) -> None:
    from crowdmix.shuffler.forwarding import Releaser
    from crowdmix.shuffler.store import InFlightBatch

    registry = _window_registry()
    assert registry[HIST].shuffle.release == "window"
    window = 20000
    now = [window * HOUR + 10.0]
    sent: list[InFlightBatch] = []
    releaser = Releaser(registry, store, sent.append, clock=lambda: now[0])
    key = QueueKey(window=window, fingerprint=registry[HIST].fingerprint)
    rkey = QueueKey(window=window, fingerprint=registry[RAPPOR].fingerprint)
    for i in range(5):  # five appends of 50 (as five group commits would)
        store.append([PendingWrite.of(HIST, key, unique_chunk(50, 50 * i))])
        store.append([PendingWrite.of(RAPPOR, rkey, unique_chunk(50, 50 * i))])

    never = lambda: False  # noqa: E731
    releaser.run_once(never)
    releaser.run_once(never, final=True)  # nor does shutting down hurry a window
    # the window is over, but the intake still takes it (tolerance 1) until window + 2
    now[0] = (window + 2) * HOUR - 0.5
    releaser.run_once(never, final=True)
    now[0] = (window + 2) * HOUR + GRACE - 0.5  # closed, its grace is not over
    releaser.run_once(never, final=True)
    assert [b.metric for b in sent] == [RAPPOR] * 3  # RAPPOR: by max_batch, as before
    assert [b.chunk.count for b in sent] == [100, 100, 50]
    assert store.pending(HIST) == {key: 250}

    now[0] = (window + 2) * HOUR + GRACE
    assert releaser.run_once(never) == 1
    hist = [b for b in sent if b.metric == HIST]
    assert len(hist) == 1 and hist[0].key == key  # one batch: the whole window, uncut
    assert sorted(report_ids(hist[0].chunk).tolist()) == list(range(250))
    assert store.pending(HIST) == {} and store.inflight_ids(HIST) == []

    # a write for the window that lands after its release (a clock behind by more than
    # the grace): held below min_batch, then a second batch once it reaches it
    store.append([PendingWrite.of(HIST, key, unique_chunk(6, 500))])
    assert releaser.run_once(never) == 0 and store.pending(HIST) == {key: 6}
    store.append([PendingWrite.of(HIST, key, unique_chunk(6, 506))])
    assert releaser.run_once(never) == 1
    late = [b for b in sent if b.metric == HIST][1:]
    assert [sorted(report_ids(b.chunk).tolist()) for b in late] == [list(range(500, 512))]

    # the next window: fewer than min_batch is never released, due or not
    nxt = QueueKey(window=window + 1, fingerprint=key.fingerprint)
    store.append([PendingWrite.of(HIST, nxt, unique_chunk(9, 1000))])
    now[0] = (window + 3) * HOUR + GRACE
    assert releaser.run_once(never) == 0
    assert store.pending(HIST) == {nxt: 9}


def test_a_window_above_one_aggregator_batch_is_split_in_equal_parts(
    store: ShufflerStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a window that one aggregator batch cannot carry is split (never at
    max_batch), into equal parts so that the smallest crowd is as large as it can be."""
    import crowdmix.shuffler.forwarding as forwarding
    from crowdmix.shuffler.forwarding import Releaser
    from crowdmix.shuffler.store import InFlightBatch

    registry = _window_registry()
    monkeypatch.setattr(forwarding, "window_batch_limit", lambda report_bytes: 100)
    sent: list[InFlightBatch] = []
    now = [0.0]
    releaser = Releaser(registry, store, sent.append, clock=lambda: now[0])
    key = QueueKey(window=7, fingerprint=registry[HIST].fingerprint)
    store.append([PendingWrite.of(HIST, key, unique_chunk(250))])
    now[0] = 9 * HOUR + GRACE  # window 7 closes at 9 h (tolerance 1)
    assert releaser.run_once(lambda: False) == 3
    assert sorted(b.chunk.count for b in sent) == [83, 83, 84]
    assert sorted(np.concatenate([report_ids(b.chunk) for b in sent]).tolist()) == list(range(250))
    assert store.pending(HIST) == {}
