"""The Redis count store: exactly-once batches, one compact write per batch.

The aggregator counts a batch in numpy; one Lua script then atomically checks the
metric's params fingerprint and retention, the batch id (a duplicate changes nothing)
and that the window's report-id list is the one the caller checked the batch's ids
against (same length, same last blob; else the caller re-reads it), and then records
the batch id, its report ids as one blob and its counts as one compact blob in the
window's delta hash. Report-id membership is tested in this process
(:class:`crowdmix.aggregator.store.report_ids.ReportIdIndex`). :meth:`RedisCountStore.fold`
sums deltas into one total per window under a version check, so several aggregator
processes can share one Redis. Keys are hash-tagged by metric (one Cluster slot):
``{prefix}:{metric}:meta``, ``:ids``, ``:windows`` and per window ``:w:{W}:batches``,
``rids``, ``rtails``, ``nrids``, ``deltas``, ``total``, ``sizes``, ``crowd``, ``notes``,
``dupids``, ``dropped``. :meth:`RedisCountStore.dispose_ids` deletes old windows' ids.
Why per-batch deltas, the key table, memory: docs/design.md, "Aggregator: store".
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import numpy as np
import redis
import redis.cluster

from crowdmix.aggregator.errors import ParamsConflict, StoreError, StoreUnavailable, WindowDisposed
from crowdmix.aggregator.store.base import (
    ApplyOutcome,
    CountsLike,
    CountStore,
    ReportIds,
    StoredCounts,
    batch_crowd,
    checked_drops,
    sealing_of,
)
from crowdmix.aggregator.store.codec import encode_counts, sum_blobs
from crowdmix.aggregator.store.report_ids import ReportIdIndex
from crowdmix.core.redis_url import blocking_client, redirected

__all__ = ["DEFAULT_PREFIX", "RedisCountStore"]

DEFAULT_PREFIX = "crowdmix:agg"
_T = TypeVar("_T")
log = logging.getLogger(__name__)

# KEYS: 1 ids, 2 windows, 3 w:W:deltas, 4 meta, 5 w:W:sizes, 6 w:W:crowd, 7 w:W:batches,
#       8 w:W:rids (list of id blobs), 9 w:W:nrids (ids in that list), 10 w:W:dupids,
#       11 w:W:dropped (reason -> reports dropped before counting),
#       12 w:W:rtails (the ``_tail`` of each blob of rids, in step with it)
# ARGV: 1 batch id, 2 window, 3 counts blob, 4 fingerprint, 5 description, 6 reports counted,
#       7 crowd, 8 report ids (16 bytes each, concatenated), 9/10 the length of W's rids list
#       the caller checked the ids against and the fingerprint of its last blob (``_tail``),
#       11 '1' when the batch carried report ids (then the list is checked, even when every
#       id turned out counted before), 12 '1' when WAIT follows (a duplicate then writes a
#       counter: WAIT covers only its connection's writes, and the replication stream is
#       ordered, so a replica that has this write has the first apply, whichever connection
#       made it), 13 report ids dropped as repeats, to add to W's dupids, 14 ``_tail`` of
#       ARGV 8, then pairs of a reason and the reports the caller dropped for it, to add to
#       W's dropped
# Returns {1} applied, {0} duplicate batch, {-1, fp} params conflict, {-2, cutoff} window
# past retention, {3} the list is not the one the caller checked against (it grew, or it
# lost its tail and was refilled: a length alone cannot tell): check again.
# A blob's tail is read from rtails, not from the blob: every byte a script is given or reads
# costs Redis about 2 ms a megabyte (a script that only takes the length of a 1.6 MB argument:
# 3.2 ms; RPUSH of it: 0.45 ms), and a batch's blob is 1.6 MB per 10^5 ids. Both lists change
# only here and in retention, together, so they stay in step (a script's writes are one
# MULTI/EXEC in the AOF and the replication stream: a crash or failover loses both or neither).
_APPLY = """
local meta = redis.call('HMGET', KEYS[4], 'fingerprint', 'ids_disposed_before')
local fp = meta[1]
if fp and fp ~= ARGV[4] then return {-1, fp} end
if meta[2] and tonumber(ARGV[2]) < tonumber(meta[2]) then return {-2, meta[2]} end
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  -- with WAIT, a write on this connection, so that WAIT covers the first apply too
  if ARGV[12] == '1' then redis.call('HINCRBY', KEYS[4], 'duplicate_batches', 1) end
  return {0}
