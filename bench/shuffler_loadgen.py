"""Load generator for the shuffler benchmarks (imported by bench/shuffler_*.py).

Each generator process keeps ``concurrency`` calls in flight on one channel
(grpc futures; each completion issues the next call), sends pre-serialized
requests through a raw method (no per-call protobuf work in the generator),
and reports acknowledged calls, reports, errors and latencies of the
measurement window (after a warm-up).
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from protos import crowdmix_pb2 as pb

__all__ = ["LoadResult", "build_payload", "run_load"]


@dataclass
class LoadResult:
    calls: int
    reports: int
    errors: dict[str, int]
    seconds: float
    latencies: np.ndarray  # seconds, measurement window only

    @property
    def calls_per_s(self) -> float:
        return self.calls / self.seconds

    @property
    def reports_per_s(self) -> float:
        return self.reports / self.seconds

    def pct(self, q: float) -> float:
        return (
            float(np.percentile(self.latencies, q) * 1000) if len(self.latencies) else float("nan")
        )


def build_payload(
    metric: str, fp: int, report_bytes: int, cohorts: int, per_request: int, seed: int
) -> bytes:
    rng = np.random.default_rng(seed)
    if per_request == 1:
        req = pb.SubmitRequest(
            reports=[
                pb.Report(
                    metric=metric,
                    cohort=int(rng.integers(cohorts)),
                    bits=rng.bytes(report_bytes),
                    params_fingerprint=fp,
                )
            ]
        )
    else:
        req = pb.SubmitRequest(
            columns=[
                pb.ReportColumns(
                    metric=metric,
                    params_fingerprint=fp,
                    count=per_request,
                    report_bytes=report_bytes,
                    cohorts=rng.integers(cohorts, size=per_request).tolist(),
                    bits=rng.bytes(report_bytes * per_request),
                )
            ]
        )
    return req.SerializeToString()


def _worker(
    target: str,
    payload: bytes,
    per_request: int,
    concurrency: int,
    start_at: float,
    warmup: float,
    duration: float,
    token: str | None,
    connections: int,
    out: Any,
) -> None:
    import grpc

    # each channel its own TCP connection (devices each have their own; and with
    # --processes the kernel spreads connections, not calls, over the processes)
    channels = [
        grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])
        for _ in range(connections)
    ]
    calls = [ch.unary_unary("/crowdmix.v1.Shuffler/Submit") for ch in channels]
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    lock = threading.Lock()
    lat: list[float] = []
    errors: Counter[str] = Counter()
    ok = [0]
    t_meas, t_end = start_at + warmup, start_at + warmup + duration
    done = threading.Event()
    live = [concurrency]

    def fire(i: int) -> None:
        t0 = time.perf_counter()
        fut = calls[i % connections].future(payload, timeout=10, metadata=metadata)
        wall = time.time()
        fut.add_done_callback(lambda f: finished(f, t0, wall, i))

    def finished(f: Any, t0: float, wall: float, i: int) -> None:
        dt = time.perf_counter() - t0
        now = time.time()
        code = f.code()
        with lock:
            if t_meas <= wall and now <= t_end:
                if code == grpc.StatusCode.OK:
                    ok[0] += 1
                    lat.append(dt)
                else:
                    errors[code.name] += 1
            if now < t_end:
                again = True
            else:
                again = False
                live[0] -= 1
                if live[0] == 0:
                    done.set()
        if again:
            if code != grpc.StatusCode.OK:
                time.sleep(0.01)
            fire(i)

    while time.time() < start_at:
        time.sleep(0.005)
    for i in range(concurrency):
        fire(i)
    done.wait(warmup + duration + 30)
    for ch in channels:
        ch.close()
    out.put((ok[0], ok[0] * per_request, dict(errors), np.array(lat)))


def run_load(
    targets: list[str],
    payload: bytes,
    per_request: int,
    *,
    processes: int,
    concurrency: int,
    warmup: float = 1.0,
    duration: float = 10.0,
    token: str | None = None,
    connections: int = 1,
) -> LoadResult:
    """``processes`` generators, ``concurrency`` calls in flight each, spread over targets."""
    # spawn, not fork: a forked child of a process that used grpc can hang
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 4.0  # time for the spawned generators to import grpc
    procs = [
        ctx.Process(
            target=_worker,
            args=(
                targets[i % len(targets)],
                payload,
                per_request,
                concurrency,
                start_at,
                warmup,
                duration,
                token,
                connections,
                out,
            ),
            daemon=True,
        )
        for i in range(processes)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=warmup + duration + 90) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r[2])
    return LoadResult(
        calls=sum(r[0] for r in results),
        reports=sum(r[1] for r in results),
        errors=dict(errors),
        seconds=duration,
        latencies=np.concatenate([r[3] for r in results]) if results else np.array([]),
    )
