"""The store protocol: where accepted reports wait, durably, until released.

Two implementations pass one contract suite (tests/shuffler/test_store_contract.py):
``MemoryStore`` (the embedded default) and ``RedisStore`` (production; AOF). Per metric:
*pending queues*, one per ``QueueKey(window, fingerprint)``, hold chunks of accepted
reports (``crowdmix.shuffler.columns``) and their count; the key is all the metadata kept
(no sender, token, fine time or arrival order is ever stored). *In-flight batches*:
``take`` atomically moves up to ``max_batch`` reports of one queue into a batch under a
random 128-bit id and refuses below ``min_batch`` (so processes sharing the store never
release a small remainder); a batch stays until ``ack``, and a crashed process's batches
are found again with ``inflight_ids``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from crowdmix.shuffler.columns import Chunk

__all__ = [
    "AsyncAppender",
    "InFlightBatch",
    "PendingWrite",
    "QueueKey",
    "ShufflerStore",
    "async_appender",
]

BATCH_ID_BYTES = 16


@dataclass(frozen=True, slots=True, order=True)
class QueueKey:
    """A pending queue of one metric: its collection window and params fingerprint."""

    window: int
    fingerprint: int

    @property
    def field(self) -> str:
        return f"{self.window}:{self.fingerprint}"

    @classmethod
    def from_field(cls, field: str | bytes) -> QueueKey:
        text = field.decode() if isinstance(field, bytes) else field
        window, fp = text.split(":")
        return cls(window=int(window), fingerprint=int(fp))


@dataclass(frozen=True, slots=True)
class PendingWrite:
    """Reports to append to one pending queue: one chunk blob (``crowdmix.shuffler.columns``)."""

    metric: str
    key: QueueKey
    blob: bytes
    count: int

    @classmethod
    def of(cls, metric: str, key: QueueKey, chunk: Chunk) -> PendingWrite:
        return cls(metric, key, chunk.to_blob(), chunk.count)


@dataclass(frozen=True, slots=True)
class InFlightBatch:
    """Reports taken for release; deleted from the store only by ``ack``."""

    batch_id: bytes
    metric: str
    key: QueueKey
    chunk: Chunk


class ShufflerStore(Protocol):
    """Durable pending queues and in-flight batches. Every method is atomic.

    ``append`` is one store write for all its ``writes`` (group commit; on a Redis
    Cluster one per slot, atomic per metric, ``PartialWrite`` naming the metrics that
    failed): when it returns, every report in it survives a crash of the shuffler
    process (for Redis, as durable as its AOF setting, and with ``min_replicas_ack``
    the loss of the master). Methods raise
    ``crowdmix.shuffler.errors.StoreUnavailable`` when the store cannot be reached.
    """

    def append(self, writes: Sequence[PendingWrite]) -> None: ...

    def pending(self, metric: str) -> dict[QueueKey, int]:
        """Pending report counts of a metric's non-empty queues."""
        ...

    def take(
        self, metric: str, key: QueueKey, *, min_batch: int, max_batch: int, batch_id: bytes
    ) -> InFlightBatch | None:
        """Move up to ``max_batch`` reports into in-flight batch ``batch_id``.

        Returns None (and changes nothing) when fewer than ``min_batch`` are pending.
        """
        ...

    def inflight_ids(self, metric: str) -> list[bytes]: ...

    def load_inflight(self, metric: str, batch_id: bytes) -> InFlightBatch | None: ...

    def ack(self, metric: str, batch_id: bytes) -> bool:
        """Delete an in-flight batch; False if it was already gone."""
        ...

    def dispose(self, metric: str, key: QueueKey) -> int:
        """Discard a whole pending queue (disposal age); returns the reports discarded."""
        ...

    def ping(self) -> None: ...

    def close(self) -> None: ...


class AsyncAppender(Protocol):
    """``append`` for the asyncio server's event loop: a flush without a thread hand-off.

    A store offers one through an ``async_appender()`` method (optional; see
    ``async_appender``). Same durability promise as ``ShufflerStore.append``.
    """

    async def append(self, writes: Sequence[PendingWrite]) -> None: ...

    async def aclose(self) -> None: ...


def async_appender(store: ShufflerStore) -> AsyncAppender | None:
    """The store's event-loop appender, or None: then writes go to a thread."""
    factory = getattr(store, "async_appender", None)
    appender: AsyncAppender | None = None if factory is None else factory()
    return appender
