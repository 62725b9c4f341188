"""Shuffler throughput and latency under load, on this box, with Redis AOF everysec.

    .venv/bin/python bench/shuffler_load.py                       # unary + bulk, 1 shuffler
    .venv/bin/python bench/shuffler_load.py --fsync always        # Redis fsyncs every write
    .venv/bin/python bench/shuffler_load.py --scenario unary --shufflers 1,2,4
    .venv/bin/python bench/shuffler_load.py --store memory

Everything runs on loopback: a private redis-server (AOF, fsync everysec), N
``crowdmix shuffler serve`` processes sharing it, a sink aggregator process that
acknowledges every batch, and a load generator (bench/shuffler_loadgen.py):
``--loadgen h2load`` (default; C, one call in flight per connection, ≤ 21 µs of
CPU per call) or ``--loadgen grpc`` (Python grpc clients, which take ≤ 220 µs
of CPU per call from the same two cores). With h2load, every counted call is checked
against the shuffler's own Prometheus counters: the run is refused unless the
shufflers acknowledged at least that many requests and rejected none.

``--scenario sealed``: the bulk load with sealed columns (1000 X25519
sealed reports of 92 bytes per request, the shuffler started with ``--public-keys``)
beside, in the same run and interleaved, the same load with clear columns (16-byte
bits + 16-byte ids) and its ceiling: a bare ``grpc.aio`` server answering every Submit
without parsing it (same payload bytes as the sealed run, same h2load). ``--repeats``
rounds of (echo, sealed, clear), ``uptime`` printed before each round.

Targets:
- device-style, one report per unary call, ≥ 64 concurrent callers:
  ≥ 4 000 acknowledged calls/s with p99 ≤ 50 ms;
- bulk, 1000-report columnar requests: ≥ 1 000 000 acknowledged reports/s.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

METRIC = "bench_rappor"
REGISTRY = f"""
[metrics.{METRIC}]
encoding = "rappor"
k = 128
h = 2
m = 64
f = 0.5
p = 0.5
q = 0.75

