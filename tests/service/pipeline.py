"""A real pipeline for the fault tests and the end-to-end benchmark.

Processes: the test's own redis-server (AOF everysec), ``crowdmix shuffler
serve`` and ``crowdmix aggregator serve`` sharing it (their keys do not
overlap), all on 127.0.0.1. A :class:`Load` of columnar 1000-report
``Submit`` requests is generated with numpy up front and remembers which
requests the shuffler acknowledged, so the expected counts are a direct count
of exactly those reports. :class:`Senders` send as devices do, each request
until it is acknowledged, each sender in a cohort of its own.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.aggregator.errors import StoreUnavailable
from crowdmix.aggregator.store.base import StoredCounts
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.client.transport import RETRYABLE
from crowdmix.cluster import DaemonProcess, free_port
from crowdmix.core.registry import MetricConfig, Registry, load_registry
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from tests.shuffler.helpers import current_window, submit_request

METRIC = "e2e"
K, M = 64, 32  # 8-byte reports: lean for a million of them, still many cohorts and bits


def metric_toml(name: str, *, min_batch: int, max_batch: int, m: int = M) -> str:
    """The registry table of a RAPPOR metric of K bits and ``m`` cohorts, released
    within 0.1 s of ``min_batch`` reports."""
    return f"""
[metrics.{name}]
encoding = "rappor"
k = {K}
h = 2
m = {m}
f = 0.5
p = 0.5
q = 0.75

