"""The aggregator's ingest alone: Batch → validate → count → Redis, in reports/s.

    .venv/bin/python bench/ingest.py [--seconds 5] [--senders 4] [--sizes 1000,20000,100000]

Starts ``crowdmix aggregator serve --redis`` as its own process (Redis with AOF,
appendfsync everysec, both on loopback) and drives ``Aggregator.Ingest`` from
``--senders`` threads in this process with pre-serialised batches (only the
16-byte batch id changes per call, spliced in front of the serialised rest: the
sender costs almost nothing). m=64 cohorts, k=128 bits. Also prints the
in-process rate of ``Ingestor.ingest`` (no gRPC) with the memory and Redis stores.

Every report has a report id never sent before (a counter and a random salt, 16
bytes, spliced in per call), as the SDK does, so the aggregator checks and records
every id in the batch's window.

Target: the aggregator's ingest alone >= 10 M reports/s.
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

from crowdmix.aggregator.daemon.ingest import IngestBatch, Ingestor
from crowdmix.aggregator.store.memory import MemoryCountStore
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.cluster import DaemonProcess, RedisServer, free_port
from crowdmix.core.registry import load_registry
from crowdmix.protos import crowdmix_pb2 as pb

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


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    return bytes([tag]) + _varint(len(payload)) + payload


class BatchMaker:
    """Serialised Batches of ``n`` fixed reports, each call with a fresh batch id and, with
    ``ids``, fresh report ids (a counter and a salt: distinct from every id sent before)."""

    def __init__(self, n: int, window: int, fingerprint: int, seed: int, ids: bool) -> None:
        rng = np.random.default_rng(seed)
        self.n = n
        self.window = window
        self.columns = pb.ReportColumns(
            metric="bench",
            params_fingerprint=fingerprint,
            count=n,
            report_bytes=K // 8,
            cohorts=rng.integers(0, M, n).tolist(),
            bits=rng.integers(0, 256, (n, K // 8), dtype=np.uint8).tobytes(),
        )
        self.prefix = self.columns.SerializeToString()
        self.window_field = b"\x10" + _varint(window)
        self.ids = ids
        self._lock = threading.Lock()
        self._next = 0
        self._salt = np.frombuffer(os.urandom(8), dtype="<u8")[0]

    def report_ids(self) -> bytes:
        if not self.ids:
            return b""
        with self._lock:
            base, self._next = self._next, self._next + self.n
        ids = np.empty((self.n, 2), dtype="<u8")
        ids[:, 0] = np.arange(base + 1, base + 1 + self.n, dtype=np.uint64)
        ids[:, 1] = self._salt
        return ids.tobytes()

    def serialised(self) -> bytes:
        rids = self.report_ids()
        cols = self.prefix + (_field(0x3A, rids) if rids else b"")
        return _field(0x0A, os.urandom(16)) + self.window_field + _field(0x1A, cols)


def drive(target: str, maker: BatchMaker, senders: int, seconds: float) -> float:
    done = [0] * senders
    stop = threading.Event()

    def sender(j: int) -> None:
        with grpc.insecure_channel(
            target, options=[("grpc.max_send_message_length", -1)]
        ) as channel:
            ingest = channel.unary_unary(
                "/crowdmix.v2.Aggregator/Ingest",
                request_serializer=None,
                response_deserializer=pb.IngestResponse.FromString,
            )
            while not stop.is_set():
                resp = ingest(maker.serialised(), timeout=30)
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


def in_process(ingestor: Ingestor, maker: BatchMaker, seconds: float) -> float:
    cols = maker.columns
    cohorts = np.array(cols.cohorts, dtype=np.int64)
    done = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        batch = IngestBatch(
            batch_id=os.urandom(16),
            window=maker.window,
            metric=cols.metric,
            fingerprint=cols.params_fingerprint,
            count=cols.count,
            report_bytes=cols.report_bytes,
            cohorts=cohorts,
            bits=cols.bits,
            report_ids=maker.report_ids(),
        )
        result = ingestor.ingest(batch)
        assert result.duplicate_reports == 0, "report ids must be fresh"
        done += result.applied
    return done / (time.perf_counter() - start)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--senders", type=int, default=4)
    ap.add_argument("--workers", type=int, default=8, help="aggregator Ingest threads")
    ap.add_argument("--sizes", default="1000,20000,100000", help="reports per batch")
    args = ap.parse_args()
    ids = True
    sizes = [int(s) for s in args.sizes.split(",")]
    print(
        f"load average at start: {os.getloadavg()[0]:.2f}; m={M} k={K}, {args.senders} senders, "
        "fresh report ids"
    )
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
            rate = drive(
                daemon.target, BatchMaker(n, window, fp, n, ids), args.senders, args.seconds
            )
            print(f"gRPC Ingest, redis AOF, batch {n:>7}: {rate / 1e6:7.2f} M reports/s")
        store = RedisCountStore.from_url(redis_server.url)
        for n in sizes:
            # a window of its own: the daemon above filled ``window``'s id list
            maker = BatchMaker(n, window - 2, fp, n + 1, ids)
            redis_rate = in_process(Ingestor(registry, store), maker, args.seconds / 2)
            mem_rate = in_process(Ingestor(registry, MemoryCountStore()), maker, args.seconds / 2)
            print(
                f"in-process Ingestor.ingest, batch {n:>7}: redis {redis_rate / 1e6:7.2f}, "
                f"memory {mem_rate / 1e6:7.2f} M reports/s (one thread)"
            )
        info = store._r.info("memory")
        keys = store._r.keys("crowdmix:agg:{bench}:w:*:nrids")
        rids = sum(int(store._r.get(k) or 0) for k in keys)
        if rids:
            print(
                f"redis used_memory {info['used_memory'] / 1e6:.1f} MB holding {rids} report "
                f"ids: <= {info['used_memory'] / rids:.0f} bytes per report id (all keys counted)"
            )
        store.close()
        print("target: aggregator ingest alone >= 10 M reports/s")
    finally:
        daemon.stop()
        redis_server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
