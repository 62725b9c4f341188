"""The shuffler's store on one redis-server against a 3-master Redis Cluster.

    .venv/bin/python bench/redis_cluster.py [--seconds 4] [--writers 2] [--metrics 1,6]

In one run, on loopback: a redis-server (AOF everysec) and a Redis Cluster of 3 masters
and 3 replicas (AOF everysec), both started here. Measured, in this order, each
``--seconds`` long:

1. ceiling: ``redis-benchmark`` SET with 16-command pipelines, 2 clients, on the single
   node and (``--cluster``) on the cluster: what Redis itself does on this box;
2. bulk appends, the shuffler's hot path: ``--writers`` processes, each an event loop
   with the store's event-loop appender (``RedisStore.async_appender``, what the group
   committer calls) and 8 flushes in flight, each flush 1000 reports (16 bytes + a
   16-byte id) for each of ``--metrics`` metrics: on the single node; on the cluster;
   on the cluster with ``min_replicas_ack=1`` (WAIT after every flush, on the flush's
   own connection). With 6 metrics a flush is 6 scripts over the 3 masters; with one
   metric every write goes to one master (one hot metric, one hot node).

3. WAIT's latency: one 6-metric flush at a time on the cluster, ``--flushes`` of them,
   WAIT 0 and WAIT 1 interleaved twice: median and p99 seconds per flush.

Printed: reports/s acknowledged (each round, then the median of ``--repeats``
interleaved rounds); each median as a ratio to the single node's rate, beside the
same ratio of the ceilings (cluster SET rate / single-node SET rate).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crowdmix.cluster import RedisClusterServers, RedisServer
from crowdmix.shuffler.columns import Chunk
from crowdmix.shuffler.redis_store import RedisStore
from crowdmix.shuffler.store import PendingWrite, QueueKey

PER_METRIC = 1000
IN_FLIGHT = 8


def _writes(metrics: int) -> list[PendingWrite]:
    import numpy as np

    rng = np.random.default_rng(0)
    chunk = Chunk(
        16,
        rng.integers(0, 64, PER_METRIC, dtype=np.uint32),
        rng.integers(0, 256, PER_METRIC * 16, dtype=np.uint8).tobytes(),
        rng.integers(1, 256, PER_METRIC * 16, dtype=np.uint8).tobytes(),
    )
    key = QueueKey(window=1, fingerprint=7)
    return [PendingWrite.of(f"bench{i}", key, chunk) for i in range(metrics)]


def _writer(url: str, wait: int, metrics: int, seconds: float, out: mp.Queue, go: mp.Event) -> None:
    store = RedisStore(url, min_replicas_ack=wait)
    writes = _writes(metrics)

    async def run() -> int:
        appenders = [store.async_appender() for _ in range(IN_FLIGHT)]
        await asyncio.gather(*(a.append(writes) for a in appenders))  # connect, load scripts
        out.put("ready")
        while not go.is_set():
            await asyncio.sleep(0.001)
        end = time.monotonic() + seconds
        done = 0

        async def loop(a: object) -> None:
            nonlocal done
            while time.monotonic() < end:
                await a.append(writes)  # type: ignore[attr-defined]
                done += 1

        await asyncio.gather(*(loop(a) for a in appenders))
        for a in appenders:
            await a.aclose()
        return done * metrics * PER_METRIC

    out.put(asyncio.run(run()))
    store.close()


def bulk(url: str, wait: int, metrics: int, writers: int, seconds: float) -> float:
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    go = ctx.Event()
    procs = [
        ctx.Process(target=_writer, args=(url, wait, metrics, seconds, out, go))
        for _ in range(writers)
    ]
    for p in procs:
        p.start()
    for _ in procs:
        assert out.get(timeout=60) == "ready"
    t0 = time.monotonic()
    go.set()
    total = sum(out.get(timeout=seconds + 60) for _ in procs)
    elapsed = time.monotonic() - t0
    for p in procs:
        p.join()
    return total / elapsed


def latency(url: str, wait: int, metrics: int, n: int) -> list[float]:
    """Seconds per flush with one flush in flight (sorted), ``n`` flushes."""
    store = RedisStore(url, min_replicas_ack=wait)
    writes = _writes(metrics)

    async def run() -> list[float]:
        appender = store.async_appender()
        await appender.append(writes)
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await appender.append(writes)
            out.append(time.perf_counter() - t)
        await appender.aclose()
        return sorted(out)

    try:
        return asyncio.run(run())
    finally:
        store.close()


def flush(ports: list[int]) -> None:
    import redis

    for port in ports:
        client = redis.Redis(port=port)
        client.flushall()
        client.close()


def ceiling(port: int, cluster: bool, seconds: float) -> float:
    exe = shutil.which("redis-benchmark")
    if exe is None:
        return float("nan")
    n = int(150_000 * seconds)
    cmd = [exe, "-p", str(port), "-t", "set", "-P", "16", "-c", "2", "-n", str(n), "-q"]
    cmd += ["-r", "100000"] + (["--cluster"] if cluster else [])
    text = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds * 10).stdout
    rates = [float(r) for r in re.findall(r"([\d.]+) requests per second", text)]
    return rates[-1] if rates else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--writers", type=int, default=2)
    ap.add_argument("--metrics", default="1,6", help="metrics per flush, comma separated")
    ap.add_argument("--repeats", type=int, default=2, help="interleaved rounds")
    ap.add_argument("--flushes", type=int, default=300, help="flushes per latency run")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="crowdmix-rcluster-"))
    single = RedisServer(appendonly=True, directory=str(work / "single"))
    cluster = RedisClusterServers(work / "cluster")
    print(f"cores {os.cpu_count()}, load average at start {os.getloadavg()[0]:.2f}")
    try:
        single.start()
        cluster.start()
        node = cluster.master_ports()[0]
        c1 = ceiling(single.port, False, args.seconds)
        c3 = ceiling(node, True, args.seconds)
        print(f"ceiling, redis-benchmark SET -P 16: single {c1:,.0f}/s, cluster {c3:,.0f}/s")
        for metrics in (int(m) for m in args.metrics.split(",")):
            runs = [
                ("single node", single.url, 0, c1),
                ("cluster", cluster.url, 0, c3),
                ("cluster, WAIT 1", cluster.url, 1, c3),
            ]
            rates: dict[str, list[float]] = {name: [] for name, *_ in runs}
            for _ in range(args.repeats):  # interleaved rounds: the box's load drifts
                for name, url, wait, _ceil in runs:
                    flush([single.port, *cluster.master_ports()])  # memory stays small
                    rate = bulk(url, wait, metrics, args.writers, args.seconds)
                    rates[name].append(rate)
                    print(f"  bulk append, {metrics} metric(s) a flush, {name:<16} "
                          f"{rate / 1e6:6.2f} M reports/s")  # fmt: skip
            base = statistics.median(rates["single node"])
            for name, _url, _wait, ceil in runs:
                rate = statistics.median(rates[name])
                print(
                    f"bulk append, {metrics} metric(s) a flush, {name:<16} median "
                    f"{rate / 1e6:6.2f} M reports/s ({rate / PER_METRIC / metrics:,.0f} "
                    f"flushes/s; {rate / base:.2f} x single node, ceiling ratio {ceil / c1:.2f})"
                )
        for wait in (0, 1, 0, 1):
            flush(cluster.master_ports())
            lat = latency(cluster.url, wait, 6, args.flushes)
            p99 = lat[int(len(lat) * 0.99)]
            print(
                f"one 6-metric flush at a time on the cluster, WAIT {wait}: median "
                f"{statistics.median(lat) * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms"
            )
        print(f"load average at end {os.getloadavg()[0]:.2f}")
    finally:
        cluster.stop()
        single.cleanup()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
