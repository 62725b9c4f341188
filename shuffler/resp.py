"""A minimal RESP2 client for the group commit's one hot command, sync and asyncio.

redis-py spends ~60 µs of CPU per EVALSHA here (~280 Python calls per command)
and ~140 µs with 8 request threads contending for the GIL; the group-commit
write is one EVALSHA per flush, so on the device-style path that was a large
share of the shuffler's CPU. These connections encode that one command and
parse its short reply directly. Everything else in the Redis store stays on
redis-py. Plain TCP only (``redis://``); the store falls back to redis-py for
``rediss://`` and ``unix://``.

``RespConnection`` is the blocking one (the sync server's group commit);
``AsyncRespConnection`` runs on the asyncio server's event loop, so a flush
there costs no thread hand-off at all. Both share the reply parsing.

Any socket, timeout or protocol error closes the connection and raises
``StoreUnavailable`` when the command never reached Redis, and its subclass
``StoreOutcomeUnknown`` once the command was sent (it may have run); the next
call reconnects. A connection that Redis closed while idle (a restart) is
noticed before sending, so a restarted Redis gives the retryable error. The
caller serializes calls (the group commit has one writer at a time); a lock
guards it anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import select
import socket
import threading
from dataclasses import dataclass

from shuffler.errors import StoreOutcomeUnknown, StoreUnavailable

__all__ = ["AsyncRespConnection", "RespConnection", "encode_command"]


def encode_command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


@dataclass(frozen=True, slots=True)
class _BulkHeader:
    """``$<n>``: a bulk string of n bytes (and CRLF) follows; n < 0 is nil."""

    length: int


def _scalar(line: bytes) -> bytes | int | _BulkHeader:
    """Interpret one reply line (without its CRLF); errors raise ``_RedisReplyError``."""
    kind, rest = line[:1], line[1:]
    if kind == b":":
        return int(rest)
    if kind == b"+":
        return rest
    if kind == b"-":
        raise _RedisReplyError(rest.decode(errors="replace"))
    if kind == b"$":
        return _BulkHeader(int(rest))
    raise ConnectionError(f"unexpected RESP reply type {kind!r}")


@functools.lru_cache(maxsize=16)
def _sha1(script: str) -> bytes:
    return hashlib.sha1(script.encode()).hexdigest().encode()


class _Script:
    """A script call: EVALSHA, and EVAL (built only if the server lacks the script)."""

    def __init__(self, script: str, keys: list[bytes], args: list[bytes]) -> None:
        self._script = script
        self._tail = [str(len(keys)).encode(), *keys, *args]
        self.evalsha = encode_command(b"EVALSHA", _sha1(script), *self._tail)
        self.sent = False  # True once the command went out: a failure is then ambiguous

    def eval(self) -> bytes:
        return encode_command(b"EVAL", self._script.encode(), *self._tail)

    def failed(self, exc: BaseException) -> StoreUnavailable:
        """The store error for a socket, timeout or protocol failure of this call."""
        kind = StoreOutcomeUnknown if self.sent else StoreUnavailable
        return kind(f"redis: {type(exc).__name__}: {exc}")


def _login(db: int, username: str | None, password: str | None) -> list[bytes]:
    """The commands a fresh connection sends first (AUTH, SELECT)."""
    out = []
    if password is not None:
        out.append(
            encode_command(b"AUTH", *([username.encode()] if username else []), password.encode())
        )
    if db:
        out.append(encode_command(b"SELECT", str(db).encode()))
    return out


class RespConnection:
    def __init__(
        self,
        host: str,
        port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self._addr = (host, port)
        self._db = db
        self._auth = (username, password)
        self._timeout = timeout
        self._sock: socket.socket | None = None
        self._buf = b""
        self._lock = threading.Lock()

    def _connect(self) -> socket.socket:
        sock = socket.create_connection(self._addr, timeout=self._timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock, self._buf = sock, b""
        try:
            for command in _login(self._db, *self._auth):
                self._roundtrip(command)
        except BaseException:
            self.close_unlocked()  # never reuse a connection whose AUTH or SELECT failed
            raise
        return sock

    def _line(self) -> bytes:
        assert self._sock is not None
        while b"\r\n" not in self._buf:
            data = self._sock.recv(65536)
            if not data:
                raise ConnectionError("redis closed the connection")
            self._buf += data
        line, _, self._buf = self._buf.partition(b"\r\n")
        return line

    def _reply(self) -> bytes | int | None:
        """One reply: integers and simple strings; bulk strings; errors raise."""
        value = _scalar(self._line())
        if not isinstance(value, _BulkHeader):
            return value
        n = value.length
        if n < 0:
            return None
        assert self._sock is not None
        while len(self._buf) < n + 2:
            data = self._sock.recv(65536)
            if not data:
                raise ConnectionError("redis closed the connection")
            self._buf += data
        bulk, self._buf = self._buf[:n], self._buf[n + 2 :]
        return bulk

    def _roundtrip(self, command: bytes) -> bytes | int | None:
        assert self._sock is not None
        self._sock.sendall(command)
        return self._reply()

    def _stale(self) -> bool:
        """Readable while idle: Redis closed it (EOF) or sent something unasked."""
        assert self._sock is not None
        if self._buf:
            return True
        readable, _, _ = select.select([self._sock], [], [], 0)
        return bool(readable)

    def eval(self, script: str, keys: list[bytes], args: list[bytes]) -> bytes | int | None:
        """EVALSHA, falling back to EVAL once when the script is not cached."""
        call = _Script(script, keys, args)
        with self._lock:
            try:
                if self._sock is not None and self._stale():
                    self.close_unlocked()
                if self._sock is None:
                    self._connect()
                try:
                    call.sent = True
                    return self._roundtrip(call.evalsha)
                except _RedisReplyError as exc:
                    if not str(exc).startswith("NOSCRIPT"):
                        raise
                    return self._roundtrip(call.eval())
            except _RedisReplyError as exc:
                raise StoreUnavailable(f"redis: {exc}") from None
            except (OSError, ConnectionError, ValueError) as exc:
                self.close_unlocked()
                raise call.failed(exc) from None

    def close_unlocked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buf = None, b""

    def close(self) -> None:
        with self._lock:
            self.close_unlocked()


class AsyncRespConnection:
    """The asyncio twin of ``RespConnection``: use it from one event loop only."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        db: int = 0,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self._addr = (host, port)
        self._login = _login(db, username, password)
        self._timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def _reply(self) -> bytes | int | None:
        assert self._reader is not None
        value = _scalar((await self._reader.readuntil(b"\r\n"))[:-2])
        if not isinstance(value, _BulkHeader):
            return value
        if value.length < 0:
            return None
        return (await self._reader.readexactly(value.length + 2))[:-2]

    async def _roundtrip(self, command: bytes) -> bytes | int | None:
        assert self._writer is not None
        self._writer.write(command)
        await self._writer.drain()
        return await self._reply()

    def _stale(self) -> bool:
        """Readable while idle: Redis closed it (EOF), whether or not the loop has
        processed that yet."""
        if self._reader is None or self._writer is None:
            return False
        if self._reader.at_eof():
            return True
        sock = self._writer.get_extra_info("socket")
        if sock is None:
            return False
        readable, _, _ = select.select([sock.fileno()], [], [], 0)
        return bool(readable)

    async def _eval(self, call: _Script) -> bytes | int | None:
        if self._stale():
            self._drop()  # Redis closed it while idle (a restart): reconnect before sending
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(*self._addr)
            try:
                for command in self._login:
                    await self._roundtrip(command)
            except BaseException:
                self._drop()  # never reuse a connection whose AUTH or SELECT failed
                raise
        call.sent = True
        try:
            return await self._roundtrip(call.evalsha)
        except _RedisReplyError as exc:
            if not str(exc).startswith("NOSCRIPT"):
                raise
            return await self._roundtrip(call.eval())

    async def eval(self, script: str, keys: list[bytes], args: list[bytes]) -> bytes | int | None:
        """EVALSHA, falling back to EVAL once when the script is not cached."""
        call = _Script(script, keys, args)
        async with self._lock:
            try:
                async with asyncio.timeout(self._timeout):  # no extra task, unlike wait_for
                    return await self._eval(call)
            except _RedisReplyError as exc:
                raise StoreUnavailable(f"redis: {exc}") from None
            except (
                OSError,
                EOFError,
                ConnectionError,
                ValueError,
                asyncio.LimitOverrunError,
            ) as exc:
                # TimeoutError is an OSError; a half-read reply leaves the stream unusable
                self._drop()
                raise call.failed(exc) from None
            except asyncio.CancelledError:
                self._drop()
                raise

    def _drop(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def aclose(self) -> None:
        async with self._lock:
            writer = self._writer
            self._drop()
            if writer is not None:
                with contextlib.suppress(OSError):
                    await writer.wait_closed()


class _RedisReplyError(Exception):
    """An error reply from Redis (``-ERR ...``)."""
