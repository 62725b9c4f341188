"""The event loop's Redis connection: the group commit's one hot write.

The shuffler's flushes (``crowdmix.shuffler.commit``) run on the gRPC server's event loop,
one at a time, each one MULTI/EXEC (on a cluster, one EVALSHA of the append script per
slot). This module sends them on one ``redis.asyncio`` connection, with hiredis parsing the replies
(and packing the command) when it is installed, as the ``shuffler`` extra does.
It replaced a hand-written RESP client (``shuffler/resp.py``), which did not win
by the 10 % end to end that would have justified keeping our own protocol code
(BENCHMARKS.md, the shuffler).

Why not ``redis.asyncio.Redis.evalsha``: this class sends the command and reads
the reply itself, so that a failure says whether the command went out, and so
that nothing resends a write that may have run (redis-py's client retries on
connection errors and timeouts by default).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import select
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from crowdmix.shuffler.errors import StoreOutcomeUnknown, StoreUnavailable

__all__ = ["AsyncScriptConnection", "ScriptCall", "reply_text"]

#: One script call: (script source, KEYS, ARGV).
ScriptCall = tuple[str, list[bytes], list[bytes]]


class AsyncScriptConnection:
    """One ``redis.asyncio`` connection for one event loop: ``eval`` sends EVALSHA of
    a script (loaded with SCRIPT LOAD once per connection, and again after a SCRIPT
    FLUSH), ``eval_many`` several in one round trip, optionally followed by WAIT.

    Any URL redis-py takes: ``redis://``, ``rediss://``, ``unix://``. An error reply
    raises ``StoreUnavailable`` and keeps the connection. A socket, timeout or
    protocol failure closes it and raises ``StoreUnavailable`` when the command
    never went out (nothing stored, retry) and its subclass ``StoreOutcomeUnknown``
    once it was sent (it may have run); the next call reconnects. A connection
    that Redis closed while idle (a restart) is noticed before sending, so a
    restarted Redis gives the retryable error. Calls are serialized (the group
    commit has one writer at a time; a lock guards it anyway).
    """

    def __init__(self, url: str, *, timeout: float = 10.0) -> None:
        import redis.asyncio
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        pool: Any = redis.asyncio.ConnectionPool.from_url(
            url,
            socket_connect_timeout=min(timeout, 5.0),
            socket_timeout=None,  # one deadline per call, ``timeout``, set in ``eval``
            retry=Retry(NoBackoff(), 0),  # never resend a write that may have run
        )
        self._connection: Any = pool.make_connection()
        try:  # hiredis packs a command in C; redis.asyncio itself packs in Python
            from hiredis import pack_command

            self._pack: Any = lambda *parts: pack_command(parts)
        except ImportError:
            self._pack = self._connection.pack_command
        self._timeout = timeout
        self._lock = asyncio.Lock()
        self._loaded: set[str] = set()  # SHA1s of the scripts loaded on this connection
        self._sent = False  # whether the call in progress sent a command that may write

    def _stale(self) -> bool:
        """Readable while idle: Redis closed it (EOF) or sent something unasked,
        whether or not the event loop has noticed yet. (redis-py's own check,
        ``can_read``, sees an EOF only once the loop has processed it; this looks
        at the socket under the connection's stream, a private attribute: if a
        redis-py release renames it, the check falls back to ``at_eof``.)"""
        conn = self._connection
        if not conn.is_connected:
            return False
        reader, writer = getattr(conn, "_reader", None), getattr(conn, "_writer", None)
        if reader is None or writer is None:
            return False
        if reader.at_eof():
            return True
        sock = writer.get_extra_info("socket")
        if sock is None:
            return False
        # poll, not select: select() refuses a descriptor >= FD_SETSIZE (1024), which a
        # shuffler holding many client connections reaches
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN)
        return bool(poller.poll(0))

    async def _call(self, *command: Any) -> Any:
        conn = self._connection
        await conn.send_packed_command(self._pack(*command), check_health=False)
        return await conn.read_response()

    async def eval(self, script: str, keys: list[bytes], args: list[bytes]) -> Any:
        """One script call; an error reply raises ``StoreUnavailable``."""
        (reply,) = await self.eval_many([(script, keys, args)])
        if isinstance(reply, Exception):
            raise StoreUnavailable(f"redis: {reply_text(reply)}")
        return reply

    async def command(self, *command: Any) -> Any:
        """One command that writes nothing (``CLUSTER SLOTS``); errors as ``eval``'s."""
        return await self._guarded(lambda: self._call(*command))

    async def eval_many(
        self, calls: Sequence[ScriptCall], *, wait: tuple[int, int] | None = None
    ) -> list[Any]:
        """Several script calls in one round trip on this one connection, then, with
        ``wait=(replicas, timeout_ms)``, ``WAIT`` for them: WAIT covers the writes of the
        connection it is sent on, so it must be this one. Returns each call's reply or
        its error reply (a ``redis.ResponseError``: MOVED, CROSSSLOT, OOM... the script
        did not run), then WAIT's reply (the replicas that have the writes) when asked.
        A socket failure raises as ``eval`` says."""
        return list(await self._guarded(lambda: self._pipelined(calls, wait)))

    async def transaction(
        self, commands: Sequence[Sequence[Any]], *, wait: tuple[int, int] | None = None
    ) -> list[Any]:
        """``MULTI``, ``commands``, ``EXEC`` in one round trip on this connection (then,
        with ``wait``, ``WAIT`` for them); returns EXEC's replies. Every command runs or
        none does: an error reply while queueing (out of memory, a wrong argument) aborts
        the transaction and raises ``StoreUnavailable`` (nothing ran); an error reply among
        EXEC's (a command that failed as it ran, after others may have written) raises
        ``StoreOutcomeUnknown``. With ``wait``, WAIT's reply (the replicas that have the
        writes) is appended to the list. A refused MULTI (an ACL without it) raises
        ``StoreOutcomeUnknown``: the commands sent behind it ran one by one, outside any
        transaction. A socket failure raises as ``eval`` says."""
        replies = await self._guarded(lambda: self._send_transaction(commands, wait))
        queued, done = replies[: len(commands) + 1], replies[len(commands) + 1]
        if isinstance(queued[0], Exception):  # no MULTI: the commands ran (or not) one by one
            raise StoreOutcomeUnknown(f"redis: MULTI refused: {reply_text(queued[0])}")
        refused = next((r for r in queued if isinstance(r, Exception)), None)
        if refused is not None:
            raise StoreUnavailable(f"redis: {reply_text(refused)}")
        if isinstance(done, Exception) or not isinstance(done, list):
            raise StoreUnavailable(
                f"redis: EXEC: {reply_text(done) if isinstance(done, Exception) else done!r}"
            )
        failed = next((r for r in done if isinstance(r, Exception)), None)
        if failed is not None:
            raise StoreOutcomeUnknown(
                f"redis: a command of the transaction failed: {reply_text(failed)}"
            )
        return [*done, *replies[len(commands) + 2 :]]

    async def _send_transaction(
        self, commands: Sequence[Sequence[Any]], wait: tuple[int, int] | None
    ) -> list[Any]:
        packed = [self._pack(b"MULTI"), *(self._pack(*c) for c in commands), self._pack(b"EXEC")]
        return await self._send_packed(packed, wait)

    async def _send_packed(self, packed: list[bytes], wait: tuple[int, int] | None) -> list[Any]:
        """Send ``packed`` (then WAIT, with ``wait``) in one write; one reply each, an
        error reply as its exception."""
        import redis

        if wait is not None:
            packed.append(self._pack(b"WAIT", wait[0], wait[1]))
        self._sent = True
        await self._connection.send_packed_command(b"".join(packed), check_health=False)
        replies: list[Any] = []
        for _ in packed:
            try:
                replies.append(await self._connection.read_response())
            except redis.ResponseError as exc:  # the whole error reply was read: go on
                replies.append(exc)
        return replies

    async def _pipelined(
        self, calls: Sequence[ScriptCall], wait: tuple[int, int] | None
    ) -> list[Any]:

        replies = await self._send_all(calls, wait)
        again = [i for i, r in enumerate(replies[: len(calls)]) if _noscript(r)]
        if again:  # SCRIPT FLUSH since we loaded them: they did not run, load and resend
            self._loaded.clear()
            retried = await self._send_all([calls[i] for i in again], wait)
            for i, reply in zip(again, retried, strict=False):
                replies[i] = reply
            if wait is not None:
                replies[-1] = retried[-1]
        return replies

    async def _send_all(
        self, calls: Sequence[ScriptCall], wait: tuple[int, int] | None
    ) -> list[Any]:
        import redis

        conn = self._connection
        for script in {script for script, _, _ in calls if _sha1(script) not in self._loaded}:
            # before any write: a failure here leaves nothing written
            await conn.send_packed_command(self._pack(b"SCRIPT", b"LOAD", script), False)
            try:
                await conn.read_response()
            except redis.ResponseError as exc:  # it does not compile: nothing was sent
                return [exc] * (len(calls) + (wait is not None))
            self._loaded.add(_sha1(script))
        packed = [
            self._pack(b"EVALSHA", _sha1(script), len(keys), *keys, *args)
            for script, keys, args in calls
        ]
        return await self._send_packed(packed, wait)

    async def _guarded(self, call: Callable[[], Awaitable[Any]]) -> Any:
        import redis
        from redis.exceptions import (
            AuthenticationError,
            AuthorizationError,
            BusyLoadingError,
        )

        conn = self._connection
        async with self._lock:
            self._sent = False  # under the lock: another call's flag is not ours
            try:
                async with asyncio.timeout(self._timeout):
                    if self._stale():
                        await conn.disconnect()
                    if not conn.is_connected:
                        self._loaded.clear()
                        try:
                            await conn.connect()
                        except BaseException:
                            await conn.disconnect()  # never reuse a failed AUTH or SELECT
                            raise
                    return await call()
            except redis.ResponseError as exc:
                # an error reply to AUTH, SELECT or SCRIPT LOAD, or to a lone command
                if not conn.is_connected or not self._sent:
                    await conn.disconnect()
                raise StoreUnavailable(f"redis: {reply_text(exc)}") from None
            except (AuthenticationError, AuthorizationError, BusyLoadingError) as exc:
                # error replies that redis-py raises as connection errors (WRONGPASS,
                # NOAUTH, LOADING after a restart): Redis refused the command, it did not run
                await conn.disconnect(nowait=True)
                raise StoreUnavailable(f"redis: {reply_text(exc)}") from None
            except (redis.ConnectionError, redis.TimeoutError, OSError, EOFError) as exc:
                # TimeoutError is an OSError; a half-read reply leaves the stream unusable
                await conn.disconnect(nowait=True)
                kind = StoreOutcomeUnknown if self._sent else StoreUnavailable
                raise kind(f"redis: {type(exc).__name__}: {exc}") from None
            except asyncio.CancelledError:
                await conn.disconnect(nowait=True)
                raise

    async def aclose(self) -> None:
        async with self._lock:
            await self._connection.disconnect()


def _noscript(reply: Any) -> bool:
    from redis.exceptions import NoScriptError

    return isinstance(reply, NoScriptError)


def reply_text(exc: Exception) -> str:
    """The error reply as Redis sent it: redis-py strips a known code (``ERR``,
    ``WRONGPASS``, ...) into ``status_code``; put it back."""
    code = getattr(exc, "status_code", None)
    return f"{code} {exc}" if code else str(exc)


@functools.lru_cache(maxsize=16)
def _sha1(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()
