"""The shuffler's HTTP port (Connect protocol) against its gRPC port, same shuffler, same run.

    .venv/bin/python bench/http_port.py [--duration 5] [--reports 1,100]

One shuffler process (memory store, plaintext krr metric) serves both ports; h2load
drives each in turn with the same Submit body (``--reports`` reports per request) from
``--connections`` connections: the gRPC port (h2, gRPC framing), the HTTP port over
HTTP/2 cleartext and over HTTP/1.1. Accepted reports/s come from the shuffler's own
``accepted_reports`` counter (its /metrics port), read before and after each run, and
the server process's CPU time per accepted report (from /proc: what a loaded box
distorts least). h2load marks Hypercorn's HTTP/1.1 answers failed (their status line has
an empty reason phrase, which RFC 9112 allows and browsers, curl and Node accept), so
HTTP/1.1 answers are counted as "done" requests.

Ceilings in the same run, each in a process of its own answering a fixed reply after
reading the body: a bare grpc.aio server, a bare Hypercorn ASGI app (h2c and h1) and a
bare aiohttp app (h1 only: aiohttp has no HTTP/2 server), which is how the HTTP library
was chosen. Prints one table; every figure is from this run on this (shared) box.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PATH = "/crowdmix.v2.Shuffler/Submit"
TOKEN = "bench-token-0123456789abcdef"


def _registry() -> object:
    from crowdmix.core.registry import parse_registry

    return parse_registry(
        {
            "metrics": {
                "theme": {
                    "encoding": "krr",
                    "epsilon": 1.0,
                    "domain_size": 8,
                    "shuffle": {"min_batch": 10**9, "max_batch": 10**9},
                }
            }
        }
    )


def body(n: int) -> bytes:
    from crowdmix.protos import crowdmix_pb2 as pb

    reg = _registry()
    fp = reg.metrics["theme"].fingerprint  # type: ignore[attr-defined]
    window = int(time.time() // reg.window_seconds)  # type: ignore[attr-defined]
    return pb.SubmitRequest(
        reports=[
            pb.Report(
                metric="theme",
                bits=bytes([i % 8]),
                params_fingerprint=fp,
                report_id=(i + 1).to_bytes(16, "little"),
                window=window,
            )
            for i in range(n)
        ],
        protocol=2,
    ).SerializeToString()


# -- servers, each in a process of its own ---------------------------------------------


def serve_shuffler(port_file: str) -> None:
    from crowdmix.shuffler.config import ShufflerSettings
    from crowdmix.shuffler.memory_store import MemoryStore
    from crowdmix.shuffler.server import start_shuffler

    settings = ShufflerSettings(http_port=0, metrics_port=0, max_buffered_reports=10**10)
    h = start_shuffler(
        _registry(), MemoryStore(), None, settings=settings, tokens=frozenset({TOKEN})
    )  # type: ignore[arg-type]
    Path(port_file).write_text(f"{h.port} {h.http_port} {h.metrics_port}")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.sigwait({signal.SIGTERM})
    h.stop(1.0)


def serve_bare_grpc(port_file: str) -> None:
    import asyncio

    import grpc

    from crowdmix.protos import crowdmix_pb2 as pb

    async def main() -> None:
        async def submit(raw: bytes, context: object) -> pb.SubmitResponse:
            return pb.SubmitResponse(accepted=len(pb.SubmitRequest.FromString(raw).reports))

        server = grpc.aio.server()
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "crowdmix.v2.Shuffler",
                    {
                        "Submit": grpc.unary_unary_rpc_method_handler(
                            submit, response_serializer=pb.SubmitResponse.SerializeToString
                        )
                    },
                ),
            )
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        Path(port_file).write_text(str(port))
        await server.wait_for_termination()

    asyncio.run(main())


def serve_bare_hypercorn(port_file: str) -> None:
    import asyncio
    import socket

    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    from crowdmix.protos import crowdmix_pb2 as pb

    async def app(scope: dict, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return
        raw = b""
        while True:
            m = await receive()
            raw += m.get("body", b"")
            if not m.get("more_body"):
                break
        reply = pb.SubmitResponse(accepted=len(pb.SubmitRequest.FromString(raw).reports))
        out = reply.SerializeToString()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/proto"),
                    (b"content-length", str(len(out)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": out})

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    Path(port_file).write_text(str(sock.getsockname()[1]))
    config = Config()
    config.bind = [f"fd://{sock.detach()}"]
    config.accesslog = None

    async def main() -> None:
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]

    asyncio.run(main())


def serve_bare_aiohttp(port_file: str) -> None:
    from aiohttp import web

    from crowdmix.protos import crowdmix_pb2 as pb

    async def submit(request: web.Request) -> web.Response:
        raw = await request.read()
        reply = pb.SubmitResponse(accepted=len(pb.SubmitRequest.FromString(raw).reports))
        return web.Response(body=reply.SerializeToString(), content_type="application/proto")

    import socket

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    Path(port_file).write_text(str(sock.getsockname()[1]))
    app = web.Application()
    app.router.add_post(PATH, submit)
    web.run_app(app, sock=sock, print=None, access_log=None)


SERVERS = {
    "shuffler": serve_shuffler,
    "grpc": serve_bare_grpc,
    "hypercorn": serve_bare_hypercorn,
    "aiohttp": serve_bare_aiohttp,
}


def start(kind: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    fd, port_file = tempfile.mkstemp()
    os.close(fd)
    os.unlink(port_file)
    proc = subprocess.Popen([sys.executable, __file__, "--serve", kind, port_file])
    deadline = time.monotonic() + 30
    while not (Path(port_file).exists() and Path(port_file).read_text().strip()):
        if time.monotonic() > deadline or proc.poll() is not None:
            raise SystemExit(f"the {kind} server did not start")
        time.sleep(0.05)
    time.sleep(0.2)
    ports = [int(p) for p in Path(port_file).read_text().split()]
    os.unlink(port_file)
    return proc, ports


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def h2load(port: int, data: bytes, proto: str, args: argparse.Namespace) -> float:
    """Requests/s answered (2xx; HTTP/1.1: done, see the module docstring)."""
    with tempfile.NamedTemporaryFile(suffix=".bin") as f:
        headers = ["-H", f"authorization: Bearer {TOKEN}"]
        if proto == "grpc":
            f.write(b"\x00" + len(data).to_bytes(4, "big") + data)
            headers += ["-H", "content-type: application/grpc", "-H", "te: trailers"]
        else:
            f.write(data)
            headers += ["-H", "content-type: application/proto"]
        f.flush()
        cmd = [
            "h2load", "-D", str(args.duration), "--warm-up-time", "1",
            "-c", str(args.connections), "-m", "1" if proto == "h1" else str(args.streams),
            "-d", f.name, *headers, *(["--h1"] if proto == "h1" else []),
            f"http://127.0.0.1:{port}{PATH}",
        ]  # fmt: skip
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.duration + 60).stdout
    m = re.search(r"finished in ([\d.]+)(m?s), ([\d.]+) req/s", out)
    ok = re.search(r"(\d+) done" if proto == "h1" else r"status codes: (\d+) 2xx", out)
    if not m or not ok:
        raise SystemExit(f"h2load said:\n{out}")
    seconds = float(m.group(1)) / (1000 if m.group(2) == "ms" else 1)
    return int(ok.group(1)) / seconds


def accepted(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read().decode()
    m = re.search(r"^crowdmix_shuffler_accepted_reports_total ([\d.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--duration", type=int, default=5)
    p.add_argument("--reports", default="1,100", help="reports per request, comma-separated")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--streams", type=int, default=4, help="concurrent streams per h2 connection")
    args = p.parse_args()
    for n in [int(x) for x in args.reports.split(",")]:
        data = body(n)
        proc, (grpc_port, http_port, metrics_port) = start("shuffler")
        got: dict[str, tuple[float, float]] = {}  # label -> (reports/s, CPU µs per report)
        try:
            for label, port, proto in (
                ("gRPC port", grpc_port, "grpc"),
                ("HTTP port h2c", http_port, "h2c"),
                ("HTTP port HTTP/1.1", http_port, "h1"),
            ):
                before, cpu0, t0 = accepted(metrics_port), cpu_seconds(proc.pid), time.monotonic()
                h2load(port, data, proto, args)
                reports = accepted(metrics_port) - before
                cpu = cpu_seconds(proc.pid) - cpu0
                got[label] = (reports / (time.monotonic() - t0), 1e6 * cpu / max(reports, 1))
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
        g_rate, g_cpu = got["gRPC port"]
        print(f"{n} report(s) per request, {args.connections} connections, same shuffler:")
        for label, (rate, cpu) in got.items():
            print(
                f"  {label:<20} {rate:>10,.0f} reports/s  ({rate / g_rate:.2f}x the gRPC port)"
                f"  CPU {cpu:7.1f} us/report  ({g_cpu / cpu:.2f}x the gRPC port's throughput "
                "per CPU second)"
            )
        for kind, protos in (
            ("grpc", ("grpc",)),
            ("hypercorn", ("h2c", "h1")),
            ("aiohttp", ("h1",)),
        ):
            proc, (port,) = start(kind)
            try:
                for proto in protos:
                    cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
                    rate = h2load(port, data, proto, args)
                    done = rate * (time.monotonic() - t0 - 1)  # minus the warm-up second
                    cpu = 1e6 * (cpu_seconds(proc.pid) - cpu0) / max(done * n, 1)
                    print(
                        f"  bare {kind:<9} {proto:<4} {rate * n:>10,.0f} reports/s  "
                        f"CPU ~{cpu:6.1f} us/report"
                    )
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--serve":
        SERVERS[sys.argv[2]](sys.argv[3])
    else:
        main()
