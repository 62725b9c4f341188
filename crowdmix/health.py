"""``crowdmix health``: ask a daemon's standard gRPC health service if it is serving.

Exit 0 when SERVING, 1 otherwise: usable as a container healthcheck and by the
local-cluster launcher.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["check_health", "register"]


def register(sub: Any) -> None:
    p = sub.add_parser("health", help="check a shuffler's or aggregator's gRPC health service")
    p.add_argument("target", help="HOST:PORT of the daemon")
    p.add_argument("--service", default="", help="service name to ask about (default: overall)")
    p.add_argument("--timeout", type=float, default=3.0, help="seconds to wait (default 3)")
    p.add_argument("--tls-ca", help="CA certificate (PEM) when the daemon speaks TLS")
    p.set_defaults(func=run)


def check_health(
    target: str, *, service: str = "", timeout: float = 3.0, tls_ca: bytes | None = None
) -> str:
    """The serving status name (e.g. "SERVING"), or "UNREACHABLE: <reason>"."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if tls_ca is not None:
        channel = grpc.secure_channel(
            target, grpc.ssl_channel_credentials(root_certificates=tls_ca)
        )
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return f"UNREACHABLE: {exc.code().name}"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def run(args: argparse.Namespace) -> int:
    ca = None
    if args.tls_ca:
        with open(args.tls_ca, "rb") as fh:
            ca = fh.read()
    status = check_health(args.target, service=args.service, timeout=args.timeout, tls_ca=ca)
    print(f"{args.target}: {status}")
    return 0 if status == "SERVING" else 1
