"""A minimal RESP2 connection for the group commit's one hot command.

redis-py spends ~60 µs of CPU per EVALSHA here (~280 Python calls per command)
and ~140 µs with 8 request threads contending for the GIL; the group-commit
write is one EVALSHA per flush, so on the device-style path that was a large
share of the shuffler's CPU. This connection encodes that one command and
parses its integer reply directly. Everything else in the Redis store stays on
redis-py. Plain TCP only (``redis://``); the store falls back to redis-py for
``rediss://`` and ``unix://``.

Any socket or protocol error closes the connection and raises
``StoreUnavailable``; the next call reconnects. The caller serializes calls
(the group commit has one writer at a time); a lock guards it anyway.
"""

from __future__ import annotations

import hashlib
import socket
import threading

from shuffler.errors import StoreUnavailable

__all__ = ["RespConnection", "encode_command"]


def encode_command(*parts: bytes) -> bytes:
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(p), p))
    return b"".join(out)


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
        user, password = self._auth
        if password is not None:
            parts = [b"AUTH", *([user.encode()] if user else []), password.encode()]
            self._roundtrip(encode_command(*parts))
        if self._db:
            self._roundtrip(encode_command(b"SELECT", str(self._db).encode()))
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
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b":":
            return int(rest)
        if kind == b"+":
            return rest
        if kind == b"-":
            raise _RedisReplyError(rest.decode(errors="replace"))
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            assert self._sock is not None
            while len(self._buf) < n + 2:
                data = self._sock.recv(65536)
                if not data:
                    raise ConnectionError("redis closed the connection")
                self._buf += data
            value, self._buf = self._buf[:n], self._buf[n + 2 :]
            return value
        raise ConnectionError(f"unexpected RESP reply type {kind!r}")

    def _roundtrip(self, command: bytes) -> bytes | int | None:
        assert self._sock is not None
        self._sock.sendall(command)
        return self._reply()

    def eval(self, script: str, keys: list[bytes], args: list[bytes]) -> bytes | int | None:
        """EVALSHA, falling back to EVAL once when the script is not cached."""
        sha = hashlib.sha1(script.encode()).hexdigest().encode()
        tail = [str(len(keys)).encode(), *keys, *args]
        with self._lock:
            try:
                if self._sock is None:
                    self._connect()
                try:
                    return self._roundtrip(encode_command(b"EVALSHA", sha, *tail))
                except _RedisReplyError as exc:
                    if not str(exc).startswith("NOSCRIPT"):
                        raise
                    return self._roundtrip(encode_command(b"EVAL", script.encode(), *tail))
            except _RedisReplyError as exc:
                raise StoreUnavailable(f"redis: {exc}") from None
            except (OSError, ConnectionError, ValueError) as exc:
                self.close_unlocked()
                raise StoreUnavailable(f"redis: {type(exc).__name__}: {exc}") from None

    def close_unlocked(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buf = None, b""

    def close(self) -> None:
        with self._lock:
            self.close_unlocked()


class _RedisReplyError(Exception):
    """An error reply from Redis (``-ERR ...``)."""