[metrics.{METRIC}.shuffle]
min_batch = 1000
max_batch = 100000
max_delay_seconds = 1.0
"""


def sink_main(port_file: str) -> None:
    """A minimal Aggregator that acknowledges every batch (its cost is not the shuffler's)."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from crowdmix.protos import crowdmix_pb2 as pb
    from crowdmix.protos import crowdmix_pb2_grpc

    class Sink(crowdmix_pb2_grpc.AggregatorServicer):  # type: ignore[misc]
        def Ingest(self, request: pb.Batch, context: object) -> pb.IngestResponse:
            return pb.IngestResponse(applied=request.reports.count)

    server = grpc.server(
        ThreadPoolExecutor(max_workers=4), options=[("grpc.max_receive_message_length", -1)]
    )
    crowdmix_pb2_grpc.add_AggregatorServicer_to_server(Sink(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    Path(port_file).write_text(str(port))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    server.stop(1).wait()


def echo_main(port_file: str) -> None:
    """The ceiling of a bulk run: grpc.aio answering Submit without parsing the request."""
    import asyncio

    import grpc

    from crowdmix.protos import crowdmix_pb2 as pb

    reply = pb.SubmitResponse(accepted=1000).SerializeToString()

    async def submit(raw: bytes, context: object) -> bytes:
        return reply

    async def main() -> None:
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "crowdmix.v2.Shuffler", {"Submit": grpc.unary_unary_rpc_method_handler(submit)}
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        Path(port_file).write_text(str(port))
        await server.wait_for_termination()

    asyncio.run(main())


def sealed_bulk_payload(public_keys: Path, per_request: int) -> bytes:
    """One request of ``per_request`` sealed reports (random bits, cohorts and ids inside)."""
    import numpy as np

    from crowdmix.client.sealing import seal_many
    from crowdmix.core.sealed import PublicKeySet
    from crowdmix.protos import crowdmix_pb2 as pb

    fp, rb = fingerprint()
    key = PublicKeySet.from_json(public_keys.read_text()).keys[-1]
    rng = np.random.default_rng(3)
    rows = [(rng.bytes(rb), int(rng.integers(64)), fp, rng.bytes(16)) for _ in range(per_request)]
    window = int(time.time() // 86400)
    sealed = seal_many(key, METRIC, window, rows)
    return pb.SubmitRequest(
        protocol=2,
        columns=[
            pb.ReportColumns(
                metric=METRIC,
                count=per_request,
                key_ids=[key.key_id] * per_request,
                sealed=b"".join(sealed),
                sealed_bytes=len(sealed[0]),
                window=window,
            )
        ],
    ).SerializeToString()


def sealed_scenario(args: argparse.Namespace) -> None:
    """Interleaved rounds of (echo ceiling, sealed shuffler, clear shuffler), bulk."""
    from shuffler_loadgen import build_payload, run_h2load

    from crowdmix.aggregator.sealing.keys import KeySet, write_public_config

    fp, rb = fingerprint()
    results: dict[str, list[float]] = {"echo": [], "sealed": [], "clear": []}
    with tempfile.TemporaryDirectory(prefix="crowdmix-bench-") as tmp:
        work = Path(tmp)
        now = int(time.time())
        keys, _ = KeySet().with_new_key(now)
        public = work / "public-keys.json"
        write_public_config(public, keys, now=now)
        sealed = sealed_bulk_payload(public, 1000)
        clear = build_payload(METRIC, fp, rb, 64, 1000, seed=2)
        print(f"payload bytes per request: sealed {len(sealed):,}, clear {len(clear):,}")
        for rnd in range(args.repeats):
            print(f"round {rnd + 1}: uptime {os.popen('uptime').read().strip()}")
            for kind in ("echo", "sealed", "clear"):
                sub = work / f"{kind}-{rnd}"
                sub.mkdir()
                if kind == "echo":
                    pf = sub / "echo.port"
                    proc = subprocess.Popen([sys.executable, __file__, "--echo", str(pf)])
                    try:
                        target = f"127.0.0.1:{wait_file(pf, proc, 'echo server')}"
                        r = run_h2load(
                            [target], sealed, 1000, callers=args.bulk_inflight,
                            duration=args.duration,
                        )  # fmt: skip
                    finally:
                        proc.send_signal(signal.SIGTERM)
                        proc.wait(timeout=30)
                    note = "no parse, no store"
                else:
                    extra = args.extra.split()
                    if kind == "sealed":
                        extra += ["--public-keys", str(public)]
                    cluster = Cluster(1, args.store, sub, extra, args.fsync)
                    try:
                        payload = sealed if kind == "sealed" else clear
                        r, note = load(cluster, args, payload, 1000, args.bulk_inflight)
                    finally:
                        cluster.close()
                ok = not r.errors
                results[kind].append(r.reports_per_s if ok else float("nan"))
                print(
                    f"  [{kind:6}] {r.reports_per_s:,.0f} acked reports/s, "
                    f"p50 {r.pct(50):.1f} ms, p99 {r.pct(99):.1f} ms, errors {r.errors} ({note})"
                )
    print(f"after: uptime {os.popen('uptime').read().strip()}")
    for kind, xs in results.items():
        print(
            f"{kind:6}: "
            + ", ".join(f"{x:,.0f}" for x in xs)
            + f"  (median {sorted(xs)[len(xs) // 2]:,.0f})"
        )
    for kind in ("sealed", "clear"):
        ratios = [a / b for a, b in zip(results[kind], results["echo"], strict=True)]
        print(f"{kind} / echo ceiling per round: " + ", ".join(f"{x:.0%}" for x in ratios))


def cpu_seconds(pids: list[int]) -> float:
    """user + system CPU time of processes so far (Linux /proc)."""
    total = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")


def with_children(pids: list[int]) -> list[int]:
    """The pids and their direct children (the siblings of ``--processes N``)."""
    out = list(pids)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid in pids:
            out.append(int(stat.parent.name))
    return out


def steal_ticks() -> int:
    """CPU time the hypervisor gave to other guests so far (/proc/stat, all CPUs)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()
    return int(fields[8]) if len(fields) > 8 else 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def request_counters(metrics_url: str) -> tuple[float, float]:
    """(accepted, rejected) Submit requests so far, from a shuffler's /metrics."""
    accepted = rejected = 0.0
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("crowdmix_shuffler_accepted_requests_total "):
                accepted += float(line.split()[-1])
            elif line.startswith("crowdmix_shuffler_rejected_requests_total{"):
                rejected += float(line.split()[-1])
    return accepted, rejected


def wait_file(path: Path, proc: subprocess.Popen[bytes], what: str) -> int:
    deadline = time.monotonic() + 60
    while not path.exists() or not path.read_text().strip():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start")
        time.sleep(0.05)
    return int(path.read_text())


class Cluster:
    def __init__(
        self, n: int, store: str, workdir: Path, extra: list[str], fsync: str = "everysec"
    ) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []
        self.redis = None
        redis_args: list[str] = []
        if store == "redis":
            from crowdmix.cluster import RedisServer

            self.redis = RedisServer(appendonly=True, directory=str(workdir / "redis"), fsync=fsync)
            self.redis.start()
            redis_args = ["--redis", self.redis.url]
        sink_file = workdir / "sink.port"
        sink = subprocess.Popen([sys.executable, __file__, "--sink", str(sink_file)])
        self.procs.append(sink)
        sink_port = wait_file(sink_file, sink, "sink aggregator")
        config = workdir / "metrics.toml"
        config.write_text(REGISTRY)
        self.targets: list[str] = []
        self.shuffler_pids: list[int] = []
        self.metrics_urls: list[str] = []
        for i in range(n):
            pf = workdir / f"shuffler-{i}.port"
            metrics_port = free_port()
            self.metrics_urls.append(f"http://127.0.0.1:{metrics_port}/metrics")
            log = (workdir / f"shuffler-{i}.log").open("wb")
            p = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "crowdmix",
                    "shuffler",
                    "serve",
                    "--allow-unauthenticated",  # the load generator sends no token
                    "--config",
                    str(config),
                    "--listen",
                    "127.0.0.1:0",
                    "--port-file",
                    str(pf),
                    "--aggregator",
                    f"127.0.0.1:{sink_port}",
                    "--log-level",
                    "WARNING",
                    "--metrics-port",
                    str(metrics_port),
                    *redis_args,
                    *extra,
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            self.procs.append(p)
            self.shuffler_pids.append(p.pid)
            self.targets.append(f"127.0.0.1:{wait_file(pf, p, f'shuffler {i}')}")

    def counters(self) -> tuple[float, float]:
        """(accepted, rejected) requests summed over the shufflers (with --processes,
        the first process's only: its siblings serve no metrics)."""
        pairs = [request_counters(url) for url in self.metrics_urls]
        return sum(a for a, _ in pairs), sum(r for _, r in pairs)

    def cpu(self) -> tuple[float, float]:
        """CPU seconds used so far by the shufflers and by redis-server."""
        redis_cpu = 0.0
        if self.redis is not None and self.redis.proc is not None:
            redis_cpu = cpu_seconds([self.redis.proc.pid])
        return cpu_seconds(with_children(self.shuffler_pids)), redis_cpu

    def close(self) -> None:
        for p in reversed(self.procs):
            p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if self.redis is not None:
            self.redis.cleanup()


def fingerprint() -> tuple[int, int]:
    import tomllib

    from crowdmix.core.registry import parse_registry

    m = parse_registry(tomllib.loads(REGISTRY))[METRIC]
    return m.fingerprint, m.report_bytes


def cpu_line(
    c0: tuple[float, float], c1: tuple[float, float], n: int, unit: str, loadgen: float
) -> str:
    """CPU per acknowledged unit over warm-up + run + drain (an upper bound: the
    generators' warm-up and drain are counted, their calls are not)."""
    shuf, red = c1[0] - c0[0], c1[1] - c0[1]
    n = max(n, 1)
    return (
        f"        CPU: shufflers {shuf:.1f} s ({shuf / n * 1e6:.1f} us/{unit}), "
        f"redis {red:.1f} s ({red / n * 1e6:.2f} us/{unit}), "
        f"load generator {loadgen:.1f} s ({loadgen / n * 1e6:.2f} us/{unit}) — upper bounds"
    )


def load(
    cluster: Cluster, args: argparse.Namespace, payload: bytes, per_request: int, inflight: int
) -> tuple[Any, str]:
    """Run one load; returns the result and a note on how acknowledgements were checked."""
    from shuffler_loadgen import run_h2load, run_load

    if args.loadgen == "grpc":
        per_gen = max(1, inflight // args.generators)
        r = run_load(
            cluster.targets,
            payload,
            per_request,
            processes=args.generators,
            concurrency=per_gen,
            connections=min(args.connections, per_gen),
            duration=args.duration,
        )
        return r, f"grpc loadgen, {args.generators} processes, statuses checked per call"
    before = cluster.counters()
    r = run_h2load(cluster.targets, payload, per_request, callers=inflight, duration=args.duration)
    time.sleep(0.5)  # let the last answers' counters land
    after = cluster.counters()
    accepted, rejected = after[0] - before[0], after[1] - before[1]
    partial = "--processes" in args.extra
    if rejected:
        r.errors["rejected_by_shuffler"] = int(rejected)
    if accepted < r.calls and not partial:
        r.errors["unacknowledged"] = int(r.calls - accepted)
        r.calls = r.reports = 0  # no figure from a run whose answers were not all acks
    note = (
        f"h2load, {inflight} connections x 1 call; shuffler counters: {accepted:.0f} accepted "
        f"(warm-up included), {rejected:.0f} rejected"
        + (" (first process only: --processes siblings serve no metrics)" if partial else "")
    )
    return r, note


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sink", help=argparse.SUPPRESS)
    ap.add_argument("--echo", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", choices=["unary", "bulk", "both", "sealed"], default="both")
    ap.add_argument("--repeats", type=int, default=3, help="sealed scenario: rounds")
    ap.add_argument("--shufflers", default="1", help="comma-separated process counts, e.g. 1,2,4")
    ap.add_argument("--store", choices=["redis", "memory"], default="redis")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--loadgen", choices=["h2load", "grpc"], default="h2load")
    ap.add_argument("--callers", type=int, default=64, help="unary calls in flight in total")
    ap.add_argument("--bulk-inflight", type=int, default=8, help="bulk requests in flight in total")
    ap.add_argument(
        "--generators", type=int, default=2, help="grpc loadgen: load generator processes"
    )
    ap.add_argument(
        "--connections", type=int, default=8, help="grpc loadgen: TCP connections per generator"
    )
    ap.add_argument("--extra", default="", help="extra flags for crowdmix shuffler serve")
    ap.add_argument(
        "--fsync",
        choices=["everysec", "always"],
        default="everysec",
        help="Redis appendfsync (README: durability of an acknowledgement)",
    )
    args = ap.parse_args()
    if args.sink:
        sink_main(args.sink)
        return
    if args.echo:
        echo_main(args.echo)
        return
    if args.scenario == "sealed":
        print(f"uptime: {os.popen('uptime').read().strip()}")
        sealed_scenario(args)
        return

    from shuffler_loadgen import build_payload

    print(f"uptime: {os.popen('uptime').read().strip()}")
    print(f"cpus: {os.cpu_count()}, store: {args.store}, loadgen: {args.loadgen}")
    fp, rb = fingerprint()
    for n in [int(x) for x in args.shufflers.split(",")]:
        with tempfile.TemporaryDirectory(prefix="crowdmix-bench-") as tmp:
            cluster = Cluster(n, args.store, Path(tmp), args.extra.split(), args.fsync)
            try:
                if args.scenario in ("unary", "both"):
                    payload = build_payload(METRIC, fp, rb, 64, 1, seed=1)
                    c0, s0 = cluster.cpu(), steal_ticks()
                    r, note = load(cluster, args, payload, 1, args.callers)
                    c1, s1 = cluster.cpu(), steal_ticks()
                    met = r.calls_per_s >= 4000 and r.pct(99) <= 50 and not r.errors
                    print(
                        f"[unary] shufflers={n} callers={args.callers}: "
                        f"{r.calls_per_s:,.0f} acked calls/s, p50 {r.pct(50):.1f} ms, "
                        f"p99 {r.pct(99):.1f} ms, errors {r.errors} "
                        f"(target ≥ 4,000 calls/s, p99 ≤ 50 ms: {'MET' if met else 'NOT MET'})"
                    )
                    print(f"        {note}; CPU steal during the run: {s1 - s0} ticks")
                    print(cpu_line(c0, c1, r.calls, "call", r.loadgen_cpu))
                if args.scenario in ("bulk", "both"):
                    payload = build_payload(METRIC, fp, rb, 64, 1000, seed=2)
                    c0, s0 = cluster.cpu(), steal_ticks()
                    r, note = load(cluster, args, payload, 1000, args.bulk_inflight)
                    c1, s1 = cluster.cpu(), steal_ticks()
                    met = r.reports_per_s >= 1_000_000 and not r.errors
                    print(
                        f"[bulk]  shufflers={n} in flight={args.bulk_inflight}: "
                        f"{r.reports_per_s:,.0f} acked reports/s ({r.calls_per_s:,.0f} req/s), "
                        f"p50 {r.pct(50):.1f} ms, p99 {r.pct(99):.1f} ms, errors {r.errors} "
                        f"(target ≥ 1,000,000 reports/s: {'MET' if met else 'NOT MET'})"
                    )
                    print(f"        {note}; CPU steal during the run: {s1 - s0} ticks")
                    print(cpu_line(c0, c1, r.reports, "report", r.loadgen_cpu))
            finally:
                cluster.close()


if __name__ == "__main__":
    main()