end
if ARGV[11] == '1' then
  local n = tonumber(ARGV[9])
  if redis.call('LLEN', KEYS[8]) ~= n then return {3} end
  if n > 0 and redis.call('LINDEX', KEYS[12], -1) ~= ARGV[10] then return {3} end
end
if not fp then redis.call('HSET', KEYS[4], 'fingerprint', ARGV[4], 'description', ARGV[5]) end
redis.call('SADD', KEYS[1], ARGV[1])
redis.call('SADD', KEYS[7], ARGV[1])
if #ARGV[8] > 0 then
  redis.call('RPUSH', KEYS[8], ARGV[8])
  redis.call('RPUSH', KEYS[12], ARGV[14])
  redis.call('INCRBY', KEYS[9], #ARGV[8] / 16)
end
if tonumber(ARGV[6]) > 0 then
  redis.call('HSET', KEYS[3], ARGV[1], ARGV[3])
  redis.call('SADD', KEYS[2], ARGV[2])
  redis.call('HINCRBY', KEYS[5], ARGV[6], 1)
  local crowd = redis.call('GET', KEYS[6])
  if not crowd or tonumber(ARGV[7]) < tonumber(crowd) then redis.call('SET', KEYS[6], ARGV[7]) end
end
redis.call('INCRBY', KEYS[10], ARGV[13])
for i = 15, #ARGV, 2 do redis.call('HINCRBY', KEYS[11], ARGV[i], ARGV[i + 1]) end
return {1}
"""

# KEYS: 1 the window's rids list, 2 its rtails. ARGV: 1 the blobs of it the caller has read.
# Returns its length and the ``_tail`` of the last blob the caller read (b"" when it read none
# or the list is shorter): one round trip, no blob leaves Redis (nor enters the script).
_PROBE = """
local n, s = redis.call('LLEN', KEYS[1]), tonumber(ARGV[1])
local tail = ''
if s > 0 and s <= n then tail = redis.call('LINDEX', KEYS[2], s - 1 - n) or '' end
return {n, tail}
"""

# KEYS: 1 meta, 2 ids, then per window: batches set, rids list, nrids counter, rtails list.
# ARGV: cutoff window, then the windows to dispose. SREMs each window's batch ids from the
# ids set and deletes its four keys. Returns the ids deleted (batch ids + report ids).
_DISPOSE_IDS = """
local cutoff = tonumber(ARGV[1])
local before = tonumber(redis.call('HGET', KEYS[1], 'ids_disposed_before') or '0')
if cutoff > before then redis.call('HSET', KEYS[1], 'ids_disposed_before', ARGV[1]) end
local deleted = 0
for i = 2, #ARGV do
  local batches = KEYS[4 * i - 5]
  local members = redis.call('SMEMBERS', batches)
  for j = 1, #members, 4096 do
    local slice = {}
    for t = j, math.min(j + 4095, #members) do slice[#slice + 1] = members[t] end
    redis.call('SREM', KEYS[2], unpack(slice))
  end
  deleted = deleted + #members + tonumber(redis.call('GET', KEYS[4 * i - 3]) or '0')
  redis.call('UNLINK', batches, KEYS[4 * i - 4], KEYS[4 * i - 3], KEYS[4 * i - 2])
end
return deleted
"""

# KEYS: 1 ids, 2 meta. ARGV: 1 batch id. With WAIT only: the daemon's early duplicate answer
# (``is_applied``) is an acknowledgement too, so it writes the apply script's counter, and
# the WAIT after it on the same connection covers the first apply (the replication stream is
# ordered), whichever connection made it. Returns 1 when the batch id is applied.
_DUPLICATE = """
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HINCRBY', KEYS[2], 'duplicate_batches', 1)
return 1
"""

_COMMIT_FOLD = """
local v = redis.call('HGET', KEYS[1], 'version') or '0'
if v ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'counts', ARGV[2], 'version', tostring(tonumber(v) + 1))
for i = 3, #ARGV do redis.call('HDEL', KEYS[2], ARGV[i]) end
return 1
"""


def _tail(blob: bytes) -> bytes:
    """What identifies an id blob in its list: its first and last id and its length (kept
    beside the blob in the window's ``rtails`` by the apply script). A blob refilled into
    the place of a lost one matches only if it holds the same reports at both ends and has
    the same size."""
    return blob[:16] + blob[-16:] + str(len(blob)).encode()


@dataclass(slots=True)
class _Synced:
    """A window's report ids as far as this process has read its list in Redis."""

    index: ReportIdIndex
    length: int  # blobs of the list covered
    tail: bytes  # ``_tail`` of the blob at ``length - 1`` (b"" when none)


class RedisCountStore(CountStore):
    """Counts per (metric, window) in Redis; safe to share between processes.

    ``cached_windows``: per metric, the indexes of report ids of only this many windows (the
    newest this process has seen) stay in its memory: the shuffler takes the current window,
    the one before and, within its clock skew, the one after; a late batch of an older window
    rebuilds its index from Redis for that one call. ``page_blobs``: id blobs read from Redis
    per ``LRANGE``.
    ``max_apply_attempts``: how often an apply is retried because other processes appended
    ids meanwhile before it fails as ``StoreUnavailable`` (the sender retries later).
    """

    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        fold_chunk: int = 512,
        cached_windows: int = 3,
        page_blobs: int = 256,
        max_apply_attempts: int = 16,
        min_replicas_ack: int = 0,
        wait_timeout_ms: int = 1000,
    ) -> None:
        for name, value in (
            ("fold_chunk", fold_chunk),
            ("cached_windows", cached_windows),
            ("page_blobs", page_blobs),
            ("max_apply_attempts", max_apply_attempts),
            ("wait_timeout_ms", wait_timeout_ms),
        ):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if min_replicas_ack < 0:
            raise ValueError(f"min_replicas_ack must be >= 0, got {min_replicas_ack}")
        self._r = client
        self._min_replicas_ack = min_replicas_ack
        self._wait_timeout_ms = wait_timeout_ms
        self._prefix = prefix
        self._fold_chunk = fold_chunk
        self._cached_windows = cached_windows
        self._page_blobs = page_blobs
        self._max_attempts = max_apply_attempts
        self._apply = client.register_script(_APPLY)
        self._commit_fold = client.register_script(_COMMIT_FOLD)
        self._dispose_ids = client.register_script(_DISPOSE_IDS)
        self._probe = client.register_script(_PROBE)
        self._duplicate = client.register_script(_DUPLICATE)
        # (metric, window) -> the window's report ids as far as this process has read them
        self._id_cache: dict[tuple[str, int], _Synced] = {}
        self._ids_lock = threading.Lock()
        #: applies refused because the id list changed since this process read it (a
        #: metric for operators: a steady rise means processes contend for one window)
        self.apply_retries = 0
        #: indexes rebuilt from Redis: a late batch of an uncached window, or a list that
        #: lost its tail (Redis restarted from an older AOF, or failed over to a replica)
        self.index_rebuilds = 0

    @classmethod
    def from_url(cls, url: str, **kwargs: Any) -> RedisCountStore:
        """``redis://``, ``rediss://``, ``unix://`` (one node) or ``redis+cluster://``."""
        # redis-py's default retries resend a command after a socket failure; every
        # write here is idempotent (batch ids, versioned folds), so that is safe
        client = blocking_client(url, timeout=10.0, resend=True, error=StoreUnavailable)
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
        except redis.exceptions.RedisClusterException as exc:
            # not a RedisError: no node of the cluster answers, or the slot map has holes
            # (the fold thread catches only StoreError and would die of it)
            raise StoreUnavailable(f"redis cluster unavailable: {exc}") from None

    # -- CountStore -------------------------------------------------------------------------
    def is_applied(self, metric: str, batch_id: bytes) -> bool:
        """With ``min_replicas_ack`` N, True only once N replicas have the batch's apply:
        the daemon answers such a batch as a duplicate, and the shuffler then deletes it, so
        the answer must wait as the apply does (else ``StoreUnavailable``: an apply whose
        WAIT failed would be acknowledged on its retry, and lost in a failover)."""
        key = self._k(metric, "ids")
        seen = bool(self._call(lambda: self._r.sismember(key, batch_id)))  # type: ignore[arg-type]
        if not seen or not self._min_replicas_ack:
            return seen
        keys, args = [key, self._k(metric, "meta")], [batch_id]
        return bool(int(self._call(lambda: self._replicated(self._duplicate, keys, args))))

    def apply_reports(
        self,
        metric: str,
        window: int,
        batch_id: bytes,
        fingerprint: int,
        delta: CountsLike,
        report_ids: ReportIds,
        *,
        description: str = "",
        repeated: int = 0,
        dropped: Mapping[str, int] | None = None,
    ) -> ApplyOutcome:
        drops = checked_drops(repeated, dropped)
        keys = [
            self._k(metric, "ids"),
            self._k(metric, "windows"),
            self._k(metric, f"w:{window}:deltas"),
            self._k(metric, "meta"),
            self._k(metric, f"w:{window}:sizes"),
            self._k(metric, f"w:{window}:crowd"),
            self._k(metric, f"w:{window}:batches"),
            self._k(metric, f"w:{window}:rids"),
            self._k(metric, f"w:{window}:nrids"),
            self._k(metric, f"w:{window}:dupids"),
            self._k(metric, f"w:{window}:dropped"),
            self._k(metric, f"w:{window}:rtails"),
        ]
        if not report_ids.ids:  # nothing to de-duplicate: no index, no list to check
            plain = self._run_apply(
                keys, metric, window, batch_id, fingerprint, delta, report_ids, description,
                None, repeated, drops,
            )  # fmt: skip
            if plain is None:  # pragma: no cover - the script checks no list without ids
                raise StoreError("apply script refused a batch without report ids")
            return plain
        given_ids, given_delta = report_ids, delta
        with self._ids_lock:
            try:
                for _attempt in range(self._max_attempts):
                    synced = self._synced(metric, window, keys[7], keys[11])
                    report_ids, delta, duplicates = given_ids, given_delta, 0
                    check = synced.index.check(report_ids.ids)
                    positions = check.present
                    if positions.size:  # counted before: recount the batch without them
                        duplicates = int(positions.size)
                        report_ids, delta = report_ids.without(positions)
                    outcome = self._run_apply(
                        keys, metric, window, batch_id, fingerprint, delta, report_ids,
                        description, synced, duplicates + repeated, drops,
                    )  # fmt: skip
                    if outcome is None:  # the list changed since we read it: read, check again
                        self.apply_retries += 1
                        continue
                    if outcome.applied and report_ids.ids:
                        synced.index.record(check)  # the ids not present: those applied
                        synced.length += 1
                        synced.tail = _tail(report_ids.ids)
                    return replace(outcome, duplicates=duplicates) if outcome.applied else outcome
            finally:
                self._evict(metric)
        log.warning(
            "apply of a batch to %s window %d gave up after %d attempts: other "
            "processes kept appending report ids",
            metric,
            window,
            self._max_attempts,
        )
        raise StoreUnavailable(
            f"window {window} of metric {metric!r}: report ids changed on each of "
            f"{self._max_attempts} attempts (contention); retry later"
        )

    def _run_apply(
        self,
        keys: list[str],
        metric: str,
        window: int,
        batch_id: bytes,
        fingerprint: int,
        delta: CountsLike,
        report_ids: ReportIds,
        description: str,
        checked: _Synced | None,
        repeats: int,
        drops: dict[str, int],
    ) -> ApplyOutcome | None:
        """One run of the apply script with the window's id list as ``checked`` (None for
        a batch without report ids); None when the list is not the one checked.
        ``repeats``: the ids dropped as repeats, to add to the window's count; ``drops``:
        the reports dropped before counting, by reason."""
        totals = np.asarray(delta.totals)
        counted = int(totals.sum())
        args: list[bytes | str] = [
            batch_id,
            str(window),
            encode_counts(delta) if counted else b"",
            str(fingerprint),
            description,
            str(counted),
            str(batch_crowd(totals)),
            report_ids.ids,
            str(checked.length) if checked else "0",
            checked.tail if checked else b"",
            "1" if checked else "0",
            "1" if self._min_replicas_ack else "0",
            str(repeats),
            _tail(report_ids.ids) if report_ids.ids else b"",
            *(x for reason, n in drops.items() for x in (reason, str(n))),
        ]
        result = self._call(lambda: self._replicated(self._apply, keys, args))
        status = int(result[0])
        if status == 3:
            return None
        if status == -1:
            raise ParamsConflict(
                f"metric {metric!r} has counts under params fingerprint "
                f"{int(result[1]):#018x}, this batch has {fingerprint:#018x}"
            )
        if status == -2:
            raise WindowDisposed(
                f"window {window} of metric {metric!r} is past retention (ids kept "
                f"from window {int(result[1])} on)"
            )
        if status == 0:
            return ApplyOutcome(applied=False, counted=0, duplicates=0)
        return ApplyOutcome(applied=True, counted=counted, duplicates=0)

    def _replicated(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        """Run ``script`` on the master of its slot; with ``min_replicas_ack`` N, then
        ``WAIT N`` on the same connection (WAIT covers only its own connection's writes):
        fewer than N replicas in time raises ``StoreUnavailable`` (the sender retries; the
        batch id makes the retry a duplicate, which writes again and WAITs again). On a
        cluster a redirected call did not run: the slot map is read again and the call
        resent, at most 3 times."""
        if not self._min_replicas_ack:
            return script(keys=keys, args=args)
        client: Any = self._r
        cluster = isinstance(client, redis.cluster.RedisCluster)
        for _attempt in range(3):
            node = client
            if cluster:
                node = client.get_redis_connection(client.get_node_from_key(keys[0]))
            pipe = node.pipeline(transaction=False)
            script(keys=keys, args=args, client=pipe)
            pipe.execute_command("WAIT", self._min_replicas_ack, self._wait_timeout_ms)
            try:
                reply, acked = pipe.execute(raise_on_error=False)
            except (redis.ConnectionError, redis.TimeoutError):
                if cluster:  # the master may be gone: read the slot map again
                    with contextlib.suppress(redis.RedisError):
                        client.nodes_manager.initialize()
                raise
            if cluster and redirected(reply):
                client.nodes_manager.initialize()  # it did not run: read the slot map again
                continue
            if isinstance(reply, Exception):
                raise reply
            if isinstance(acked, Exception) or int(acked) < self._min_replicas_ack:
                raise StoreUnavailable(
                    f"redis: the write reached {acked} replica(s) within "
                    f"{self._wait_timeout_ms} ms, {self._min_replicas_ack} required "
                    "(--min-replicas-ack)"
                )
            return reply
        raise StoreUnavailable("redis: the slot kept moving (MOVED/ASK) on 3 attempts")

    def _synced(self, metric: str, window: int, key: str, tails: str) -> _Synced:
        """This process's index of the report ids of ``window`` (``key``: its list),
        brought up to date with the list in Redis: only blobs appended since the last look
        are read, after checking (in Redis, one round trip) that the last blob read is
        still where it was."""
        mine = self._id_cache.get((metric, window))
        arg = str(mine.length if mine else 0)
        length, tail = self._call(lambda: self._probe(keys=[key, tails], args=[arg]))
        return self._refresh(metric, window, key, mine, int(length), bytes(tail))

    def _refresh(
        self, metric: str, window: int, key: str, entry: _Synced | None, length: int, tail: bytes
    ) -> _Synced:
        if entry is not None and entry.length and (length < entry.length or tail != entry.tail):
            # the list lost blobs we had read (Redis restarted from an older AOF, a failover
            # to a lagging replica, disposal), maybe refilled by others since: start over
            entry = None
        if entry is None:
            if length:
                self.index_rebuilds += 1
            entry = _Synced(ReportIdIndex(), 0, b"")
        while entry.length < length:  # the new blobs, a page at a time
            blobs = self._lrange(key, entry.length, entry.length + self._page_blobs - 1)
            for blob in blobs:
                entry.index.add(blob)
            if not blobs:
                break
            entry.length += len(blobs)
            entry.tail = _tail(blobs[-1])
        self._id_cache[(metric, window)] = entry
        return entry

    def _lrange(self, key: str, start: int, stop: int) -> list[bytes]:
        blobs: list[Any] = self._call(lambda: self._r.lrange(key, start, stop))
        return [bytes(b) for b in blobs]

    def _evict(self, metric: str) -> None:
        """Keep the indexes of only ``metric``'s ``cached_windows`` newest windows."""
        mine = sorted(w for (m, w) in self._id_cache if m == metric)
        for w in mine[: -self._cached_windows]:
            del self._id_cache[(metric, w)]

    def dispose_ids(self, metric: str, before_window: int) -> int:
        old = [w for w in self.windows_with_ids(metric) if w < before_window]
        keys = [self._k(metric, "meta"), self._k(metric, "ids")]
        for w in old:
            keys += [
                self._k(metric, f"w:{w}:batches"),
                self._k(metric, f"w:{w}:rids"),
                self._k(metric, f"w:{w}:nrids"),
                self._k(metric, f"w:{w}:rtails"),
            ]
        args = [str(before_window), *(str(w) for w in old)]
        deleted = int(self._call(lambda: self._dispose_ids(keys=keys, args=args)))
        with self._ids_lock:
            for key in [k for k in self._id_cache if k[0] == metric and k[1] < before_window]:
                del self._id_cache[key]
        return deleted

    def windows_with_ids(self, metric: str) -> list[int]:
        """Windows that still hold batch ids or report ids (retention has not run on them)."""
        pattern = f"{self._prefix}:{{{metric}}}:w:*:batches"
        keys = self._call(lambda: list(self._r.scan_iter(match=pattern, count=1000)))
        head = len(self._k(metric, "w:"))
        return sorted(int(k.decode()[head:-8]) for k in keys)

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

    def duplicate_reports(self, metric: str, windows: Iterable[int] | None = None) -> int | None:
        stored = set(self.windows(metric))
        wanted = sorted(stored if windows is None else set(windows))
        if not wanted:
            return 0
        keys = [self._k(metric, f"w:{w}:dupids") for w in wanted]
        values = self._call(lambda: self._r.mget(keys))
        total = 0
        for w, value in zip(wanted, values, strict=True):
            if value is None:
                if w in stored:  # its counter was lost: unknown, not 0
                    return None
                continue
            total += int(value)
        return total

    def dropped_reports(self, metric: str, windows: Iterable[int]) -> dict[str, int]:
        keys = [self._k(metric, f"w:{w}:dropped") for w in sorted(set(windows))]

        def read() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for key in keys:
                pipe.hgetall(key)
            return pipe.execute()  # type: ignore[no-any-return]

        out: dict[str, int] = {}
        for by_reason in self._call(read) if keys else []:
            for reason, n in by_reason.items():
                name = reason.decode() if isinstance(reason, bytes) else str(reason)
                out[name] = out.get(name, 0) + int(n)
        return out

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

    def note_batch(self, metric: str, window: int, *, sealed: bool, window_seconds: int) -> None:
        key = self._k(metric, f"w:{window}:notes")
        kind = "sealed" if sealed else "clear"
        self._call(lambda: self._r.hset(key, mapping={kind: 1, "seconds": window_seconds}))

    def window_seconds(self, metric: str) -> int | None:
        stored = self.windows(metric)
        if not stored:
            return None
        value = self._call(
            lambda: self._r.hget(self._k(metric, f"w:{stored[-1]}:notes"), "seconds")
        )
        return None if value is None else int(value)

    def sealing(self, metric: str, windows: Iterable[int] | None = None) -> bool | None:
        stored = self.windows(metric)
        wanted = [w for w in (stored if windows is None else sorted(set(windows))) if w in stored]

        def read() -> list[Any]:
            pipe = self._r.pipeline(transaction=False)
            for w in wanted:
                pipe.hkeys(self._k(metric, f"w:{w}:notes"))
            return pipe.execute()  # type: ignore[no-any-return]

        notes = [
            {k in (b"sealed", "sealed") for k in keys if k not in (b"seconds", "seconds")} or None
            for keys in (self._call(read) if wanted else [])
        ]
        return sealing_of(notes)

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
        if isinstance(flat[0], list):  # redis-py's cluster MULTI gives [field, value] pairs
            flat = [item for pair in flat for item in pair]
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
