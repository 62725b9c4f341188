"""Bare gRPC ceiling on this box: synchronous grpc.server vs grpc.aio, no storage.

    .venv/bin/python bench/shuffler_grpc_modes.py [--duration 8]

Serves a Shuffler.Submit that only parses the request and answers, in a server
process of its own, and drives it with the same load generators as
bench/shuffler_load.py (64 unary callers; then 8 callers of 1000-report
columnar requests), h2load by default, ``--loadgen grpc`` for the Python one.
This is the ceiling the shuffler's own work is measured against, and how the
server kind (sync vs asyncio) was chosen.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))


def serve_sync(port_file: str) -> None:
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from crowdmix.protos import crowdmix_pb2 as pb
    from crowdmix.protos import crowdmix_pb2_grpc

    class Bare(crowdmix_pb2_grpc.ShufflerServicer):  # type: ignore[misc]
        def Submit(self, request: pb.SubmitRequest, context: object) -> pb.SubmitResponse:
            return pb.SubmitResponse(
                accepted=len(request.reports) + sum(c.count for c in request.columns)
            )

    server = grpc.server(ThreadPoolExecutor(max_workers=8))  # as the shuffler's default
    crowdmix_pb2_grpc.add_ShufflerServicer_to_server(Bare(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    Path(port_file).write_text(str(port))
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    signal.sigwait({signal.SIGTERM})
    server.stop(0)


def serve_aio(port_file: str) -> None:
    import asyncio

    import grpc

    from crowdmix.protos import crowdmix_pb2 as pb
    from crowdmix.protos import crowdmix_pb2_grpc

    class Bare(crowdmix_pb2_grpc.ShufflerServicer):  # type: ignore[misc]
        async def Submit(self, request: pb.SubmitRequest, context: object) -> pb.SubmitResponse:
            return pb.SubmitResponse(
                accepted=len(request.reports) + sum(c.count for c in request.columns)
            )

    async def run() -> None:
        server = grpc.aio.server()
        crowdmix_pb2_grpc.add_ShufflerServicer_to_server(Bare(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        Path(port_file).write_text(str(port))
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await server.stop(0)

    asyncio.run(run())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--serve", choices=["sync", "aio"], help=argparse.SUPPRESS)
    ap.add_argument("--port-file", help=argparse.SUPPRESS)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--loadgen", choices=["h2load", "grpc"], default="h2load")
    args = ap.parse_args()
    if args.serve:
        (serve_sync if args.serve == "sync" else serve_aio)(args.port_file)
        return
    from shuffler_loadgen import build_payload, run_h2load, run_load

    print(f"uptime: {os.popen('uptime').read().strip()}, loadgen: {args.loadgen}")
    unary = build_payload("m", 1, 16, 64, 1, seed=1)
    bulk = build_payload("m", 1, 16, 64, 1000, seed=2)
    for kind in ("sync", "aio"):
        with tempfile.TemporaryDirectory() as tmp:
            pf = Path(tmp) / "port"
            proc = subprocess.Popen(
                [sys.executable, __file__, "--serve", kind, "--port-file", str(pf)]
            )
            while not pf.exists() or not pf.read_text():
                time.sleep(0.05)
            target = [f"127.0.0.1:{pf.read_text()}"]
            try:
                if args.loadgen == "h2load":
                    r = run_h2load(target, unary, 1, callers=64, duration=args.duration)
                else:
                    r = run_load(
                        target, unary, 1, processes=2, concurrency=32, duration=args.duration
                    )
                print(
                    f"[{kind}] unary, 64 callers: {r.calls_per_s:,.0f} calls/s, "
                    f"p50 {r.pct(50):.1f} ms, p99 {r.pct(99):.1f} ms, errors {r.errors}"
                )
                if args.loadgen == "h2load":
                    r = run_h2load(target, bulk, 1000, callers=8, duration=args.duration)
                else:
                    r = run_load(
                        target, bulk, 1000, processes=2, concurrency=4, duration=args.duration
                    )
                print(
                    f"[{kind}] bulk 1000/request, 8 in flight: {r.reports_per_s:,.0f} reports/s, "
                    f"p99 {r.pct(99):.1f} ms, errors {r.errors}"
                )
            finally:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=30)


if __name__ == "__main__":
    main()
