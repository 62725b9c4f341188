"""A/B: the hot-path Redis client, hand-written RESP (shuffler/resp.py) against
redis.asyncio with hiredis, on the unary and bulk benchmarks, interleaved in one run.

    .venv/bin/python bench/shuffler_redis_ab.py --reps 5 --duration 8

Each repetition runs, in alternating order, one fresh cluster per client (the same
cluster as bench/shuffler_load.py: private Redis with AOF everysec, one
``crowdmix shuffler serve``, a sink aggregator, h2load, acknowledgements checked
against the shuffler's counters), then the two ceilings in the same run: a bare
grpc.aio server that only parses and answers (bench/shuffler_grpc_modes.py), and
each client alone against bare Redis (append flushes of 6 one-report writes, the
unary benchmark's typical group commit, back to back on one event loop).
The client is chosen by the environment variable CROWDMIX_AB_REDIS_CLIENT
(``resp`` or ``redis-asyncio``), read by ``RedisStore.async_appender``.

Prints every run, then per figure the median and range of each client and of the
paired per-repetition ratio; a ratio range that spans 1.0 is within noise.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

CLIENTS = ("resp", "redis-asyncio")
ENV = "CROWDMIX_AB_REDIS_CLIENT"


def uptime() -> str:
    return os.popen("uptime").read().strip()


def shuffler_run(client: str, args: argparse.Namespace) -> dict[str, float]:
    from shuffler_load import METRIC, Cluster, fingerprint, load
    from shuffler_loadgen import build_payload

    os.environ[ENV] = client
    fp, rb = fingerprint()
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="crowdmix-ab-") as tmp:
        cluster = Cluster(1, "redis", Path(tmp), [], "everysec")
        try:
            ns = argparse.Namespace(loadgen="h2load", extra="", duration=args.duration)
            r, _ = load(cluster, ns, build_payload(METRIC, fp, rb, 64, 1, seed=1), 1, 64)
            assert not r.errors, r.errors
            out["unary calls/s"], out["unary p99 ms"] = r.calls_per_s, r.pct(99)
            c0 = cluster.cpu()
            r, _ = load(cluster, ns, build_payload(METRIC, fp, rb, 64, 1000, seed=2), 1000, 8)
            c1 = cluster.cpu()
            assert not r.errors, r.errors
            out["bulk reports/s"], out["bulk p99 ms"] = r.reports_per_s, r.pct(99)
            out["bulk shuffler CPU us/report"] = (c1[0] - c0[0]) / max(r.reports, 1) * 1e6
            if cluster.redis is not None:
                out["bare redis flushes/s"], out["bare redis client CPU us/flush"] = bare_redis(
                    client, cluster.redis.url
                )
        finally:
            cluster.close()
    return out


def bare_redis(client: str, url: str, flushes: int = 5000) -> tuple[float, float]:
    """The client alone against bare Redis: append flushes back to back."""
    os.environ[ENV] = client
    import numpy as np

    from shuffler.columns import Chunk
    from shuffler.redis_store import RedisStore
    from shuffler.store import PendingWrite, QueueKey

    store = RedisStore(url)
    appender = store.async_appender()
    assert appender is not None
    chunk = Chunk(16, np.zeros(1, np.uint32), bytes(16))
    key = QueueKey(window=1, fingerprint=1)
    writes = [PendingWrite.of("ab", key, chunk) for _ in range(6)]

    async def go() -> tuple[float, float]:
        await appender.append(writes)  # connect, load the script
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(flushes):
            await appender.append(writes)
        t1, c1 = time.perf_counter(), time.process_time()
        await appender.aclose()
        return flushes / (t1 - t0), (c1 - c0) / flushes * 1e6

    try:
        return asyncio.run(go())
    finally:
        store.close()


def ceiling(args: argparse.Namespace) -> dict[str, float]:
    from shuffler_loadgen import build_payload, run_h2load

    here = Path(__file__).resolve().parent
    with tempfile.TemporaryDirectory() as tmp:
        pf = Path(tmp) / "port"
        proc = subprocess.Popen(
            [
                sys.executable,
                str(here / "shuffler_grpc_modes.py"),
                "--serve",
                "aio",
                "--port-file",
                str(pf),
            ]
        )
        try:
            while not pf.exists() or not pf.read_text():
                time.sleep(0.05)
            target = [f"127.0.0.1:{pf.read_text()}"]
            u = run_h2load(target, build_payload("m", 1, 16, 64, 1, seed=1), 1, callers=64,
                           duration=args.duration)  # fmt: skip
            b = run_h2load(target, build_payload("m", 1, 16, 64, 1000, seed=2), 1000, callers=8,
                           duration=args.duration)  # fmt: skip
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    return {"unary calls/s": u.calls_per_s, "bulk reports/s": b.reports_per_s}


def spread(xs: list[float]) -> str:
    return f"median {statistics.median(xs):,.1f} (range {min(xs):,.1f}–{max(xs):,.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--duration", type=float, default=8.0)
    args = ap.parse_args()
    print(f"start: {uptime()}; cpus {os.cpu_count()}")
    results: dict[str, list[dict[str, float]]] = {c: [] for c in (*CLIENTS, "ceiling")}
    for rep in range(args.reps):
        order = CLIENTS if rep % 2 == 0 else CLIENTS[::-1]
        for client in order:
            up = uptime()
            r = shuffler_run(client, args)
            results[client].append(r)
            print(
                f"rep {rep} {client:13s} [{up}] " + ", ".join(f"{k} {v:,.1f}" for k, v in r.items())
            )
            sys.stdout.flush()
        up = uptime()
        c = ceiling(args)
        results["ceiling"].append(c)
        print(
            f"rep {rep} {'bare grpc.aio':13s} [{up}] "
            + ", ".join(f"{k} {v:,.1f}" for k, v in c.items())
        )
        sys.stdout.flush()
    print(f"end: {uptime()}")
    for figure in results[CLIENTS[0]][0]:
        print(f"\n{figure}:")
        for client in CLIENTS:
            print(f"  {client:13s} {spread([r[figure] for r in results[client]])}")
        if figure in results["ceiling"][0]:
            print(f"  {'bare grpc.aio':13s} {spread([r[figure] for r in results['ceiling']])}")
        ratios = [
            b[figure] / a[figure] for a, b in zip(*(results[c] for c in CLIENTS), strict=True)
        ]
        verdict = "within noise" if min(ratios) <= 1.0 <= max(ratios) else "outside noise"
        print(
            f"  ratio redis-asyncio/resp per rep: {', '.join(f'{x:.3f}' for x in ratios)}; "
            f"median {statistics.median(ratios):.3f}: {verdict}"
        )


if __name__ == "__main__":
    main()
