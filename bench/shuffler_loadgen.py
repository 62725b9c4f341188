"""Load generators for the shuffler benchmarks (imported by bench/shuffler_*.py).

Two of them, both reporting acknowledged calls, reports, errors and latencies
of the measurement window (after a warm-up):

- ``run_h2load`` (the default): nghttp2's ``h2load``, a C HTTP/2 load tester,
  posting a pre-built gRPC frame. ``callers`` connections each keep one call in
  flight, as devices do. It costs ≤ 21 µs of CPU per call (~15 % of a core at
  7 k calls/s), so on this 2-core box the server under test gets the rest. h2load counts
  HTTP 200s, and a gRPC error is also a 200 (its status is in the trailers), so
  the caller checks the acknowledgements against the shuffler's own counters.
- ``run_load``: Python grpc clients in ``processes`` processes, each keeping
  ``concurrency`` calls in flight over ``connections`` channels (grpc futures;
  each completion issues the next call), pre-serialized requests through a raw
  method. It measures the same thing through the real client library, but
  spends ≤ 220 µs of CPU per call itself, on the cores the server needs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import resource
import shutil
import struct
import subprocess
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from crowdmix.core.sealed import PROTOCOL_VERSION
from crowdmix.protos import crowdmix_pb2 as pb

__all__ = ["LoadResult", "build_payload", "ensure_h2load", "run_h2load", "run_load"]


@dataclass
class LoadResult:
    calls: int
    reports: int
    errors: dict[str, int]
    seconds: float
    latencies: np.ndarray  # seconds, measurement window only
    loadgen_cpu: float = float("nan")  # CPU seconds the generators used, warm-up included

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
    """One serialised SubmitRequest, naming the current window of a day-long window."""
    rng = np.random.default_rng(seed)
    window = int(time.time() // 86400)
    if per_request == 1:
        req = pb.SubmitRequest(
            protocol=PROTOCOL_VERSION,
            reports=[
                pb.Report(
                    metric=metric,
                    cohort=int(rng.integers(cohorts)),
                    bits=rng.bytes(report_bytes),
                    params_fingerprint=fp,
                    report_id=rng.bytes(16),
                    window=window,
                )
            ],
        )
    else:
        req = pb.SubmitRequest(
            protocol=PROTOCOL_VERSION,
            columns=[
                pb.ReportColumns(
                    metric=metric,
                    params_fingerprint=fp,
                    count=per_request,
                    report_bytes=report_bytes,
                    cohorts=rng.integers(cohorts, size=per_request).tolist(),
                    bits=rng.bytes(report_bytes * per_request),
                    report_ids=rng.bytes(16 * per_request),
                    window=window,
                )
            ],
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
    calls = [ch.unary_unary("/crowdmix.v2.Shuffler/Submit") for ch in channels]
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
    cpu0 = _children_cpu()
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
        loadgen_cpu=_children_cpu() - cpu0,
    )


def _children_cpu() -> float:
    """user + system CPU of this process's finished, waited-for children."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def ensure_h2load() -> str:
    """The h2load binary; installs Debian's nghttp2-client when it is missing."""
    found = shutil.which("h2load")
    if found:
        return found
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    print("installing h2load (Debian package nghttp2-client) ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "nghttp2-client"],
    ):
        if subprocess.run([*sudo, *cmd], env=env, capture_output=True).returncode != 0:
            break
    found = shutil.which("h2load")
    if not found:
        raise SystemExit(
            "h2load not found and could not be installed: apt-get install nghttp2-client, "
            "or pass --loadgen grpc"
        )
    return found


def _h2load_one(
    h2load: str, target: str, body: Path, log: Path, callers: int, warmup: float, duration: float
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            h2load,
            "-D", f"{round(duration * 1000)}ms", "--warm-up-time", f"{round(warmup * 1000)}ms",
            "-c", str(callers), "-m", "1", "-t", "1",
            "-d", str(body),
            "-H", "content-type: application/grpc", "-H", "te: trailers",
            "--log-file", str(log),
            f"http://{target}/crowdmix.v2.Shuffler/Submit",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def run_h2load(
    targets: list[str],
    payload: bytes,
    per_request: int,
    *,
    callers: int,
    warmup: float = 1.0,
    duration: float = 10.0,
) -> LoadResult:
    """``callers`` connections with one call in flight each, split over ``targets``
    (one h2load process per target). ``errors`` counts non-200 answers and failed
    or timed-out requests; gRPC statuses are the caller's to check."""
    h2load = ensure_h2load()
    cpu0 = _children_cpu()
    frame = b"\x00" + struct.pack(">I", len(payload)) + payload  # uncompressed gRPC message
    with tempfile.TemporaryDirectory(prefix="crowdmix-h2load-") as tmp:
        body = Path(tmp) / "body"
        body.write_bytes(frame)
        runs = []
        for i, target in enumerate(targets):
            share = callers // len(targets) + (1 if i < callers % len(targets) else 0)
            log = Path(tmp) / f"log-{i}"
            runs.append((log, _h2load_one(h2load, target, body, log, share, warmup, duration)))
        calls = 0
        errors: Counter[str] = Counter()
        latencies: list[npt.NDArray[np.float64]] = []
        for log, proc in runs:
            out, _ = proc.communicate(timeout=warmup + duration + 120)
            line = next((x for x in out.splitlines() if x.startswith("requests:")), None)
            if proc.returncode != 0 or line is None:
                raise RuntimeError(f"h2load failed:\n{out}")
            # requests: N total, N started, N done, N succeeded, N failed, N errored, N timeout
            fields = {k: int(v) for v, k in (p.split()[:2] for p in line[10:].split(","))}
            for kind in ("failed", "errored", "timeout"):
                if fields[kind]:
                    errors[f"h2load_{kind}"] += fields[kind]
            rows = np.loadtxt(log, dtype=np.int64, ndmin=2) if log.stat().st_size else None
            if rows is not None:
                ok = rows[:, 1] == 200
                errors["http_not_200"] += int((~ok).sum())
                calls += int(ok.sum())
                latencies.append(rows[ok, 2] / 1e6)
    return LoadResult(
        calls=calls,
        reports=calls * per_request,
        errors={k: v for k, v in errors.items() if v},
        seconds=duration,
        latencies=np.concatenate(latencies) if latencies else np.array([]),
        loadgen_cpu=_children_cpu() - cpu0,
    )
