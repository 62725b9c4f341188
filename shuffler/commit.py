"""Group commit: many concurrent requests, one store write.

Each request thread hands its validated chunks to ``GroupCommitter.commit`` and
blocks. One writer thread takes everything queued (after waiting up to
``max_delay`` for more to join), concatenates it per (metric, fingerprint),
applies the metric's random drop, and makes a single ``store.append``. Only
then are the waiting requests released, so an acknowledgement always means
"durably in the store"; if the write fails, every request in it fails (nothing
is acknowledged, clients retry).

While one write is in progress new requests queue up, so the coalescing grows
with load by itself: no timer is needed for throughput (``max_delay`` = 0 is
the default and measured best, see BENCHMARKS.md).

The only time recorded is the collection window of the write
(``Registry.window_of``), never a finer timestamp.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from client.registry import Registry
from shuffler.columns import Chunk
from shuffler.errors import ShufflerError, StoreUnavailable
from shuffler.metrics import ShufflerMetrics
from shuffler.shuffle import RandomBytes, keep_mask
from shuffler.store import PendingWrite, QueueKey, ShufflerStore

__all__ = ["GroupCommitter"]

log = logging.getLogger("crowdmix.shuffler")


class _Waiter:
    __slots__ = ("error", "event", "parts")

    def __init__(self, parts: dict[tuple[str, int], Chunk]) -> None:
        self.parts = parts
        self.event = threading.Event()
        self.error: ShufflerError | None = None


class GroupCommitter:
    """Coalesces concurrent ``commit`` calls into one store write each round."""

    def __init__(
        self,
        store: ShufflerStore,
        registry: Registry,
        *,
        max_delay: float = 0.0,
        clock: Callable[[], float] = time.time,
        random_bytes: RandomBytes = os.urandom,
        metrics: ShufflerMetrics | None = None,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._max_delay = max_delay
        self._clock = clock
        self._random_bytes = random_bytes
        self._metrics = metrics
        self._on_commit = on_commit
        self._cond = threading.Condition()
        self._queue: list[_Waiter] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="shuffler-commit", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Refuse new commits, write what is queued, stop the writer thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def commit(self, parts: dict[tuple[str, int], Chunk]) -> None:
        """Block until ``parts`` are durably stored; raise ``StoreUnavailable`` otherwise."""
        waiter = _Waiter(parts)
        with self._cond:
            if self._closed:
                raise StoreUnavailable("the shuffler is shutting down")
            self._queue.append(waiter)
            self._cond.notify()
        waiter.event.wait()
        if waiter.error is not None:
            raise waiter.error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return
            if self._max_delay > 0 and not self._closed:
                time.sleep(self._max_delay)
            with self._cond:
                batch, self._queue = self._queue, []
            error: ShufflerError | None = None
            try:
                self._write(batch)
            except ShufflerError as exc:
                error = exc
            except Exception as exc:  # a store bug must not hang the waiting requests
                log.exception("store write failed")
                error = StoreUnavailable(f"store write failed: {type(exc).__name__}")
            for w in batch:
                w.error = error
                w.event.set()

    def _write(self, batch: list[_Waiter]) -> None:
        grouped: dict[tuple[str, int], list[Chunk]] = {}
        for w in batch:
            for key, chunk in w.parts.items():
                grouped.setdefault(key, []).append(chunk)
        window = self._registry.window_of(self._clock())
        writes: list[PendingWrite] = []
        stored = 0
        for (metric, fp), chunks in grouped.items():
            chunk = Chunk.concat(chunks)
            drop = self._registry[metric].shuffle.drop_probability
            if drop > 0.0:
                keep = keep_mask(chunk.count, drop, self._random_bytes)
                kept = chunk.select(keep.nonzero()[0])
                if self._metrics is not None:
                    self._metrics.dropped_reports.labels(metric).inc(chunk.count - kept.count)
                chunk = kept
            stored += chunk.count
            writes.append(PendingWrite(metric, QueueKey(window=window, fingerprint=fp), chunk))
        self._store.append(writes)
        if self._metrics is not None:
            self._metrics.store_writes.inc()
        if self._on_commit is not None:
            self._on_commit(stored)
