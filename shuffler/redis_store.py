"""The production store: Redis (redis-py), AOF recommended.

Keys are hash-tagged by metric, so each metric lives in one Redis Cluster slot:
``{prefix}:{<metric>}:pending`` (hash "<window>:<fingerprint>" → pending reports),
``:q:<window>:<fp>`` (list of chunk blobs) and ``:qn:<window>:<fp>`` (their report
counts), ``:inflight`` (hash batch id → header) and ``:b:<batch id hex>`` (a batch's
chunks). A group-commit flush is one MULTI/EXEC (per queue one RPUSH of a blob, one of its
count, one HINCRBY; a script would cost Redis ~2 ms a megabyte to take the blobs), on a
cluster one script per slot (``shuffler.redis_cluster``), through ``async_appender`` on the
server's event loop; ``append`` (tests, benchmarks) runs that appender on a loop of its own,
so its errors mean the same. The releaser's take, load, ack and dispose run on a blocking
client in its thread. ``take`` is one script that moves whole chunks (SORT … STORE, or a
RENAME for a whole queue) and checks ``min_batch`` atomically: no report lands in two
batches. ``min_replicas_ack`` N > 0 ends each append with ``WAIT N`` and raises
``StoreNotReplicated`` when fewer replicas have it. Why: docs/design.md, "Shuffler".
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from crowdmix.core.redis_url import blocking_client, is_cluster_url, parse_cluster_url
from crowdmix.shuffler.columns import decode_chunks
from crowdmix.shuffler.errors import StoreNotReplicated, StoreOutcomeUnknown, StoreUnavailable
from crowdmix.shuffler.redis_async import AsyncScriptConnection
from crowdmix.shuffler.redis_cluster import WAIT_TIMEOUT_MS, AsyncClusterAppender
from crowdmix.shuffler.store import AsyncAppender, InFlightBatch, PendingWrite, QueueKey

__all__ = ["RedisStore"]

_INFLIGHT_HEADER = struct.Struct("<IQ")  # window, fingerprint

# KEYS: (queue list, counts list, pending hash) per queue; ARGV: (blob, count, field)
_APPEND = """
for i = 1, #KEYS, 3 do
  redis.call('RPUSH', KEYS[i], ARGV[i])
  redis.call('RPUSH', KEYS[i + 1], ARGV[i + 1])
  redis.call('HINCRBY', KEYS[i + 2], ARGV[i + 2], ARGV[i + 1])
end
return #KEYS / 3
"""

# KEYS: pending hash, queue list, counts list, inflight hash, batch list
# ARGV: queue field, min_batch, max_batch, batch id, in-flight header
# Same split arithmetic as columns.split_blob (the contract tests split on both stores).
_TAKE = """
local pending = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local min_batch = tonumber(ARGV[2])
local max_batch = tonumber(ARGV[3])
if pending < min_batch or pending == 0 then return 0 end
if pending <= max_batch then
  -- the whole queue (a window released in one batch): O(1) whatever its chunk count
  redis.call('RENAME', KEYS[2], KEYS[5])
  redis.call('UNLINK', KEYS[3])
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[4], ARGV[4], ARGV[5])
  return pending
end
-- the whole chunks that fit, counted a page of counts at a time...
local taken, k, done = 0, 0, false
while not done do
  local page = redis.call('LRANGE', KEYS[3], k, k + 255)
  if #page == 0 then break end
  for _, c in ipairs(page) do
    c = tonumber(c)
    if taken + c > max_batch then done = true break end
    taken, k = taken + c, k + 1
  end
end
-- ...moved by SORT ... STORE, which copies them in Redis: an LMOVE in a script hands each
-- chunk to Lua as its reply, which costs about 2 ns a byte (7 ms for 10^5 v2 reports)
if k > 0 then
  redis.call('SORT', KEYS[2], 'BY', 'nosort', 'LIMIT', 0, k, 'STORE', KEYS[5])
  redis.call('LTRIM', KEYS[2], k, -1)
  redis.call('LTRIM', KEYS[3], k, -1)
end
-- then the next chunk (larger than what is left to take) split, to fill the batch
local count = taken < max_batch and redis.call('LINDEX', KEYS[3], 0)
if count then
  count = tonumber(count)
  local want = max_batch - taken
  local blob = redis.call('LINDEX', KEYS[2], 0)
  local _, rbf = struct.unpack('<I4I4', blob)
  local rb, idb = rbf, 0
  if rbf >= 2147483648 then rb, idb = rbf - 2147483648, 16 end
  local c0 = 8
  local b0 = c0 + 4 * count
  local i0 = b0 + rb * count
  redis.call('RPUSH', KEYS[5], struct.pack('<I4I4', want, rbf)
    .. string.sub(blob, c0 + 1, c0 + 4 * want)
    .. string.sub(blob, b0 + 1, b0 + rb * want)
    .. string.sub(blob, i0 + 1, i0 + idb * want))
  redis.call('LSET', KEYS[2], 0, struct.pack('<I4I4', count - want, rbf)
    .. string.sub(blob, c0 + 4 * want + 1, b0)
    .. string.sub(blob, b0 + rb * want + 1, i0)
    .. string.sub(blob, i0 + idb * want + 1))
  redis.call('LSET', KEYS[3], 0, count - want)
  taken = taken + want
