"""Group commit: many concurrent requests, one store write.

Requests (coroutines on the server's event loop) queue their validated reports and await
a future. One drain task writes one batch at a time: whatever queued during the previous
write goes into the next, so coalescing grows with load; ``max_delay`` (the daemon's
``commit_max_delay_ms``, 1 ms by default) waits for more. A write concatenates reports per
(metric, fingerprint, window), applies the metric's random drop and makes one append, on
the loop itself when the store offers an event-loop appender
(``crowdmix.shuffler.store.async_appender``), else on a daemon thread. An acknowledgement
always means "durably in the store": a failed write fails every request in it; an
uncertain one fails them with ``StoreOutcomeUnknown``; on a cluster (``PartialWrite``)
only the requests touching failed metrics fail. The only time recorded is the collection
window each report names, never a finer timestamp.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from crowdmix.core.registry import Registry
from crowdmix.shuffler.columns import Pending, merge, merge_blob
from crowdmix.shuffler.errors import (
    PartialWrite,
    ShufflerError,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from crowdmix.shuffler.metrics import ShufflerMetrics
from crowdmix.shuffler.shuffle import RandomBytes, keep_mask
from crowdmix.shuffler.store import PendingWrite, QueueKey, ShufflerStore, async_appender

__all__ = ["GroupCommitter", "Parts"]

log = logging.getLogger("crowdmix.shuffler")

# One request's validated reports, per (metric, params fingerprint, window).
Parts = dict[tuple[str, int, int], Pending]


def _settle(
    batch: Sequence[tuple[Parts, asyncio.Future[None]]], error: ShufflerError | None
) -> None:
    for parts, fut in batch:
        if fut.done():  # the caller went away during the write; its reports are stored
            continue
        mine = error
        if isinstance(error, PartialWrite):  # a cluster flush: some slots' writes succeeded
            touched = {metric for metric, _, _ in parts}
            mine = error.cause if touched & error.failed else None
            if mine is not None and touched - error.failed:
                mine = _partly_stored(mine)
        if mine is None:
            fut.set_result(None)
        else:
            fut.set_exception(mine)


def _partly_stored(cause: StoreUnavailable) -> StoreUnavailable:
    """The error of a request whose other metrics' reports were stored: never "nothing was
    stored" (UNAVAILABLE), which would misstate what happened."""
    if isinstance(cause, StoreOutcomeUnknown):
        return cause
    return StoreOutcomeUnknown(f"part of the request was stored, the rest refused: {cause}")


async def _in_daemon_thread(
    append: Callable[[Sequence[PendingWrite]], None], writes: Sequence[PendingWrite]
) -> None:
    """``append(writes)`` on a daemon thread of its own. A pool's workers are not daemon
    threads: a process ending without ``aclose`` (a failed start-up step) would wait at
    exit for a write stuck on a store that does not answer. Writes run one at a time."""
    done: Future[None] = Future()

    def run() -> None:
        try:
            append(writes)
        except BaseException as exc:  # raised again on the loop
            done.set_exception(exc)
        else:
            done.set_result(None)

    threading.Thread(target=run, name="shuffler-write", daemon=True).start()
    await asyncio.wrap_future(done)


class GroupCommitter:
    """Coalesces concurrent ``commit`` calls into one store write each round.

    Use from one event loop; ``aclose`` refuses new commits and lets the write in
    progress finish.
    """

    def __init__(
        self,
        store: ShufflerStore,
        registry: Registry,
        *,
        max_delay: float = 0.0,
        random_bytes: RandomBytes = os.urandom,
        metrics: ShufflerMetrics | None = None,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        self._store = store
        self._registry = registry
        self._max_delay = max_delay
        self._random_bytes = random_bytes
        self._metrics = metrics
        self._on_commit = on_commit
        self._appender = async_appender(store)
        self._queue: list[tuple[Parts, asyncio.Future[None]]] = []
        self._writing = False
        self._closed = False
        self._task: asyncio.Task[None] | None = None

    async def commit(self, parts: Parts) -> None:
        """Return once ``parts`` are durably stored; raise a ``StoreUnavailable`` otherwise."""
        if self._closed:
            raise StoreUnavailable("the shuffler is shutting down")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queue.append((parts, fut))
        if not self._writing:
            self._writing = True
            self._task = loop.create_task(self._drain())
        await fut

    async def _write(self, requests: Sequence[Parts]) -> ShufflerError | None:
        try:
            writes = self.prepare(requests)
            if self._appender is not None:
                await self._appender.append(writes)
            else:
                await _in_daemon_thread(self._store.append, writes)
            self._committed(writes)
        except PartialWrite as exc:
            self._committed([w for w in writes if w.metric not in exc.failed])
            return exc
        except ShufflerError as exc:
            return exc
        except Exception as exc:  # a store bug must fail the requests, not hang them
            log.exception("store write failed")
            # the write may or may not have happened: not an invitation to retry
            return StoreOutcomeUnknown(f"store write failed: {type(exc).__name__}")
        return None

    async def _drain(self) -> None:
        batch: list[tuple[Parts, asyncio.Future[None]]] = []
        try:
            while self._queue:
                if self._max_delay > 0:
                    await asyncio.sleep(self._max_delay)  # let more requests join this write
                batch, self._queue = self._queue, []
                error = await self._write([parts for parts, _ in batch])
                _settle(batch, error)
                batch = []
        except BaseException:
            # cancelled (the loop is being torn down): never leave a request waiting
            _settle(batch, StoreOutcomeUnknown("the store write was interrupted"))
            _settle(self._queue, StoreUnavailable("the shuffler is shutting down"))
            self._queue = []
            raise
        finally:
            self._writing = False

    async def aclose(self) -> None:
        """Refuse new commits, let the write in progress finish, close the connection."""
        self._closed = True
        if self._task is not None:
            await asyncio.shield(self._task)
        if self._appender is not None:
            await self._appender.aclose()

    def prepare(self, requests: Sequence[Parts]) -> list[PendingWrite]:
        """The store writes for several requests: one per (metric, fingerprint, window),
        after the metric's random drop."""
        grouped: dict[tuple[str, int, int], list[Pending]] = {}
        for request in requests:
            for key, part in request.items():
                grouped.setdefault(key, []).append(part)
        writes: list[PendingWrite] = []
        for (metric, fp, window), parts in grouped.items():
            qkey = QueueKey(window=window, fingerprint=fp)
            drop = self._registry[metric].shuffle.drop_probability
            if drop > 0.0:
                chunk = merge(parts)
                kept = chunk.select(keep_mask(chunk.count, drop, self._random_bytes).nonzero()[0])
                if self._metrics is not None:
                    self._metrics.dropped_reports.labels(metric).inc(chunk.count - kept.count)
                write = PendingWrite.of(metric, qkey, kept)
            else:
                blob, count = merge_blob(parts)
                write = PendingWrite(metric, qkey, blob, count)
            writes.append(write)
        return writes

    def _committed(self, writes: Sequence[PendingWrite]) -> None:
        """Account for ``writes`` once the store has them."""
        if self._metrics is not None:
            self._metrics.store_writes.inc()
        if self._on_commit is not None:
            self._on_commit(sum(w.count for w in writes))
