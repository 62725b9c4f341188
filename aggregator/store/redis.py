"""The Redis count store: exactly-once batches, one compact write per batch.

Why per-batch deltas and not counters: a batch of RAPPOR reports touches
nearly every (cohort, bit) cell (m·k = 8192 cells at m=64, k=128), so
"HINCRBY every cell" costs thousands of Redis commands per batch. Instead the
aggregator counts the batch in numpy and a Lua script, atomically,

1. checks the params fingerprint of the metric (counts under other params never mix),
2. ``SADD``s the batch id to the metric's applied-ids set (already there → duplicate, stop),
3. ``HSET``s the batch's counts as one compact blob (``store_codec.encode_counts``) under its id
   in the window's delta hash, and records the window.

So counts and ids change together (a Lua script runs atomically and Redis
checks out-of-memory before its first write), and the AOF gets one entry per
batch. ``bench/ingest_store.py`` measures both designs.

Deltas are folded into one int64 total per window by :meth:`RedisCountStore.fold`
(the aggregator daemon calls :meth:`maintain` every second), so reads stay
cheap and memory stays bounded. A fold reads the window total, its version and
up to N deltas in one MULTI (a consistent snapshot), sums them in numpy, and a
second script writes the new total, bumps the version and deletes exactly
those deltas — only if the version is unchanged. Ingest never conflicts with a
fold (it only adds new fields); two folders racing retry. Several aggregator
processes can therefore share one Redis, each ingesting and folding.

Keys (hash-tagged by metric, so one metric's keys share a Redis Cluster slot)::

    {prefix}:{metric}:meta           hash: fingerprint, description (registry entry, JSON)
    {prefix}:{metric}:ids            set of applied batch ids (16 bytes each)
    {prefix}:{metric}:windows        set of windows holding counts
    {prefix}:{metric}:w:{W}:deltas   hash: batch id -> counts blob (not yet folded)
    {prefix}:{metric}:w:{W}:total    hash: counts (the folded sum, same blob format), version
    {prefix}:{metric}:w:{W}:sizes    hash: batch size -> batches applied (privacy statement)
    {prefix}:{metric}:w:{W}:crowd    the fewest same-cohort reports in any batch (ditto)

The ids set grows by one member per batch (about 80 bytes in Redis): with the
shuffler's default 100 k-report batches that is 0.8 bytes per 1000 reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import numpy as np
import redis

from aggregator.store.base import (
    CountsLike,
    ParamsConflict,
    StoredCounts,
    StoreError,
    StoreUnavailable,
    batch_crowd,
)
from aggregator.store.codec import encode_counts, sum_blobs

__all__ = ["DEFAULT_PREFIX", "RedisCountStore"]

DEFAULT_PREFIX = "crowdmix:agg"
_T = TypeVar("_T")

_APPLY = """
local fp = redis.call('HGET', KEYS[4], 'fingerprint')
if fp and fp ~= ARGV[4] then return {-1, fp} end
if redis.call('SADD', KEYS[1], ARGV[1]) == 0 then return {0} end
if not fp then redis.call('HSET', KEYS[4], 'fingerprint', ARGV[4], 'description', ARGV[5]) end
redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('HINCRBY', KEYS[5], ARGV[6], 1)
local crowd = redis.call('GET', KEYS[6])
if not crowd or tonumber(ARGV[7]) < tonumber(crowd) then redis.call('SET', KEYS[6], ARGV[7]) end
return {1}
"""

_COMMIT_FOLD = """
local v = redis.call('HGET', KEYS[1], 'version') or '0'
if v ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'counts', ARGV[2], 'version', tostring(tonumber(v) + 1))
for i = 3, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
return 1
"""


class RedisCountStore:
    """Counts per (metric, window) in Redis; safe to share between processes."""

    def __init__(
        self, client: redis.Redis, *, prefix: str = DEFAULT_PREFIX, fold_chunk: int = 512
    ) -> None:
        if fold_chunk < 1:
            raise ValueError(f"fold_chunk must be positive, got {fold_chunk}")
        self._r = client
        self._prefix = prefix
        self._fold_chunk = fold_chunk
        self._apply = client.register_script(_APPLY)
        self._commit_fold = client.register_script(_COMMIT_FOLD)

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisCountStore:
        client = redis.Redis.from_url(url, socket_timeout=10.0, socket_connect_timeout=5.0)
        return cls(client, **kwargs)

    # -- keys -------------------------------------------------------------------------------
    def _k(self, metric: str, suffix: str) -> str:
        return f"{self._prefix}:{{{metric}}}:{suffix}"

    def _call(self, fn: Callable[[], _T]) -> _T:
        try:
            return fn()
        except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as exc:
            raise StoreUnavailable(f"redis unavailable: {exc}") from None
        except redis.RedisError as exc:
            # OOM, MISCONF (AOF cannot be written), READONLY...: nothing was applied.
            raise StoreUnavailable(f"redis refused the write: {exc}") from None

    # -- CountStore -------------------------------------------------------------------------
    def apply(
        self,
        metric: str,
        window: int,
        batch_id: bytes,
        fingerprint: int,
        delta: CountsLike,
        *,
        description: str = "",
    ) -> bool:
        keys = [
            self._k(metric, "ids"),
            self._k(metric, "windows"),
            self._k(metric, f"w:{window}:deltas"),
            self._k(metric, "meta"),
            self._k(metric, f"w:{window}:sizes"),
            self._k(metric, f"w:{window}:crowd"),
        ]
        args: list[bytes | str] = [
            batch_id,
            str(window),
            encode_counts(delta),
            str(fingerprint),
            description,
            str(int(np.asarray(delta.totals).sum())),
            str(batch_crowd(np.asarray(delta.totals))),
        ]
        result = self._call(lambda: self._apply(keys=keys, args=args))
        if int(result[0]) == -1:
            raise ParamsConflict(
                f"metric {metric!r} has counts under params fingerprint "
                f"{int(result[1]):#018x}, this batch has {fingerprint:#018x}"
            )
        return int(result[0]) == 1

    def load(self, metric: str, windows: Iterable[int] | None = None) -> StoredCounts | None:
        wanted = self.windows(metric) if windows is None else sorted(set(windows))
        if not wanted:
            return None

        def read() -> list[Any]:
            pipe = self._r.pipeline(transaction=True)  # MULTI/EXEC: one consistent snapshot
            for w in wanted:
                pipe.hget(self._k(metric, f"w:{w}:total"), "counts")
                pipe.hvals(self._k(metric, f"w:{w}:deltas"))
            return pipe.execute()  # type: ignore[no-any-return]

        replies = self._call(read)
        blobs: list[bytes] = []
        for i in range(0, len(replies), 2):
            if replies[i] is not None:
                blobs.append(replies[i])
            blobs.extend(replies[i + 1])
        return sum_blobs(blobs)

    def description(self, metric: str) -> str | None:
        raw = self._call(lambda: self._r.hget(self._k(metric, "meta"), "description"))
        if not raw:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    def windows(self, metric: str) -> list[int]:
        members = self._call(lambda: self._r.smembers(self._k(metric, "windows")))
        return sorted(int(w) for w in members)

    def batch_sizes(self, metric: str, windows: Iterable[int] | None = None) -> dict[int, int]:
        wanted = self.windows(metric) if windows is None else sorted(set(windows))

        def read() -> list[Any]:
            pipe = self._r.pipeline(transaction=True)
            for w in wanted:
                pipe.hgetall(self._k(metric, f"w:{w}:sizes"))
            return pipe.execute()  # type: ignore[no-any-return]

        out: dict[int, int] = {}
        for histogram in self._call(read) if wanted else []:
            for size, n in histogram.items():
                out[int(size)] = out.get(int(size), 0) + int(n)
        return out

    def smallest_crowd(self, metric: str, windows: Iterable[int] | None = None) -> int | None:
        wanted = self.windows(metric) if windows is None else sorted(set(windows))
        if not wanted:
            return None
        keys = [self._k(metric, f"w:{w}:crowd") for w in wanted]
        values = [int(v) for v in self._call(lambda: self._r.mget(keys)) if v is not None]
        return min(values) if values else None

    def metrics(self) -> list[str]:
        pattern = f"{self._prefix}:{{*}}:meta"
        keys = self._call(lambda: list(self._r.scan_iter(match=pattern, count=1000)))
        head = len(self._prefix) + 2
        return sorted(k.decode()[head:-6] for k in keys)

    def applied_batches(self, metric: str) -> int:
        return int(self._call(lambda: self._r.scard(self._k(metric, "ids"))))

    def close(self) -> None:
        self._r.close()

    # -- folding ----------------------------------------------------------------------------
    def fold(self, metric: str, window: int) -> int:
        """Fold up to ``fold_chunk`` deltas of (metric, window) into its total.

        Returns how many deltas were folded (0 when none were pending or another
        process folded first; its fold is as good as ours).
        """
        total_key = self._k(metric, f"w:{window}:total")
        deltas_key = self._k(metric, f"w:{window}:deltas")

        def snapshot() -> list[Any]:
            pipe = self._r.pipeline(transaction=True)
            pipe.hmget(total_key, "counts", "version")
            pipe.hrandfield(deltas_key, self._fold_chunk, withvalues=True)
            return pipe.execute()  # type: ignore[no-any-return]

        (counts_blob, version), flat = self._call(snapshot)
        if not flat:
            return 0
        fields, blobs = flat[0::2], flat[1::2]
        base = sum_blobs([counts_blob]) if counts_blob is not None else None
        merged = sum_blobs(blobs, into=base)
        if merged is None:  # pragma: no cover - flat was non-empty
            raise StoreError("fold found deltas but summed nothing")
        new_blob = encode_counts(merged)
        expected = (version or b"0").decode()
        done = self._call(
            lambda: self._commit_fold(
                keys=[total_key, deltas_key], args=[expected, new_blob, *fields]
            )
        )
        return len(fields) if int(done) == 1 else 0

    def pending(self, metric: str, window: int) -> int:
        """Deltas of (metric, window) not yet folded."""
        return int(self._call(lambda: self._r.hlen(self._k(metric, f"w:{window}:deltas"))))

    def maintain(self) -> int:
        """Fold every window with pending deltas, a chunk at a time; returns deltas folded."""
        folded = 0
        for metric in self.metrics():
            for window in self.windows(metric):
                while self.pending(metric, window) > 0:
                    n = self.fold(metric, window)
                    folded += n
                    if n == 0:
                        break
        return folded
