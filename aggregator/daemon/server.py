"""The aggregator daemon: gRPC server, health, metrics, folding, graceful stop.

    server = start_aggregator(registry, store, listen="127.0.0.1:0")
    server.port            # the bound port (read back when listening on :0)
    server.stop()          # NOT_SERVING, drain in-flight Ingest calls, stop

``crowdmix aggregator serve`` (:mod:`crowdmix.aggregator_serve`) adds signal handling.
The server is grpc's synchronous server on a thread pool (Ingest's numpy counting and
Redis script release the GIL), with the standard health service (``""`` and
``crowdmix.v2.Aggregator``), an optional Prometheus endpoint, and a thread calling
``store.maintain()`` every second. Failures raise :mod:`crowdmix.aggregator.errors`
(``BindError``, ``StoreUnavailable``), mapped to exit codes by ``crowdmix.cli.ExitCode``.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from crowdmix.aggregator.daemon.ingest import Ingestor
from crowdmix.aggregator.daemon.metrics import IngestMetrics
from crowdmix.aggregator.daemon.rounds import RoundFile
from crowdmix.aggregator.daemon.service import AggregatorServicer
from crowdmix.aggregator.errors import BindError, StoreError, StoreUnavailable
from crowdmix.aggregator.sealing.ingest import KeyFile
from crowdmix.aggregator.store.base import CountStore
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.core.log_limit import RepeatedFailure
from crowdmix.core.metrics import serve_metrics, stop_metrics
from crowdmix.core.registry import MAX_BATCH_BYTES, Registry

__all__ = [
    "SERVICE_NAME",
    "AggregatorServer",
    "TlsFiles",
    "start_aggregator",
]

SERVICE_NAME = "crowdmix.v2.Aggregator"
log = logging.getLogger("crowdmix.aggregator")


@dataclass(frozen=True, slots=True, kw_only=True)
class TlsFiles:
    """Server certificate and key (PEM bytes); with ``client_ca`` clients must present a
    certificate signed by it (mTLS between shuffler and aggregator)."""

    cert: bytes
    key: bytes
    client_ca: bytes | None = None

    def credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


class AggregatorServer:
    """One aggregator: Ingest + health on a gRPC server, metrics, and the fold thread."""

    def __init__(
        self,
        registry: Registry,
        store: CountStore | None = None,
        *,
        listen: str = "127.0.0.1:0",
        tls: TlsFiles | None = None,
        workers: int = 8,
        metrics_port: int | None = None,
        metrics_host: str = "127.0.0.1",
        maintain_interval: float = 1.0,
        keys_file: str | None = None,
        open_workers: int = 0,
        rounds_file: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if workers < 1:
            raise ValueError(f"workers must be positive, got {workers}")
        if maintain_interval <= 0:
            raise ValueError(f"maintain_interval must be positive, got {maintain_interval}")
        self.registry = registry
        self.store: CountStore = store if store is not None else MemoryCountStore()
        self.metrics = IngestMetrics()
        store_ = self.store  # the Redis store counts these; the memory store has none
        self.metrics.apply_retries.set_function(lambda: getattr(store_, "apply_retries", 0))
        self.metrics.index_rebuilds.set_function(lambda: getattr(store_, "index_rebuilds", 0))
        # the private key set opens sealed batches (re-read when the file changes);
        # ``open_workers`` > 0: a process pool of that many openers
        self.keys = None if keys_file is None else KeyFile(keys_file, workers=open_workers)
        # ``clock``: the one windows are judged by (tests and demos move it)
        # the heavy-hitter round file (crowdmix discover writes it): each window's round
        rounds = None if rounds_file is None else RoundFile(rounds_file)
        self.ingestor = Ingestor(registry, self.store, keys=self.keys, rounds=rounds, clock=clock)
        self._listen = listen
        self._tls = tls
        self._metrics_port = metrics_port
        self._metrics_host = metrics_host
        self._maintain_interval = maintain_interval
        # retention of batch ids and report ids: cheap, but needs a key scan on Redis
        self._retention_interval = 60.0
        self._last_retention = -math.inf
        self._stopping = threading.Event()
        # a store outage fails every fold pass: logged once, once a minute, and at its end
        self._store_down = RepeatedFailure(log, "store unreachable (health NOT_SERVING)")
        self._fold_failures = RepeatedFailure(log, "folding counts (will retry)")
        self._maintainer: threading.Thread | None = None
        self._http: Any = None
        self.port = 0
        self.metrics_port: int | None = None
        self._server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="ingest"),
            options=[
                ("grpc.max_receive_message_length", MAX_BATCH_BYTES + (1 << 20)),
                ("grpc.so_reuseport", 0),
            ],
        )
        self._server.add_generic_rpc_handlers(
            (AggregatorServicer(self.ingestor, self.metrics).handler(),)
        )
        self._health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)

    @property
    def target(self) -> str:
        host = self._listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    def start(self) -> AggregatorServer:
        try:
            if self._tls is not None:
                port = self._server.add_secure_port(self._listen, self._tls.credentials())
            else:
                port = self._server.add_insecure_port(self._listen)
        except RuntimeError as exc:  # grpc raises RuntimeError on a failed bind
            raise BindError(f"cannot listen on {self._listen}: {exc}") from None
        if port == 0:
            raise BindError(f"cannot listen on {self._listen}")
        self.port = port
        self._server.start()
        if self._metrics_port is not None:
            try:
                self._http, self.metrics_port = serve_metrics(
                    self.metrics.registry, self._metrics_port, self._metrics_host
                )
            except OSError as exc:
                self._server.stop(None)
                raise BindError(
                    f"cannot serve metrics on port {self._metrics_port}: {exc}"
                ) from None
        for name in ("", SERVICE_NAME):
            self._health.set(name, health_pb2.HealthCheckResponse.SERVING)
        self.metrics.up.set(1)
        self._maintainer = threading.Thread(target=self._maintain_loop, name="fold", daemon=True)
        self._maintainer.start()
        log.info("aggregator listening on %s", self.target)
        return self

    def _maintain_loop(self) -> None:
        while not self._stopping.wait(self._maintain_interval):
            self._maintain_once()

    def _set_serving(self, serving: bool) -> None:
        """SERVING or NOT_SERVING (the store is unreachable); ignored once stopping."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            self._health.set(name, status)

    def _maintain_once(self) -> None:
        """Fold (Redis), and follow the store's health: it reaches the store every pass,
        so a store that cannot be reached makes the health service answer NOT_SERVING
        (an aggregator that can apply nothing) until a pass reaches it again."""
        try:
            n = self.store.maintain()
        except StoreUnavailable as exc:
            if not self._store_down.failing:
                self._set_serving(False)
                self.metrics.up.set(0)
            self._store_down.failed(exc)
            return
        except StoreError as exc:  # reachable, but a fold failed: it is retried
            self._fold_failures.failed(exc)
            return
        self._fold_failures.succeeded()
        if self._store_down.failing:
            self._store_down.succeeded()
            if not self._stopping.is_set():
                self._set_serving(True)
                self.metrics.up.set(1)
        if n:
            self.metrics.folded.inc(n)
        now = time.monotonic()
        if now - self._last_retention >= self._retention_interval:
            self._last_retention = now
            try:
                deleted = self.ingestor.dispose_ids()
            except StoreError as exc:
                log.warning("deleting ids of disposed windows failed (will retry): %s", exc)
                return
            if deleted:
                self.metrics.disposed_ids.inc(deleted)
                log.info("deleted %d batch and report ids of windows past retention", deleted)

    def stop(self, grace: float | None = 10.0) -> None:
        """Stop taking batches, let in-flight Ingest calls finish (up to ``grace`` s), fold."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._health.enter_graceful_shutdown()
        self.metrics.up.set(0)
        self._server.stop(grace).wait()
        if self._maintainer is not None:
            self._maintainer.join()
        self._maintain_once()  # leave folded counts behind (a restart would fold them anyway)
        if self.keys is not None:
            self.keys.close()
        if self._http is not None:
            stop_metrics(self._http)
        log.info("aggregator stopped")

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the server has stopped (True) or ``timeout`` passed (False)."""
        return bool(self._server.wait_for_termination(timeout))

    def __enter__(self) -> AggregatorServer:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


def start_aggregator(
    registry: Registry, store: CountStore | None = None, **kwargs: Any
) -> AggregatorServer:
    """Build and start an aggregator in this process (keyword args as AggregatorServer)."""
    return AggregatorServer(registry, store, **kwargs).start()
