"""The shuffler's HTTP port: ``Submit`` and ``GetConfig`` as plain HTTP POST in the Connect
protocol's unary format, for devices that cannot speak gRPC (browsers).

    POST /crowdmix.v2.Shuffler/Submit      Content-Type: application/proto
    Authorization: Bearer <token>          body: a SubmitRequest; reply: a SubmitResponse

A failure is an HTTP status with a Connect error body, ``{"code": "invalid_argument",
"message": "<reason>: ..."}``, the same codes and details as the gRPC port. The calls run
through ``ShufflerServicer``'s own methods on the same event loop (one intake path: the
same authentication, validation, limits, statuses and metrics by construction). CORS:
the origins in ``http_allow_origins`` (``*`` for any). Served by Hypercorn (HTTP/1.1 and
HTTP/2, h2c or TLS with ALPN) on the grpc.aio server's loop, so a call awaits the same
group commit. Why Hypercorn: docs/design.md, "Shuffler".
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

import grpc

from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.shuffler.errors import BindError
from crowdmix.shuffler.metrics import ShufflerMetrics
from crowdmix.shuffler.servicer import SERVICE_NAME, ShufflerServicer

try:
    from hypercorn.asyncio import serve as _hypercorn_serve
    from hypercorn.config import Config as _HypercornConfig
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
    raise ModuleNotFoundError(
        "the shuffler's HTTP port needs hypercorn: pip install 'crowdmix[shuffler]'",
        name=exc.name,
    ) from None

__all__ = ["CONNECT_STATUS", "ConnectApp", "HttpPort"]

log = logging.getLogger("crowdmix.shuffler")

# Connect's code -> HTTP status (connectrpc.com/docs/protocol, "Error Codes").
CONNECT_STATUS: Final = {
    "canceled": 499,
    "unknown": 500,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "failed_precondition": 400,
    "aborted": 409,
    "out_of_range": 400,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "data_loss": 500,
    "unauthenticated": 401,
}
_METHODS: Final = ("Submit", "GetConfig")
_ALLOWED_HEADERS: Final = (
    "authorization, content-type, connect-protocol-version, connect-timeout-ms"
)
_Send = Callable[[dict[str, Any]], Awaitable[None]]
_Receive = Callable[[], Awaitable[dict[str, Any]]]


def connect_code(code: grpc.StatusCode) -> str:
    """Connect's name of a gRPC status code (the same set; CANCELLED is "canceled")."""
    return "canceled" if code == grpc.StatusCode.CANCELLED else code.name.lower()


class _Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class _CallContext:
    """What ``ShufflerServicer`` reads of a gRPC call, for one HTTP request: its bearer
    token (``invocation_metadata``), its connection (``peer``, the rate limiter's key,
    held in memory only) and ``abort``, which ends the call with a status."""

    __slots__ = ("_metadata", "_peer")

    def __init__(self, authorization: str | None, peer: str) -> None:
        self._metadata = (("authorization", authorization),) if authorization else ()
        self._peer = peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Aborted(code, details)