end
if taken == 0 then return 0 end
if taken >= pending then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2], KEYS[3])
else
  redis.call('HINCRBY', KEYS[1], ARGV[1], -taken)
end
redis.call('HSET', KEYS[4], ARGV[4], ARGV[5])
return taken
"""

# KEYS: pending hash, queue list, counts list; ARGV: queue field
_DISPOSE = """
local n = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2], KEYS[3])
return n
"""

# KEYS: inflight hash, batch list; ARGV: batch id
_ACK = """
local n = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('UNLINK', KEYS[2])
return n
"""


class RedisStore:
    """A ``ShufflerStore`` on Redis; ``url`` like ``redis://127.0.0.1:6379/0``,
    ``rediss://`` (TLS; certificate files as ``ssl_ca_certs``, ``ssl_certfile``,
    ``ssl_keyfile`` query parameters) or ``unix:///path/redis.sock?db=0``."""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "crowdmix",
        timeout: float = 10.0,
        min_replicas_ack: int = 0,
    ) -> None:
        if min_replicas_ack < 0:
            raise ValueError(f"min_replicas_ack must be >= 0, got {min_replicas_ack}")
        self._cluster = parse_cluster_url(url) if is_cluster_url(url) else None
        # a cluster client never resends after a socket failure (it may have run)
        self._redis: Any = blocking_client(
            url, timeout=timeout, resend=False, error=StoreUnavailable
        )
        self._prefix = prefix
        self._url, self._timeout = url, timeout
        self._min_replicas_ack = min_replicas_ack
        # ``append``'s own event loop and appender, made on its first call
        self._append_lock = threading.Lock()
        self._append_loop: asyncio.Runner | None = None
        self._appender: AsyncAppender | None = None
        self._take = self._redis.register_script(_TAKE)
        self._dispose = self._redis.register_script(_DISPOSE)
        self._ack = self._redis.register_script(_ACK)

    def _k(self, metric: str, suffix: str) -> str:
        return f"{self._prefix}:{{{metric}}}:{suffix}"

    @contextmanager
    def _errors(self) -> Iterator[None]:
        import redis

        try:
            yield
        except redis.TimeoutError as exc:  # may have timed out after sending: it may have run
            raise StoreOutcomeUnknown(f"redis: {type(exc).__name__}: {exc}") from None
        except redis.RedisError as exc:
            raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from None
        except redis.exceptions.RedisClusterException as exc:
            # not a RedisError: no node answers (after a command's socket failure, which may
            # have come after sending it) or the slot map has holes. The releaser thread
            # catches only ShufflerError and would die of it.
            raise StoreOutcomeUnknown(f"redis cluster: {type(exc).__name__}: {exc}") from None

    def append_args(self, writes: Sequence[PendingWrite]) -> tuple[list[bytes], list[bytes]]:
        """KEYS and ARGV of the append script for ``writes`` (empty when nothing to write)."""
        keys: list[bytes] = []
        args: list[bytes] = []
        for w in writes:
            if w.count == 0:
                continue
            field = w.key.field
            keys += [
                self._k(w.metric, f"q:{field}").encode(),
                self._k(w.metric, f"qn:{field}").encode(),
                self._k(w.metric, "pending").encode(),
            ]
            args += [w.blob, str(w.count).encode(), field.encode()]
        return keys, args

    def append_commands(self, writes: Sequence[PendingWrite]) -> list[tuple[bytes, ...]]:
        """The commands of an append on one node, for one ``MULTI``/``EXEC``: per queue
        the blob and its count pushed and the queue's pending count raised (what the
        append script does on a cluster, where a transaction would need a slot each)."""
        keys, args = self.append_args(writes)
        commands: list[tuple[bytes, ...]] = []
        for i in range(0, len(keys), 3):
            blob, count, field = args[i : i + 3]
            commands += [
                (b"RPUSH", keys[i], blob),
                (b"RPUSH", keys[i + 1], count),
                (b"HINCRBY", keys[i + 2], field, count),
            ]
        return commands

    def metric_key(self, metric: str) -> bytes:
        """A key of ``metric`` (all its keys share its cluster slot)."""
        return self._k(metric, "pending").encode()

    def append(self, writes: Sequence[PendingWrite]) -> None:
        """The event-loop appender's write, from a thread with no event loop running:
        one write path, so one rule for what a failure means."""
        with self._append_lock:
            if self._append_loop is None:
                self._append_loop = asyncio.Runner()
            if self._appender is None:
                self._appender = self.async_appender()
            self._append_loop.run(self._appender.append(writes))

    def async_appender(self) -> AsyncAppender:
        """An appender for one event loop, on a connection of its own (one per master
        on a cluster)."""
        if self._cluster is not None:
            return AsyncClusterAppender(
                self,
                self._cluster,
                script=_APPEND,
                timeout=self._timeout,
                min_replicas_ack=self._min_replicas_ack,
            )
        connection = AsyncScriptConnection(self._url, timeout=self._timeout)
        return _AsyncAppender(self, connection, self._min_replicas_ack)

    def pending(self, metric: str) -> dict[QueueKey, int]:
        with self._errors():
            raw: dict[Any, Any] = self._redis.hgetall(self._k(metric, "pending"))
        return {QueueKey.from_field(f): int(n) for f, n in raw.items() if int(n) > 0}

    def take(
        self, metric: str, key: QueueKey, *, min_batch: int, max_batch: int, batch_id: bytes
    ) -> InFlightBatch | None:
        header = _INFLIGHT_HEADER.pack(key.window, key.fingerprint)
        with self._errors():
            taken = self._take(
                keys=[
                    self._k(metric, "pending"),
                    self._k(metric, f"q:{key.field}"),
                    self._k(metric, f"qn:{key.field}"),
                    self._k(metric, "inflight"),
                    self._k(metric, f"b:{batch_id.hex()}"),
                ],
                args=[key.field, min_batch, max_batch, batch_id, header],
            )
        if not taken:
            return None
        return self.load_inflight(metric, batch_id)

    def inflight_ids(self, metric: str) -> list[bytes]:
        with self._errors():
            return [bytes(b) for b in self._redis.hkeys(self._k(metric, "inflight"))]

    def load_inflight(self, metric: str, batch_id: bytes) -> InFlightBatch | None:
        with self._errors():
            pipe = self._redis.pipeline(transaction=True)
            pipe.hget(self._k(metric, "inflight"), batch_id)
            pipe.lrange(self._k(metric, f"b:{batch_id.hex()}"), 0, -1)
            header, blobs = pipe.execute()
        if header is None:
            return None
        window, fp = _INFLIGHT_HEADER.unpack(header)
        return InFlightBatch(
            batch_id=batch_id,
            metric=metric,
            key=QueueKey(window=window, fingerprint=fp),
            chunk=decode_chunks(b"".join(blobs)),
        )

    def ack(self, metric: str, batch_id: bytes) -> bool:
        with self._errors():
            n = self._ack(
                keys=[self._k(metric, "inflight"), self._k(metric, f"b:{batch_id.hex()}")],
                args=[batch_id],
            )
        return bool(n)

    def dispose(self, metric: str, key: QueueKey) -> int:
        with self._errors():
            n = self._dispose(
                keys=[
                    self._k(metric, "pending"),
                    self._k(metric, f"q:{key.field}"),
                    self._k(metric, f"qn:{key.field}"),
                ],
                args=[key.field],
            )
        return int(n)

    def ping(self) -> None:
        with self._errors():
            self._redis.ping()

    def close(self) -> None:
        with self._append_lock:
            if self._append_loop is not None:
                try:
                    if self._appender is not None:
                        self._append_loop.run(self._appender.aclose())
                finally:
                    self._append_loop.close()
                    self._append_loop, self._appender = None, None
        self._redis.close()


class _AsyncAppender:
    def __init__(
        self, store: RedisStore, connection: AsyncScriptConnection, min_replicas_ack: int
    ) -> None:
        self._store = store
        self._connection = connection
        self._min = min_replicas_ack

    async def append(self, writes: Sequence[PendingWrite]) -> None:
        commands = self._store.append_commands(writes)
        if not commands:
            return
        if not self._min:
            await self._connection.transaction(commands)
            return
        replies = await self._connection.transaction(commands, wait=(self._min, WAIT_TIMEOUT_MS))
        acked = replies[-1]
        if isinstance(acked, Exception) or int(acked) < self._min:
            raise StoreNotReplicated(
                f"redis: the write reached {acked} replica(s) within {WAIT_TIMEOUT_MS} ms, "
                f"{self._min} required (--min-replicas-ack)"
            )

    async def aclose(self) -> None:
        await self._connection.aclose()