[metrics.{name}.shuffle]
min_batch = {min_batch}
max_batch = {max_batch}
max_delay_seconds = 0.1
"""


@dataclass
class Load:
    """``requests`` columnar requests of ``per_request`` reports, and what became of each."""

    requests: int
    per_request: int = 1000
    seed: int = 0
    cohorts: npt.NDArray[np.uint32] = field(init=False)
    bits: npt.NDArray[np.uint8] = field(init=False)
    # per request: "" not sent yet, "OK", or the status code name of the failure
    outcome: list[str] = field(init=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        n = self.requests * self.per_request
        self.cohorts = rng.integers(0, M, size=n, dtype=np.uint32)
        self.bits = rng.integers(0, 256, size=(n, K // 8), dtype=np.uint8)
        self.outcome = [""] * self.requests
        self.ids = rng.integers(0, 256, size=(n, 16), dtype=np.uint8)  # kept through resends
        self.window = current_window()  # every request names it, first send and resends
        self._lock = threading.Lock()

    def request(self, i: int, config: MetricConfig) -> pb.SubmitRequest:
        s = slice(i * self.per_request, (i + 1) * self.per_request)
        return submit_request(
            window=self.window,
            columns=[
                pb.ReportColumns(
                    metric=METRIC,
                    params_fingerprint=config.fingerprint,
                    count=self.per_request,
                    report_bytes=K // 8,
                    cohorts=self.cohorts[s].tolist(),
                    bits=self.bits[s].tobytes(),
                    report_ids=self.ids[s].tobytes(),
                )
            ],
        )

    def send(
        self,
        target: str,
        config: MetricConfig,
        indices: range,
        *,
        threads: int = 4,
        on_ack: Callable[[int], None] | None = None,
        pause_on_failure: float = 0.0,
    ) -> None:
        """Send requests ``indices`` from ``threads`` threads; record each outcome, no retries."""
        todo = iter(indices)
        lock = threading.Lock()

        def worker() -> None:
            with grpc.insecure_channel(target) as channel:
                stub = crowdmix_pb2_grpc.ShufflerStub(channel)
                while True:
                    with lock:
                        i = next(todo, None)
                    if i is None:
                        return
                    try:
                        stub.Submit(self.request(i, config), timeout=20)
                        code = "OK"
                    except grpc.RpcError as exc:
                        code = exc.code().name
                    with self._lock:
                        self.outcome[i] = code
                        acked = self.outcome.count("OK") if on_ack is not None else 0
                    if code == "OK" and on_ack is not None:
                        on_ack(acked)
                    elif code != "OK" and pause_on_failure:
                        time.sleep(pause_on_failure)

        pool = [threading.Thread(target=worker) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()

    def indices(self, code: str) -> list[int]:
        return [i for i, c in enumerate(self.outcome) if c == code]

    def failed(self) -> list[int]:
        return [i for i, c in enumerate(self.outcome) if c not in ("", "OK")]

    def counts_of(self, requests: list[int]) -> StoredCounts:
        counts = CohortCounts.create(M, K)
        for i in requests:
            s = slice(i * self.per_request, (i + 1) * self.per_request)
            counts.add(self.cohorts[s], self.bits[s])
        return StoredCounts.of(counts)


class Senders:
    """``senders`` devices, each in cohort = its index, each with ``requests`` requests
    of ``per_request`` reports of every metric of ``fingerprints`` (metric → params
    fingerprint); every report has a fixed random report id. Per-cohort totals of a
    registry with ``m`` cohorts are then per-sender counts."""

    def __init__(
        self,
        fingerprints: dict[str, int],
        senders: int,
        requests: int,
        per_request: int,
        *,
        seed: int,
        m: int = M,
        token: str | None = None,
    ) -> None:
        assert senders <= m
        rng = np.random.default_rng(seed)
        self.fingerprints, self.metrics = fingerprints, list(fingerprints)
        self.senders, self.requests, self.per_request, self.m = senders, requests, per_request, m
        shape = (len(self.metrics), senders, requests, per_request)
        self.bits = rng.integers(0, 256, size=(*shape, K // 8), dtype=np.uint8)
        self.ids = rng.integers(0, 256, size=(*shape, 16), dtype=np.uint8)
        self.acked = np.zeros((senders, requests), dtype=bool)
        self.attempts = np.zeros((senders, requests), dtype=np.int64)
        self.codes: list[str] = []
        self.window = current_window()  # every request names it, first send and retries
        self.metadata = None if token is None else (("authorization", f"Bearer {token}"),)

    def request(self, s: int, r: int) -> pb.SubmitRequest:
        return submit_request(
            window=self.window,
            columns=[
                pb.ReportColumns(
                    metric=name,
                    params_fingerprint=self.fingerprints[name],
                    count=self.per_request,
                    report_bytes=K // 8,
                    cohorts=[s] * self.per_request,
                    bits=self.bits[j, s, r].tobytes(),
                    report_ids=self.ids[j, s, r].tobytes(),
                )
                for j, name in enumerate(self.metrics)
            ],
        )

    def send(
        self,
        targets: str | list[str],
        requests: range,
        *,
        deadline: float,
        timeout: float = 5,
        pace: float = 0.0,
    ) -> None:
        """Each sender (a thread; sender s to ``targets[s % len(targets)]``) sends
        ``requests`` in order, each until acknowledged (transient failures retried with
        the same ids) or ``deadline`` passes, and waits ``pace`` seconds after each
        acknowledgement."""
        to = [targets] if isinstance(targets, str) else targets

        def sender(s: int) -> None:
            with grpc.insecure_channel(to[s % len(to)]) as channel:
                stub = crowdmix_pb2_grpc.ShufflerStub(channel)
                for r in requests:
                    while not self.acked[s, r] and time.monotonic() < deadline:
                        self.attempts[s, r] += 1
                        try:
                            stub.Submit(self.request(s, r), timeout=timeout, metadata=self.metadata)
                            self.acked[s, r] = True
                            if pace:
                                time.sleep(pace)
                        except grpc.RpcError as exc:
                            self.codes.append(exc.code().name)
                            assert exc.code() in RETRYABLE, exc
                            time.sleep(0.05)

        threads = [threading.Thread(target=sender, args=(s,)) for s in range(self.senders)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    def expected(self, metric: int = 0) -> StoredCounts:
        """Each sender's acknowledged reports of the ``metric``-th metric, counted once."""
        counts = CohortCounts.create(self.m, K)
        for s in range(self.senders):
            bits = self.bits[metric, s][self.acked[s]].reshape(-1, K // 8)
            counts.add(np.full(bits.shape[0], s, dtype=np.uint32), bits)
        return StoredCounts.of(counts)


class Pipeline:
    """redis (given) + one aggregator process + one shuffler process on loopback."""

    def __init__(
        self,
        workdir: Path,
        redis_url: str,
        *,
        max_batch: int = 20_000,
        min_batch: int = 1000,
        shuffler_args: tuple[str, ...] = (),
        aggregator_args: tuple[str, ...] = (),
        shuffler_redis_url: str | None = None,
        extra_toml: str = "",
    ) -> None:
        self.workdir = workdir
        self.redis_url = redis_url
        self.shuffler_redis_url = shuffler_redis_url or redis_url
        self.config_path = workdir / "metrics.toml"
        self.config_path.write_text(
            metric_toml(METRIC, min_batch=min_batch, max_batch=max_batch) + extra_toml
        )
        self.registry: Registry = load_registry(self.config_path)
        self.config = self.registry[METRIC]
        self.aggregator_port = free_port()
        self.shuffler_port = free_port()
        self._shuffler_args = shuffler_args
        self._aggregator_args = aggregator_args
        self._n = itertools.count()
        self.aggregator: DaemonProcess | None = None
        self.shuffler: DaemonProcess | None = None
        self.store = RedisCountStore.from_url(redis_url)

    def _daemon(
        self, name: str, port: int, args: list[str], redis_url: str | None = None
    ) -> DaemonProcess:
        d = DaemonProcess(
            name,
            [
                *args,
                "--config",
                str(self.config_path),
                "--redis",
                redis_url or self.redis_url,
                "--listen",
                f"127.0.0.1:{port}",
            ],
            port,
            self.workdir / f"{name}-{next(self._n)}.log",
        )
        d.start()
        if "--tls-client-ca" in args:  # health needs a client certificate: wait for the port
            _wait_listening(d, 60)
        else:
            d.wait_healthy(60)
        return d

    def start_aggregator(self) -> DaemonProcess:
        self.aggregator = self._daemon(
            "aggregator", self.aggregator_port, ["aggregator", "serve", *self._aggregator_args]
        )
        return self.aggregator

    def start_shuffler(self) -> DaemonProcess:
        args = [
            "shuffler",
            "serve",
            "--allow-unauthenticated",  # these tests are about delivery, not auth
            "--aggregator",
            f"127.0.0.1:{self.aggregator_port}",
        ]
        self.shuffler = self._daemon(
            "shuffler",
            self.shuffler_port,
            [*args, *self._shuffler_args],
            redis_url=self.shuffler_redis_url,
        )
        return self.shuffler

    @property
    def shuffler_target(self) -> str:
        return f"127.0.0.1:{self.shuffler_port}"

    def counts(self) -> StoredCounts | None:
        try:
            return self.store.load(METRIC)
        except StoreUnavailable:
            return None

    def counted(self) -> int:
        c = self.counts()
        return 0 if c is None else c.num_reports

    def wait_counted(self, at_least: int, *, settle: float = 1.0, timeout: float = 60.0) -> int:
        """Wait until at least ``at_least`` reports are counted and the count stops moving."""
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            n = self.counted()
            if n != last:
                last, since = n, time.monotonic()
            elif n >= at_least and time.monotonic() - since >= settle:
                return n
            time.sleep(0.05)
        return last

    def stop(self) -> dict[str, int | None]:
        codes = {}
        for d in (self.shuffler, self.aggregator):
            if d is not None:
                codes[d.name] = d.stop(grace=20)
        self.store.close()
        return codes

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self.workdir.glob("*.log"))
        )


