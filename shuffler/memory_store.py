"""The embedded store: pending queues and in-flight batches in process memory.

Same contract as the Redis store (one shared test suite); not durable across a
crash of the process, so the daemon logs a warning when it runs on it. Chunks
are kept as their compact blobs (``crowdmix.shuffler.columns``): 4 + report_bytes bytes
per report plus a small per-chunk overhead.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence

from crowdmix.shuffler.columns import HEADER, decode_chunks, split_blob
from crowdmix.shuffler.store import AsyncAppender, InFlightBatch, PendingWrite, QueueKey

__all__ = ["MemoryStore"]


class MemoryStore:
    """A ``ShufflerStore`` in memory, guarded by one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[tuple[str, QueueKey], deque[bytes]] = {}
        self._counts: dict[tuple[str, QueueKey], int] = {}
        self._inflight: dict[tuple[str, bytes], tuple[QueueKey, bytes]] = {}

    def append(self, writes: Sequence[PendingWrite]) -> None:
        with self._lock:
            for w in writes:
                if w.count == 0:
                    continue
                self._queues.setdefault((w.metric, w.key), deque()).append(w.blob)
                self._counts[(w.metric, w.key)] = self._counts.get((w.metric, w.key), 0) + w.count

    def async_appender(self) -> AsyncAppender | None:
        """Appends run inline on the event loop: they hold the lock for microseconds.
        Not for a subclass that overrides ``append`` (it may block: a thread it is)."""
        if type(self).append is not MemoryStore.append:
            return None
        return _InlineAppender(self)

    def pending(self, metric: str) -> dict[QueueKey, int]:
        with self._lock:
            return {k: n for (m, k), n in self._counts.items() if m == metric and n > 0}

    def take(
        self, metric: str, key: QueueKey, *, min_batch: int, max_batch: int, batch_id: bytes
    ) -> InFlightBatch | None:
        with self._lock:
            pending = self._counts.get((metric, key), 0)
            if pending < min_batch or pending == 0:
                return None
            queue = self._queues[(metric, key)]
            parts: list[bytes] = []
            taken = 0
            if pending <= max_batch:  # the whole queue at once
                parts, taken = list(queue), pending
                queue.clear()
            while taken < max_batch and queue:
                (count, _rb) = HEADER.unpack_from(queue[0], 0)
                want = max_batch - taken
                if count <= want:
                    parts.append(queue.popleft())
                    taken += count
                else:
                    head, tail = split_blob(queue[0], want)
                    queue[0] = tail
                    parts.append(head)
                    taken += want
            left = pending - taken
            if left:
                self._counts[(metric, key)] = left
            else:
                del self._counts[(metric, key)]
                del self._queues[(metric, key)]
            blob = b"".join(parts)
            self._inflight[(metric, batch_id)] = (key, blob)
        return InFlightBatch(batch_id=batch_id, metric=metric, key=key, chunk=decode_chunks(blob))

    def inflight_ids(self, metric: str) -> list[bytes]:
        with self._lock:
            return [b for (m, b) in self._inflight if m == metric]

    def load_inflight(self, metric: str, batch_id: bytes) -> InFlightBatch | None:
        with self._lock:
            entry = self._inflight.get((metric, batch_id))
        if entry is None:
            return None
        key, blob = entry
        return InFlightBatch(batch_id=batch_id, metric=metric, key=key, chunk=decode_chunks(blob))

    def ack(self, metric: str, batch_id: bytes) -> bool:
        with self._lock:
            return self._inflight.pop((metric, batch_id), None) is not None

    def dispose(self, metric: str, key: QueueKey) -> int:
        with self._lock:
            self._queues.pop((metric, key), None)
            return self._counts.pop((metric, key), 0)

    def ping(self) -> None:
        return None

    def close(self) -> None:
        return None


class _InlineAppender:
    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    async def append(self, writes: Sequence[PendingWrite]) -> None:
        self._store.append(writes)

    async def aclose(self) -> None:
        pass
