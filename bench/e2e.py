"""End to end: clients → shuffler(s) → aggregator → counts in Redis, in reports/s.

    .venv/bin/python bench/e2e.py [--reports 10000000] [--shufflers 1] [--clients 2]
                                  [--threads 4] [--max-batch 100000]

A local cluster on loopback (``crowdmix.cluster.LocalCluster``): ``--shufflers``
shuffler processes sharing one redis-server (AOF, appendfsync everysec), bearer
tokens on; one aggregator with a redis-server of its own (as deployed).
``--clients`` load processes × ``--threads`` threads send columnar ``Submit``
requests of 1000 reports (m=64, k=128: 16 bytes a report), pre-serialised from a
pool of 64 distinct requests, round-robin over the shufflers.

Printed: the acknowledged rate while sending (shuffler intake), and the end-to-end
rate = reports counted / (first send → last report counted by the aggregator). The
final counts are checked to equal, cohort by cohort and bit by bit, a direct count of
the acknowledged requests.

Target (issue 5): >= 1 M reports/s sustained end to end with 1000-report requests.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aggregator.counting.counts import CohortCounts
from aggregator.store.redis import RedisCountStore
from client.registry import load_registry
from crowdmix.cluster import LocalCluster
from protos import crowdmix_pb2 as pb

M, K, PER_REQUEST, POOL = 64, 128, 1000, 64
METRIC = "e2e"


def registry_text(max_batch: int, max_delay: float) -> str:
    return (
        f'[metrics.{METRIC}]\nencoding = "rappor"\nk = {K}\nh = 2\nm = {M}\n'
        "f = 0.5\np = 0.5\nq = 0.75\n\n"
        f"[metrics.{METRIC}.shuffle]\nmin_batch = 1000\nmax_batch = {max_batch}\n"
        f"max_delay_seconds = {max_delay}\n"
    )


def pool_arrays() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2026)
    cohorts = rng.integers(0, M, (POOL, PER_REQUEST), dtype=np.uint32)
    bits = rng.integers(0, 256, (POOL, PER_REQUEST, K // 8), dtype=np.uint8)
    return cohorts, bits


def client_process(
    targets: list[str],
    token: str,
    fingerprint: int,
    requests: int,
    threads: int,
    out: mp.Queue,
    go: threading.Event,
) -> None:
    import grpc

    cohorts, bits = pool_arrays()
    payloads = [
        pb.SubmitRequest(
            columns=[
                pb.ReportColumns(
                    metric=METRIC,
                    params_fingerprint=fingerprint,
                    count=PER_REQUEST,
                    report_bytes=K // 8,
                    cohorts=cohorts[i].tolist(),
                    bits=bits[i].tobytes(),
                )
            ]
        ).SerializeToString()
        for i in range(POOL)
    ]
    acked = np.zeros(POOL, dtype=np.int64)
    failed = [0]
    lock = threading.Lock()
    counter = iter(range(requests))

    def worker(j: int) -> None:
        target = targets[j % len(targets)]
        with grpc.insecure_channel(target) as channel:
            submit = channel.unary_unary(
                "/crowdmix.v1.Shuffler/Submit",
                request_serializer=None,
                response_deserializer=pb.SubmitResponse.FromString,
            )
            metadata = (("authorization", f"Bearer {token}"),)
            while True:
                with lock:
                    i = next(counter, None)
                if i is None:
                    return
                k = i % POOL
                try:
                    submit(payloads[k], metadata=metadata, timeout=30)
                except grpc.RpcError:
                    with lock:
                        failed[0] += 1
                    time.sleep(0.01)  # backpressure: back off a little, move on
                    continue
                with lock:
                    acked[k] += 1

    out.put("ready")
    go.wait()
    pool = [threading.Thread(target=worker, args=(j,)) for j in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put((acked, failed[0], time.time()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--reports", type=int, default=10_000_000)
    ap.add_argument("--shufflers", type=int, default=1)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--max-batch", type=int, default=100_000)
    ap.add_argument("--max-delay", type=float, default=0.2)
    ap.add_argument(
        "--shuffler-args",
        default="",
        help='extra flags for each shuffler, e.g. "--commit-delay-ms 2"',
    )
    args = ap.parse_args()
    requests = args.reports // PER_REQUEST
    print(
        f"load average at start: {os.getloadavg()[0]:.2f}; {args.reports:,} reports in "
        f"{requests:,} requests of {PER_REQUEST}; {args.shufflers} shuffler(s), "
        f"{args.clients}x{args.threads} client threads, max_batch {args.max_batch}"
        + (f", shuffler args {args.shuffler_args!r}" if args.shuffler_args else "")
    )
    work = Path(tempfile.mkdtemp(prefix="crowdmix-e2e-"))
    reg_path = work / "metrics.toml"
    reg_path.write_text(registry_text(args.max_batch, args.max_delay))
    config = load_registry(reg_path)[METRIC]
    cluster = LocalCluster(
        work,
        shufflers=args.shufflers,
        registry_path=reg_path,
        extra_shuffler_args=args.shuffler_args.split() or None,
    )
    cluster.start()
    try:
        store = RedisCountStore.from_url(cluster.aggregator_redis_url)
        ctx = mp.get_context("spawn")
        out: mp.Queue = ctx.Queue()
        go = ctx.Event()
        share = [
            requests // args.clients + (i < requests % args.clients) for i in range(args.clients)
        ]
        procs = [
            ctx.Process(
                target=client_process,
                args=(
                    cluster.shuffler_targets,
                    cluster.token,
                    config.fingerprint,
                    n,
                    args.threads,
                    out,
                    go,
                ),
            )
            for n in share
        ]
        for p in procs:
            p.start()
        for _ in procs:  # clients connected and payloads built: start the clock
            assert out.get(timeout=120) == "ready"
        t0 = time.time()
        go.set()
        results = [out.get(timeout=600) for _ in procs]
        for p in procs:
            p.join()
        t_sent = max(r[2] for r in results)
        acked = sum(r[0] for r in results)
        failed = sum(r[1] for r in results)
        total = int(acked.sum()) * PER_REQUEST
        # wait until every acknowledged report is counted
        deadline = time.time() + 300
        counted = 0
        while time.time() < deadline:
            got = store.load(METRIC)
            counted = 0 if got is None else got.num_reports
            if counted >= total:
                break
            time.sleep(0.02)
        t_counted = time.time()
        print(f"acknowledged {total:,} reports ({failed} requests refused and not retried)")
        print(f"shuffler intake while sending: {total / (t_sent - t0) / 1e6:6.2f} M reports/s")
        print(
            f"end to end, first send -> all counted: {counted / (t_counted - t0) / 1e6:6.2f} "
            f"M reports/s ({t_counted - t0:.1f} s; counted {counted:,})"
        )
        cohorts, bits = pool_arrays()
        expected = CohortCounts.create(M, K)
        for k in range(POOL):
            one = CohortCounts.create(M, K)
            one.add(cohorts[k].astype(np.int64), bits[k])
            expected.totals = expected.totals + one.totals * acked[k]
            expected.ones = expected.ones + one.ones * acked[k]
        got = store.load(METRIC)
        exact = (
            got is not None
            and np.array_equal(got.totals, expected.totals)
            and np.array_equal(got.ones, expected.ones)
        )
        print(f"counts equal a direct count of the acknowledged reports: {exact}")
        print("target: >= 1 M reports/s end to end with 1000-report requests (issue 5)")
        store.close()
    finally:
        codes = cluster.stop()
        print(f"exit codes: {codes}")
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
