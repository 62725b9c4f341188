"""The shuffler's store on a Redis Cluster: a flush split per slot, and WAIT.

A metric's keys share its hash tag, so it lives in one slot. A group-commit flush may
carry several metrics and a cluster refuses a script spanning slots (CROSSSLOT), so
``AsyncClusterAppender`` sends one append script per slot to the slot's master (one
``AsyncScriptConnection`` per master, one round trip per master, masters in parallel).
A flush is atomic per metric: failed slots raise ``PartialWrite`` naming their metrics.
``min_replicas_ack`` N > 0 ends each round trip with ``WAIT N timeout`` on the same
connection; too few replicas is ``StoreNotReplicated``. MOVED, ASK, TRYAGAIN and
CLUSTERDOWN mean the script did not run: the slot map is re-read and those scripts
resent (``_ATTEMPTS``). A socket failure after sending is ``StoreOutcomeUnknown`` and is
never resent here. Why: docs/design.md, "Shuffler".
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Sequence
from typing import Any

from crowdmix.core.redis_url import ClusterUrl, redirected
from crowdmix.shuffler.errors import (
    PartialWrite,
    StoreNotReplicated,
    StoreOutcomeUnknown,
    StoreUnavailable,
)
from crowdmix.shuffler.redis_async import AsyncScriptConnection, ScriptCall, reply_text
from crowdmix.shuffler.store import PendingWrite

__all__ = ["WAIT_TIMEOUT_MS", "AsyncClusterAppender", "key_slot"]

#: How long WAIT waits for the replicas before the write is refused as not replicated.
WAIT_TIMEOUT_MS = 1000
_ATTEMPTS = 3

Node = tuple[str, int]


def key_slot(key: bytes) -> int:
    """The cluster slot of ``key`` (CRC16 of its hash tag, mod 16384)."""
    from redis.crc import key_slot as slot

    return int(slot(key))


class AsyncClusterAppender:
    """The append of ``store`` (a ``RedisStore`` on a cluster) for one event loop."""

    def __init__(
        self,
        store: Any,
        cluster: ClusterUrl,
        *,
        script: str,
        timeout: float,
        min_replicas_ack: int = 0,
    ) -> None:
        self._store = store
        self._cluster = cluster
        self._script = script
        self._timeout = timeout
        self._wait = (min_replicas_ack, WAIT_TIMEOUT_MS) if min_replicas_ack > 0 else None
        self._starts: list[int] = []  # first slot of each range, sorted
        self._ranges: list[tuple[int, int, Node]] = []
        self._connections: dict[Node, AsyncScriptConnection] = {}

    def _connection(self, node: Node) -> AsyncScriptConnection:
        if node not in self._connections:
            url = self._cluster.node_url(*node)
            self._connections[node] = AsyncScriptConnection(url, timeout=self._timeout)
        return self._connections[node]

    async def _refresh(self) -> None:
        """Read the slot map from any node that answers (known masters, then the seeds)."""
        candidates = list(dict.fromkeys([*(n for _, _, n in self._ranges), *self._cluster.nodes]))
        last: Exception | None = None
        for node in candidates:
            try:
                reply = await self._connection(node).command(b"CLUSTER", b"SLOTS")
            except StoreUnavailable as exc:
                last = exc
                continue
            ranges = []
            for entry in reply:
                host = entry[2][0].decode() if isinstance(entry[2][0], bytes) else entry[2][0]
                ranges.append((int(entry[0]), int(entry[1]), (host or node[0], int(entry[2][1]))))
            ranges.sort()
            self._ranges = ranges
            self._starts = [r[0] for r in ranges]
            return
        raise StoreUnavailable(f"no node of the Redis Cluster answered CLUSTER SLOTS: {last}")

    def _master(self, slot: int) -> Node | None:
        i = bisect.bisect_right(self._starts, slot) - 1
        if i < 0 or not self._ranges[i][0] <= slot <= self._ranges[i][1]:
            return None
        return self._ranges[i][2]

    async def append(self, writes: Sequence[PendingWrite]) -> None:
        by_slot: dict[int, list[PendingWrite]] = {}
        for w in writes:
            if w.count:
                slot = key_slot(self._store.metric_key(w.metric))
                by_slot.setdefault(slot, []).append(w)
        if not by_slot:
            return
        failed: dict[str, StoreUnavailable] = {}
        todo = sorted(by_slot)
        for attempt in range(_ATTEMPTS):
            if not self._ranges or attempt > 0:
                try:
                    await self._refresh()
                except StoreUnavailable as exc:
                    for slot in todo:
                        failed.update((w.metric, exc) for w in by_slot[slot])
                    break
            per_node: dict[Node, list[int]] = {}
            for slot in todo:
                node = self._master(slot)
                if node is None:  # a slot no master serves (yet): the cluster is down
                    cause = StoreUnavailable(f"redis: CLUSTERDOWN slot {slot} is not served")
                    failed.update((w.metric, cause) for w in by_slot[slot])
                else:
                    per_node.setdefault(node, []).append(slot)
            nodes = list(per_node)
            results = await asyncio.gather(
                *(self._send(node, per_node[node], by_slot) for node in nodes),
                return_exceptions=True,
            )
            todo = []
            for node, result in zip(nodes, results, strict=True):
                slots = per_node[node]
                if isinstance(result, BaseException):
                    if not isinstance(result, StoreUnavailable):
                        if not isinstance(result, Exception):
                            raise result  # cancelled
                        result = StoreOutcomeUnknown(f"redis: {type(result).__name__}")
                    self._ranges, self._starts = [], []  # the master may be gone: ask again
                    for slot in slots:
                        failed.update((w.metric, result) for w in by_slot[slot])
                    continue
                todo += self._settle(node, slots, result, by_slot, failed, attempt)
            if not todo:
                break
        if failed:
            self._raise(failed, {w.metric for w in writes if w.count})

    async def _send(
        self, node: Node, slots: list[int], by_slot: dict[int, list[PendingWrite]]
    ) -> Any:
        calls: list[ScriptCall] = []
        for slot in slots:
            keys, args = self._store.append_args(by_slot[slot])
            calls.append((self._script, keys, args))
        return await self._connection(node).eval_many(calls, wait=self._wait)

    def _settle(
        self,
        node: Node,
        slots: list[int],
        replies: list[Any],
        by_slot: dict[int, list[PendingWrite]],
        failed: dict[str, StoreUnavailable],
        attempt: int,
    ) -> list[int]:
        """Record the failed metrics of one master's round trip; return the slots to
        send again (redirected: their scripts did not run)."""
        again: list[int] = []
        ran: list[int] = []
        for slot, reply in zip(slots, replies, strict=False):
            if isinstance(reply, Exception):
                if redirected(reply) and attempt + 1 < _ATTEMPTS:
                    again.append(slot)
                    continue
                cause = StoreUnavailable(f"redis {node[0]}:{node[1]}: {reply_text(reply)}")
                failed.update((w.metric, cause) for w in by_slot[slot])
            else:
                ran.append(slot)
        if self._wait is not None and ran:
            acked = replies[-1]
            if isinstance(acked, Exception) or int(acked) < self._wait[0]:
                have = acked if not isinstance(acked, Exception) else f"WAIT failed: {acked}"
                cause = StoreNotReplicated(
                    f"redis {node[0]}:{node[1]}: the write reached {have} replica(s) within "
                    f"{self._wait[1]} ms, {self._wait[0]} required (--min-replicas-ack)"
                )
                for slot in ran:
                    failed.update((w.metric, cause) for w in by_slot[slot])
        return again

    @staticmethod
    def _raise(failed: dict[str, StoreUnavailable], metrics: set[str]) -> None:
        causes = list(failed.values())
        # "may have run" is the stronger statement: a sender must not assume nothing was stored
        cause = next((c for c in causes if isinstance(c, StoreOutcomeUnknown)), causes[0])
        if set(failed) >= metrics:
            raise cause
        raise PartialWrite(frozenset(failed), cause)

    async def aclose(self) -> None:
        for connection in self._connections.values():
            await connection.aclose()
