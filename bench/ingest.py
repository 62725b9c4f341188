"""The aggregator's ingest alone: Batch → validate → count → Redis, in reports/s.

    .venv/bin/python bench/ingest.py [--seconds 5] [--senders 4] [--sizes 1000,20000,100000]

Starts ``crowdmix aggregator serve --redis`` as its own process (Redis with AOF,
appendfsync everysec, both on loopback) and drives ``Aggregator.Ingest`` from
``--senders`` threads in this process with pre-serialised batches (only the
16-byte batch id changes per call, spliced in front of the serialised rest: the
sender costs almost nothing). m=64 cohorts, k=128 bits. Also prints the
in-process rate of ``Ingestor.ingest`` (no gRPC) with the memory and Redis stores.

Target (issue 5): the aggregator's ingest alone >= 10 M reports/s.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.daemon.ingest import IngestBatch, Ingestor
from aggregator.store.base import MemoryCountStore
from aggregator.store.redis import RedisCountStore
from client.registry import load_registry
from crowdmix.cluster import DaemonProcess, RedisServer, free_port
from protos import crowdmix_pb2 as pb

M, K = 64, 128
REGISTRY = f"""
[metrics.bench]
encoding = "rappor"
k = {K}
h = 2
m = {M}
f = 0.5
p = 0.5
q = 0.75
"""


def batch_tail(n: int, window: int, fingerprint: int, seed: int) -> bytes:
    """A serialised Batch without its batch_id (field 1), to splice ids in front."""
    rng = np.random.default_rng(seed)
    msg = pb.Batch(
        window=window,
        reports=pb.ReportColumns(
            metric="bench",
            params_fingerprint=fingerprint,
            count=n,
            report_bytes=K // 8,
            cohorts=rng.integers(0, M, n).tolist(),
            bits=rng.integers(0, 256, (n, K // 8), dtype=np.uint8).tobytes(),
        ),
    )
    return msg.SerializeToString()


def drive(target: str, tail: bytes, n: int, senders: int, seconds: float) -> float:
    done = [0] * senders
    stop = threading.Event()

    def sender(j: int) -> None:
        with grpc.insecure_channel(
            target, options=[("grpc.max_send_message_length", -1)]
        ) as channel:
            ingest = channel.unary_unary(
                "/crowdmix.v1.Aggregator/Ingest",
                request_serializer=None,
                response_deserializer=pb.IngestResponse.FromString,
            )
            while not stop.is_set():
                resp = ingest(b"\x0a\x10" + os.urandom(16) + tail, timeout=30)
                done[j] += int(resp.applied)

    threads = [threading.Thread(target=sender, args=(j,)) for j in range(senders)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(done) / (time.perf_counter() - start)


def in_process(ingestor: Ingestor, tail: bytes, seconds: float) -> float:
    msg = pb.Batch.FromString(tail)
    cols = msg.reports
    cohorts = np.array(cols.cohorts, dtype=np.int64)
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = IngestBatch(
            batch_id=os.urandom(16),
            window=msg.window,
            metric=cols.metric,
            fingerprint=cols.params_fingerprint,
            count=cols.count,
            report_bytes=cols.report_bytes,
            cohorts=cohorts,
            bits=cols.bits,
        )
        done += ingestor.ingest(batch).applied
    return done / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--workers", type=int, default=8, help="aggregator Ingest threads")
    ap.add_argument("--sizes", default="1000,20000,100000", help="reports per batch")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print(f"load average at start: {os.getloadavg()[0]:.2f}; m={M} k={K}, {args.senders} senders")
    work = Path(tempfile.mkdtemp(prefix="crowdmix-bench-"))
    config = work / "metrics.toml"
    config.write_text(REGISTRY)
    registry = load_registry(config)
    fp = registry["bench"].fingerprint
    window = registry.window_of(time.time())
    redis_server = RedisServer(appendonly=True, directory=str(work / "redis"))
    redis_server.start()
    port = free_port()
    daemon = DaemonProcess(
        "aggregator",
        ["aggregator", "serve", "--config", str(config), "--redis", redis_server.url,
         "--listen", f"127.0.0.1:{port}", "--workers", str(args.workers)],
        port,
        work / "aggregator.log",
    )  # fmt: skip
    daemon.start()
    try:
        daemon.wait_healthy(60)
        for n in sizes:
            tail = batch_tail(n, window, fp, seed=n)
            rate = drive(daemon.target, tail, n, args.senders, args.seconds)
            print(f"gRPC Ingest, redis AOF, batch {n:>7}: {rate / 1e6:7.2f} M reports/s")
        store = RedisCountStore.from_url(redis_server.url)
        for n in sizes:
            tail = batch_tail(n, window, fp, seed=n)
            redis_rate = in_process(Ingestor(registry, store), tail, args.seconds / 2)
            mem_rate = in_process(Ingestor(registry, MemoryCountStore()), tail, args.seconds / 2)
            print(
                f"in-process Ingestor.ingest, batch {n:>7}: redis {redis_rate / 1e6:7.2f}, "
                f"memory {mem_rate / 1e6:7.2f} M reports/s (one thread)"
            )
        store.close()
        print("target: aggregator ingest alone >= 10 M reports/s (issue 5)")
    finally:
        daemon.stop()
        redis_server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