def _wait_listening(d: DaemonProcess, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not d.alive():
            raise RuntimeError(f"{d.name} exited:\n{d.tail_log()}")
        try:
            socket.create_connection(("127.0.0.1", d.port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{d.name} not listening after {timeout}s:\n{d.tail_log()}")


def explain(expected: StoredCounts, got: StoredCounts | None) -> str:
    if got is None:
        return "nothing counted"
    dt = got.totals - expected.totals
    do = got.ones - expected.ones
    return (
        f"counted {got.num_reports}, expected {expected.num_reports}; "
        f"{int(np.count_nonzero(dt))} cohort totals and {int(np.count_nonzero(do))} bit counts "
        f"differ (first cohort diffs {dt[np.flatnonzero(dt)[:5]].tolist()})"
    )


def matching_subset(
    load: Load, base: StoredCounts, candidates: list[int], got: StoredCounts
) -> list[int] | None:
    """The subset S of ``candidates`` (unacknowledged requests) with base + counts(S) == got.

    A request whose acknowledgement was lost in a crash may or may not have been
    stored; each may therefore count 0 or 1 times, never twice or in part. The
    requests' count vectors (m·(k+1) = 2080 numbers of 1000 random reports) are
    linearly independent, so the coefficients are unique: solve by least squares,
    demand exact 0/1 values and check the sum exactly in integers.
    """
    diff = np.concatenate([got.totals - base.totals, (got.ones - base.ones).ravel()])
    if not candidates:
        return [] if not diff.any() else None
    vectors = []
    for i in candidates:
        c = load.counts_of([i])
        vectors.append(np.concatenate([c.totals, c.ones.ravel()]))
    v = np.stack(vectors, axis=1)  # (features, candidates)
    if np.linalg.matrix_rank(v.astype(np.float64)) < len(candidates):
        raise ValueError("request count vectors are not independent: the subset is ambiguous")
    x = np.linalg.lstsq(v.astype(np.float64), diff.astype(np.float64), rcond=None)[0]
    xr = np.rint(x).astype(np.int64)
    if np.any((xr != 0) & (xr != 1)) or not np.array_equal(v @ xr, diff):
        return None
    return [candidates[j] for j in np.flatnonzero(xr)]
