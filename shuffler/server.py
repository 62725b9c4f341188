"""Assemble and run a shuffler: gRPC server + group committer + releaser + metrics.

    from crowdmix.shuffler import start_shuffler, MemoryStore
    handle = start_shuffler(registry, MemoryStore(), aggregator="127.0.0.1:7500")
    print(handle.port)        # bound port (listen defaults to 127.0.0.1:0)
    handle.stop()             # graceful: stop accepting, flush, forward, close

The gRPC server is grpc.aio on an event-loop thread of its own (``AioFront``):
requests await their group commit, whose Redis write also runs on the loop.
The releaser (``crowdmix.shuffler.forwarding``) runs in a thread. (A threaded
``grpc.server`` front did half the device-style calls per second, BENCHMARKS.md.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from crowdmix.core.metrics import serve_metrics, stop_metrics
from crowdmix.core.registry import Registry
from crowdmix.shuffler.aggregator_client import AggregatorSender
from crowdmix.shuffler.commit import GroupCommitter
from crowdmix.shuffler.config import ShufflerSettings, load_tokens
from crowdmix.shuffler.config_service import PublishedKeys, RoundFile
from crowdmix.shuffler.errors import BindError, ConfigError
from crowdmix.shuffler.forwarding import Releaser, Sender
from crowdmix.shuffler.intake import Intake
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.metrics import ShufflerMetrics
from crowdmix.shuffler.servicer import SERVICE_NAME, ShufflerServicer
from crowdmix.shuffler.shuffle import RandomBytes
from crowdmix.shuffler.store import ShufflerStore
from crowdmix.shuffler.store_health import StoreWatch

__all__ = ["AioFront", "ShufflerHandle", "start_shuffler"]

log = logging.getLogger("crowdmix.shuffler")


@dataclass
class ShufflerHandle:
    """A running shuffler. ``stop()`` is graceful and idempotent."""

    port: int
    metrics_port: int | None
    metrics: ShufflerMetrics
    store: ShufflerStore
    intake: Intake
    _stop_fn: Callable[[float | None], None]
    #: the HTTP port (Connect protocol, ``crowdmix.shuffler.connect``), if configured
    http_port: int | None = None
    _stopped: threading.Event = field(default_factory=threading.Event)

    def stop(self, grace: float | None = None) -> None:
        if not self._stopped.is_set():
            self._stop_fn(grace)
            self._stopped.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until stopped (by ``stop`` from another thread or a signal handler)."""
        return self._stopped.wait(timeout)

    def __enter__(self) -> ShufflerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class AioFront:
    """A grpc.aio server on its own event-loop thread, driven from synchronous code."""

    def __init__(
        self,
        intake: Intake,
        committer: GroupCommitter,
        metrics: ShufflerMetrics,
        *,
        options: list[tuple[str, Any]],
        max_concurrent_rpcs: int,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="shuffler-aio", daemon=True
        )
        self._thread.start()
        self._committer = committer
        self.servicer = servicer = ShufflerServicer(intake, committer, metrics)

        async def build() -> tuple[Any, Any]:
            server = grpc.aio.server(options=options, maximum_concurrent_rpcs=max_concurrent_rpcs)
            server.add_generic_rpc_handlers((servicer.handler(),))
            health_servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
            health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
            return server, health_servicer

        self._server, self._health = self._run(build())

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def add_port(self, listen: str, creds: grpc.ServerCredentials | None) -> int:
        if creds is None:
            return int(self._server.add_insecure_port(listen))
        return int(self._server.add_secure_port(listen, creds))

    def start(self) -> None:
        async def start() -> None:
            await self._server.start()
            for name in ("", SERVICE_NAME):
                await self._health.set(name, health_pb2.HealthCheckResponse.SERVING)

        self._run(start())

    def set_serving(self, serving: bool) -> None:
        """SERVING or NOT_SERVING (the store is unreachable); ignored once shutting down."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )

        async def set_all() -> None:
            for name in ("", SERVICE_NAME):
                await self._health.set(name, status)

        self._run(set_all())

    def enter_shutdown(self) -> None:
        """Health checks answer NOT_SERVING (load balancers move devices elsewhere)."""
        self._run(self._health.enter_graceful_shutdown())

    def stop(self, grace: float) -> None:
        """Refuse new commits and finish the write in progress before the server stops:
        gRPC answers calls it cancels at the end of ``grace`` UNAVAILABLE ("retry"), so
        no call may still be waiting on a write that could then succeed."""

        async def stop() -> None:
            await self._health.enter_graceful_shutdown()
            try:
                await self._committer.aclose()
            finally:  # a store that fails to close must not keep the server up
                await self._server.stop(grace)

        try:
            self._run(stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()


def _read(path: str | None) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None


def start_shuffler(
    registry: Registry,
    store: ShufflerStore | None = None,
    aggregator: str | Sender | None = None,
    *,
    listen: str = "127.0.0.1:0",
    settings: ShufflerSettings | None = None,
    tokens: frozenset[str] | None = None,
    owns_store: bool = False,
    random_bytes: RandomBytes = os.urandom,
    clock: Callable[[], float] = time.time,
) -> ShufflerHandle:
    """Start serving; returns once the port is bound and the threads run.

    ``aggregator`` is a HOST:PORT target (``settings`` gives its TLS files), a
    callable taking an ``InFlightBatch`` (tests), or None: then nothing is
    released and reports wait in the store. ``settings.listen`` is ignored in
    favour of ``listen``. ``tokens`` (or ``settings.tokens_file``) turns on
    bearer-token authentication. ``random_bytes`` exists for tests only.
    """
    settings = settings or ShufflerSettings()
    store = store if store is not None else MemoryStore()
    if tokens is None and settings.tokens_file is not None:
        tokens = load_tokens(settings.tokens_file, allow_placeholder=settings.allow_unauthenticated)
    store.ping()
    metrics = ShufflerMetrics()

    intake = Intake(
        registry,
        tokens=tokens,
        max_reports_per_request=settings.max_reports_per_request,
        rate_limit_reports=settings.rate_limit_reports,
        max_buffered_reports=settings.max_buffered_reports,
        keys=None if settings.public_keys is None else PublishedKeys(settings.public_keys),
        rounds=None if settings.rounds_file is None else RoundFile(settings.rounds_file),
        config_cache_seconds=settings.config_cache_seconds,
        window_tolerance=settings.window_tolerance,
        max_clock_skew_seconds=settings.max_clock_skew_seconds,
        clock=clock,
    )
    committer = GroupCommitter(
        store,
        registry,
        max_delay=settings.commit_delay_seconds,
        random_bytes=random_bytes,
        metrics=metrics,
        on_commit=intake.add_buffered,
    )

    sender: Sender | None
    closer: Callable[[], None] | None = None
    if isinstance(aggregator, str):
        agg = AggregatorSender(
            aggregator,
            ca=_read(settings.aggregator_ca),
            cert=_read(settings.aggregator_cert),
            key=_read(settings.aggregator_key),
            timeout=settings.forward_timeout_seconds,
        )
        sender, closer = agg, agg.close
    else:
        sender = aggregator

    options = [
        ("grpc.max_receive_message_length", settings.max_request_bytes),
        # off unless asked: a second server on a busy port must fail, not share it
        ("grpc.so_reuseport", 1 if settings.reuse_port else 0),
    ]
    front = AioFront(
        intake,
        committer,
        metrics,
        options=options,
        max_concurrent_rpcs=settings.max_concurrent_rpcs,
    )
    creds = None
    if settings.tls:
        creds = grpc.ssl_server_credentials(
            [(_read(settings.tls_key), _read(settings.tls_cert))],  # type: ignore[list-item]
            root_certificates=_read(settings.tls_client_ca),
            require_client_auth=settings.tls_client_ca is not None,
        )
    try:
        port = front.add_port(listen, creds)
    except RuntimeError as exc:
        front.stop(0)
        raise BindError(f"cannot listen on {listen}: {exc}") from None
    if not port:
        front.stop(0)
        raise BindError(f"cannot listen on {listen}")

    stop_release = threading.Event()
    releaser_thread: threading.Thread | None = None
    if sender is not None:
        releaser = Releaser(
            registry,
            store,
            sender,
            clock=clock,
            windows=intake.windows,
            random_bytes=random_bytes,
            metrics=metrics,
            on_pending=intake.set_buffered,
            parked_retry_seconds=settings.parked_retry_seconds,
            inflight_retry_seconds=settings.inflight_retry_seconds,
        )
        releaser_thread = threading.Thread(
            target=releaser.run,
            args=(stop_release,),
            kwargs={"tick": settings.tick_seconds, "grace": settings.shutdown_grace_seconds},
            name="shuffler-release",
            daemon=True,
        )
    else:
        log.warning("no aggregator configured: reports are stored but never released")

    http: Any = None
    if settings.http_port is not None:
        from crowdmix.shuffler.connect import ConnectApp, HttpPort

        app = ConnectApp(
            front.servicer,
            metrics,
            max_request_bytes=settings.max_request_bytes,
            max_concurrent_calls=settings.max_concurrent_rpcs,
            allow_origins=settings.http_allow_origins,
        )
        try:
            http = HttpPort(
                app,
                front.loop,
                listen.rpartition(":")[0],
                settings.http_port,
                certfile=settings.tls_cert,
                keyfile=settings.tls_key,
            )
        except BindError:
            front.stop(0)
            raise

    metrics_server: Any = None
    metrics_port: int | None = None
    if settings.metrics_port is not None:
        try:
            metrics_server, metrics_port = serve_metrics(
                metrics.registry, settings.metrics_port, settings.metrics_host
            )
        except OSError as exc:  # a busy port: "cannot bind", as for the gRPC port
            front.stop(0)
            if closer is not None:
                closer()
            raise BindError(
                f"cannot serve metrics on {settings.metrics_host}:{settings.metrics_port}: "
                f"{exc.strerror or exc}"
            ) from None

    front.start()
    watch = StoreWatch(store, front.set_serving)
    watch.start()
    if releaser_thread is not None:
        releaser_thread.start()
    log.info("shuffler listening on %s (port %d)", listen.rpartition(":")[0], port)

    def stop(grace: float | None) -> None:
        g = settings.shutdown_grace_seconds if grace is None else grace
        watch.stop()  # before NOT_SERVING: it must not set SERVING again
        if http is not None:  # its calls in progress await commits: drain it first
            http.stop(g)
        # First refuse new commits and let queued writes finish, then stop the server:
        # gRPC answers calls it cancels at the end of the grace period UNAVAILABLE
        # ("nothing stored, retry"), so none may still be waiting on a write.
        front.enter_shutdown()
        front.stop(g)
        stop_release.set()  # final release pass, bounded by the grace period
        if releaser_thread is not None:
            releaser_thread.join()
        if closer is not None:
            closer()
        if isinstance(store, MemoryStore):
            left = sum(sum(store.pending(m).values()) for m in registry.metrics)
            stuck = sum(len(store.inflight_ids(m)) for m in registry.metrics)
            if left or stuck:
                log.warning(
                    "in-memory store: %d pending reports and %d unacknowledged batches are "
                    "lost with this process",
                    left,
                    stuck,
                )
        if metrics_server is not None:
            stop_metrics(metrics_server)
        if owns_store:
            store.close()
        log.info("shuffler stopped")

    return ShufflerHandle(
        port=port,
        metrics_port=metrics_port,
        metrics=metrics,
        store=store,
        intake=intake,
        _stop_fn=stop,
        http_port=None if http is None else http.port,
    )