class ConnectApp:
    """The ASGI application of the HTTP port."""

    def __init__(
        self,
        servicer: ShufflerServicer,
        metrics: ShufflerMetrics,
        *,
        max_request_bytes: int,
        max_concurrent_calls: int,
        allow_origins: tuple[str, ...] = (),
    ) -> None:
        self._servicer = servicer
        self._metrics = metrics
        self._max_bytes = max_request_bytes
        self._max_calls = max_concurrent_calls
        self._origins = frozenset(allow_origins)
        self._calls = 0
        self.draining = False

    async def __call__(self, scope: dict[str, Any], receive: _Receive, send: _Send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        cors = self._cors(headers.get("origin"))
        method = scope["method"]
        if method == "OPTIONS":
            await _respond(send, 204 if cors else 403, b"", cors + _preflight(cors))
            return
        service, _, name = scope["path"].lstrip("/").partition("/")
        if service != SERVICE_NAME or name not in _METHODS:
            await self._error(
                send, cors, "unimplemented", f"no such method {scope['path'][:200]!r}"
            )
            return
        if method != "POST":
            await _respond(send, 405, b"POST only\n", [*cors, (b"allow", b"POST, OPTIONS")])
            return
        if headers.get("content-type", "").split(";")[0].strip() != "application/proto":
            await _respond(send, 415, b"Content-Type must be application/proto\n", cors)
            return
        if headers.get("connect-protocol-version", "1") != "1":
            await self._error(send, cors, "invalid_argument", "connect-protocol-version must be 1")
            return
        if headers.get("content-encoding", "identity") != "identity":
            await self._error(
                send, cors, "unimplemented", "content-encoding must be identity", accept=True
            )
            return
        if self.draining:
            await self._error(send, cors, "unavailable", "shutting_down: the shuffler is stopping")
            return
        if self._calls >= self._max_calls:
            self._metrics.rejected_requests.labels("too_many_calls").inc()
            await self._error(send, cors, "resource_exhausted", "too_many_calls: retry later")
            return
        self._calls += 1
        try:
            await self._call(scope, receive, send, headers, cors, name)
        finally:
            self._calls -= 1

    async def _call(
        self,
        scope: dict[str, Any],
        receive: _Receive,
        send: _Send,
        headers: dict[str, str],
        cors: list[tuple[bytes, bytes]],
        name: str,
    ) -> None:
        body = await _read_body(receive, self._max_bytes)
        if body is None:
            self._metrics.rejected_requests.labels("too_large").inc()
            await self._error(
                send, cors, "resource_exhausted", f"too_large: over {self._max_bytes} bytes"
            )
            return
        client = scope.get("client") or ("", 0)
        context = _CallContext(headers.get("authorization"), f"http:{client[0]}:{client[1]}")
        timeout = _timeout_seconds(headers.get("connect-timeout-ms"))
        start = time.perf_counter()
        answer: pb.SubmitResponse | pb.ConfigResponse
        try:
            async with asyncio.timeout(timeout):
                if name == "Submit":
                    answer = await self._servicer.Submit(body, context)
                else:
                    answer = await self._servicer.GetConfig(body, context)
        except _Aborted as exc:
            await self._error(send, cors, connect_code(exc.code), exc.details)
            return
        except TimeoutError:
            await self._error(send, cors, "deadline_exceeded", "the call's timeout passed")
            return
        except Exception:  # a bug must not take the port down or leak a trace
            log.exception("HTTP %s failed", name)
            await self._error(send, cors, "internal", "internal error")
            return
        if name == "Submit":
            log.debug("HTTP Submit in %.1f ms", 1000 * (time.perf_counter() - start))
        await _respond(
            send,
            200,
            answer.SerializeToString(),
            [*cors, (b"content-type", b"application/proto")],
        )

    def _cors(self, origin: str | None) -> list[tuple[bytes, bytes]]:
        if origin is None or not ("*" in self._origins or origin in self._origins):
            return []
        return [
            (b"access-control-allow-origin", origin.encode("latin-1")),
            (b"vary", b"Origin"),
            (b"access-control-expose-headers", b"content-type"),
        ]

    async def _error(
        self,
        send: _Send,
        cors: list[tuple[bytes, bytes]],
        code: str,
        message: str,
        *,
        accept: bool = False,
    ) -> None:
        body = json.dumps({"code": code, "message": message}).encode()
        extra = [(b"accept-encoding", b"identity")] if accept else []
        await _respond(
            send,
            CONNECT_STATUS[code],
            body,
            [*cors, *extra, (b"content-type", b"application/json")],
        )


def _preflight(cors: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    if not cors:
        return []
    return [
        (b"access-control-allow-methods", b"POST"),
        (b"access-control-allow-headers", _ALLOWED_HEADERS.encode()),
        (b"access-control-max-age", b"7200"),
    ]


def _timeout_seconds(header: str | None) -> float | None:
    if header is None or not header.isdigit() or len(header) > 10:
        return None
    return max(int(header), 1) / 1000.0


async def _read_body(receive: _Receive, limit: int) -> bytes | None:
    """The request body, or None as soon as it passes ``limit`` bytes."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"".join(parts)
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


async def _respond(
    send: _Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


class HttpPort:
    """The HTTP port on an event loop that already runs (the gRPC server's)."""

    def __init__(
        self,
        app: ConnectApp,
        loop: asyncio.AbstractEventLoop,
        host: str,
        port: int,
        *,
        certfile: str | None = None,
        keyfile: str | None = None,
    ) -> None:
        self._app = app
        self._loop = loop
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host.strip("[]"), port))
            sock.listen(1024)
        except OSError as exc:
            sock.close()
            raise BindError(f"cannot listen on {host}:{port} (HTTP): {exc.strerror}") from None
        self.port = int(sock.getsockname()[1])
        config = _HypercornConfig()
        config.bind = [f"fd://{sock.detach()}"]
        config.accesslog = None
        config.errorlog = logging.getLogger("crowdmix.shuffler.http")
        config.graceful_timeout = 5.0
        if certfile is not None:
            config.certfile, config.keyfile = certfile, keyfile
        self._shutdown: asyncio.Event | None = None
        self._task: asyncio.Future[None] | None = None

        async def start() -> None:
            self._shutdown = asyncio.Event()
            self._task = asyncio.ensure_future(
                _hypercorn_serve(app, config, shutdown_trigger=self._shutdown.wait)  # type: ignore[arg-type]
            )

        asyncio.run_coroutine_threadsafe(start(), loop).result()

    def stop(self, grace: float) -> None:
        """Refuse new calls (UNAVAILABLE), let those in progress finish, close the port."""

        async def stop() -> None:
            self._app.draining = True
            assert self._shutdown is not None and self._task is not None
            self._shutdown.set()
            try:
                await asyncio.wait_for(self._task, timeout=grace + 1.0)
            except (TimeoutError, asyncio.CancelledError):
                pass
            except Exception as exc:  # the port must not keep the daemon from stopping
                log.warning("the HTTP port stopped with %s", exc)

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result()
