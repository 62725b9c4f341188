"""End to end: clients → shuffler(s) → aggregator → counts in Redis, in reports/s.

    .venv/bin/python bench/e2e.py [--reports 10000000] [--shufflers 1] [--clients 2]
                                  [--threads 4] [--max-batch 100000]

A local cluster on loopback (``crowdmix.cluster.LocalCluster``): ``--shufflers``
shuffler processes sharing one redis-server (AOF, appendfsync everysec), bearer
tokens on; one aggregator with a redis-server of its own (as deployed).
``--clients`` load processes × ``--threads`` threads send columnar ``Submit``
requests of 1000 reports (m=64, k=128: 16 bytes a report) as the SDK makes them
(``crowdmix.client.request.submit_request``: protocol 2, the window a device learns
from ``GetConfig``'s server time), round-robin over the shufflers. The bits and cohorts
come from a pool of 64 requests; every report gets a fresh 16-byte CSPRNG report id when
its request is first sent, kept through retries (``crowdmix.client.answers``: RETRY
answers are retried with the same bytes), so each report is counted once. The ids of a
request are one AES-256-CTR keystream block run (a key from ``os.urandom`` per client
thread) spliced into the pool entry's serialized bytes: ``os.urandom`` of 16 kB and a
proto re-serialization cost a client ~70 µs a request, CPU the shuffler shares here.

Printed: the acknowledged rate while sending (shuffler intake), and the end-to-end
rate = reports counted / (first send → last report counted by the aggregator). The
final counts are checked to equal, cohort by cohort and bit by bit, a direct count of
the acknowledged requests.

Target: >= 1 M reports/s sustained end to end with 1000-report requests.

``--redis-cluster``: both stores on one 3-master, 3-replica Redis Cluster
(AOF always on every node), ``--min-replicas-ack N`` on every daemon.

``--sealed``: the cluster runs with a key set (shufflers hold the public
config, the aggregator opens with ``--open-workers N``) and the requests carry sealed
columns (X25519 HPKE, 92 bytes a report), every report sealed with its own fresh id
before the clock starts (about 0.1 ms a report: keep ``--reports`` small) and sent
once. The ceiling measured in the same run: the raw ``cryptography`` HPKE open rate on
one core (a ``Suite.decrypt`` loop over the same ciphertexts), before and after the
run; opening is the aggregator's bound, so end to end cannot exceed it times the cores
opening.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.cluster import LocalCluster
from crowdmix.core.registry import load_registry
from crowdmix.protos import crowdmix_pb2 as pb

M, K, PER_REQUEST, POOL = 64, 128, 1000, 64
METRIC = "e2e"
#: Attempts of one request on RETRY answers (the same bytes, so the same report ids).
ATTEMPTS = 100


def server_window(target: str, token: str) -> int:
    """The current window as a device learns it: ``GetConfig``'s server time."""
    import grpc

    from crowdmix.protos import crowdmix_pb2_grpc

    with grpc.insecure_channel(target) as channel:
        answer = crowdmix_pb2_grpc.ShufflerStub(channel).GetConfig(
            pb.GetConfigRequest(), metadata=(("authorization", f"Bearer {token}"),), timeout=30
        )
    return int(answer.server_time // answer.window_seconds)


def pool_requests(fingerprint: int, window: int) -> list[pb.SubmitRequest]:
    """The pool's requests, clear, built by the SDK's builder (ids set at send time)."""
    return [_request(k, fingerprint, window, None, lambda: bytes(16)) for k in range(POOL)]


def sealed_payloads(public_keys: Path, fingerprint: int, window: int, n: int) -> list[bytes]:
    """``n`` requests sealed by the SDK's builder, request i from pool entry i % POOL,
    every report with a fresh id: each is sent once."""
    from crowdmix.core.sealed import PublicKeySet

    key = PublicKeySet.from_json(public_keys.read_text()).keys[-1]
    return [
        _request(i % POOL, fingerprint, window, key, lambda: os.urandom(16)).SerializeToString()
        for i in range(n)
    ]


def _request(k: int, fingerprint: int, window: int, key: Any, report_id: Any) -> pb.SubmitRequest:
    """Pool entry ``k``'s reports in one request (``crowdmix.client.request``)."""
    from crowdmix.client.report import make_report
    from crowdmix.client.request import submit_request

    cohorts, bits = pool_arrays()
    return submit_request(
        [
            (make_report(METRIC, int(c), b.tobytes(), fingerprint, report_id()), window)
            for c, b in zip(cohorts[k], bits[k], strict=True)
        ],
        key=key,
    )


def _splice_points(template: pb.SubmitRequest) -> tuple[bytes, bytes]:
    """The request's serialized bytes before and after its report ids (the ids are the
    last ``16 * PER_REQUEST`` bytes of a fixed-length field: any ids of that length
    serialize to the same bytes around them)."""
    marked = pb.SubmitRequest.FromString(template.SerializeToString())
    marker = os.urandom(16 * PER_REQUEST)
    marked.columns[0].report_ids = marker
    raw = marked.SerializeToString()
    at = raw.index(marker)
    return raw[:at], raw[at + len(marker) :]


def _id_stream() -> Any:
    """``16 * PER_REQUEST`` fresh CSPRNG bytes per call: AES-256-CTR under a random key."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    encryptor = Cipher(algorithms.AES(os.urandom(32)), modes.CTR(bytes(16))).encryptor()
    zeros = bytes(16 * PER_REQUEST)
    return lambda: encryptor.update(zeros)


def raw_open_rate(keys_path: Path, fingerprint: int, n: int = 2000) -> float:
    """Reports/s of a bare ``Suite.decrypt`` loop on one core (CPU time), the ceiling."""
    from crowdmix.aggregator.sealing.keys import load_keyset
    from crowdmix.client.sealing import seal_many
    from crowdmix.core.hpke import hpke_suite
    from crowdmix.core.sealed import report_info

    key = load_keyset(keys_path).keys[-1]
    rows = [(bytes(16), 0, fingerprint, os.urandom(16)) for _ in range(n)]
    sealed = seal_many(key.public(), METRIC, 0, rows)
    suite, sk = hpke_suite(key.suite), key.hpke_private_key()
    info = report_info(METRIC, key.key_id, 0)
    best = 0.0
    for _ in range(3):
        t0 = time.process_time()
        for ct in sealed:
            suite.decrypt(ct, sk, info=info)
        best = max(best, n / (time.process_time() - t0))
    return best


def registry_text(max_batch: int, max_delay: float) -> str:
    return (
        f'[metrics.{METRIC}]\nencoding = "rappor"\nk = {K}\nh = 2\nm = {M}\n'
        "f = 0.5\np = 0.5\nq = 0.75\n\n"
        f"[metrics.{METRIC}.shuffle]\nmin_batch = 1000\nmax_batch = {max_batch}\n"
        f"max_delay_seconds = {max_delay}\n"
    )


@functools.lru_cache(maxsize=1)
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
    public_keys: Path | None = None,
) -> None:
    import grpc

    from crowdmix.client.answers import Action, classify

    def deliver(submit: Any, payload: bytes, metadata: Any) -> bool:
        """Submit, retrying RETRY answers with the same bytes: acknowledged or not."""
        for _ in range(ATTEMPTS):
            try:
                submit(payload, metadata=metadata, timeout=30)
                return True
            except grpc.RpcError as exc:
                if classify(exc.code().name, exc.details() or "").action is not Action.RETRY:
                    return False
                time.sleep(0.01)  # backpressure: back off a little
        return False

    window = server_window(targets[0], token)
    sealed = (
        None if public_keys is None else sealed_payloads(public_keys, fingerprint, window, requests)
    )
    templates = pool_requests(fingerprint, window) if sealed is None else []
    acked = np.zeros(POOL, dtype=np.int64)
    failed = [0]
    lock = threading.Lock()
    counter = iter(range(requests))

    def worker(j: int) -> None:
        target = targets[j % len(targets)]
        spliced = [_splice_points(t) for t in templates]
        fresh_ids = _id_stream()
        with grpc.insecure_channel(target) as channel:
            submit = channel.unary_unary(
                "/crowdmix.v2.Shuffler/Submit",
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
                if sealed is not None:
                    payload = sealed[i]
                else:  # this request's reports: fresh ids, as each device draws its own
                    head, tail = spliced[k]
                    payload = b"".join((head, fresh_ids(), tail))
                ok = deliver(submit, payload, metadata)
                with lock:
                    if ok:
                        acked[k] += 1
                    else:
                        failed[0] += 1

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
    ap.add_argument("--sealed", action="store_true", help="sealed reports")
    ap.add_argument("--open-workers", type=int, default=0, help="aggregator --open-workers")
    ap.add_argument(
        "--redis-cluster",
        action="store_true",
        help="a 3-master, 3-replica Redis Cluster (AOF always) for both stores",
    )
    ap.add_argument("--min-replicas-ack", type=int, default=0, help="WAIT for N replicas")
    args = ap.parse_args()
    requests = args.reports // PER_REQUEST
    print(
        f"load average at start: {os.getloadavg()[0]:.2f}; {args.reports:,} reports in "
        f"{requests:,} requests of {PER_REQUEST}; {args.shufflers} shuffler(s), "
        f"{args.clients}x{args.threads} client threads, max_batch {args.max_batch}, "
        + (f"SEALED (open workers {args.open_workers})" if args.sealed else "plaintext")
        + (f", shuffler args {args.shuffler_args!r}" if args.shuffler_args else "")
        + (
            f", REDIS CLUSTER 3+3 (AOF always), WAIT {args.min_replicas_ack}"
            if args.redis_cluster
            else ""
        )
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
        extra_aggregator_args=["--open-workers", str(args.open_workers)] if args.sealed else None,
        sealed=args.sealed,
        redis_cluster=args.redis_cluster,
        min_replicas_ack=args.min_replicas_ack,
    )
    cluster.start()
    ceiling: list[float] = []
    if args.sealed:
        ceiling.append(raw_open_rate(cluster.keys_path, config.fingerprint))
        print(f"ceiling before: raw HPKE open {ceiling[-1]:,.0f} reports/s on one core (CPU)")
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
                    cluster.public_keys_path if args.sealed else None,
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
        print(f"acknowledged {total:,} reports ({failed} requests not acknowledged, given up)")
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
        print("target: >= 1 M reports/s end to end with 1000-report requests")
        if args.sealed:
            ceiling.append(raw_open_rate(cluster.keys_path, config.fingerprint))
            rate = counted / (t_counted - t0)
            lo, hi = min(ceiling), max(ceiling)
            print(
                f"ceiling after: raw HPKE open {ceiling[-1]:,.0f} reports/s on one core; "
                f"end to end sealed {rate:,.0f} reports/s = {rate / hi:.0%}-{rate / lo:.0%} "
                "of one core's raw open"
            )
        store.close()
    finally:
        codes = cluster.stop()
        print(f"exit codes: {codes}")
        shutil.rmtree(work, ignore_errors=True)  # 100-370 MB of AOF a run of 8 M reports
    return 0 if exact else 1


if __name__ == "__main__":
    sys.exit(main())
