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
    p.add_argument("--tls-cert", help="client certificate (PEM) for a daemon that requires one")
    p.add_argument("--tls-key", help="key of --tls-cert (PEM)")
    p.set_defaults(func=run)


def check_health(
    target: str,
    *,
    service: str = "",
    timeout: float = 3.0,
    tls_ca: bytes | None = None,
    tls_cert: bytes | None = None,
    tls_key: bytes | None = None,
) -> str:
    """The serving status name (e.g. "SERVING"), or "UNREACHABLE: <reason>".

    ``tls_cert``/``tls_key`` present a client certificate (mutual TLS, as the
    aggregator asks of its shufflers)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    if tls_ca is not None:
        creds = grpc.ssl_channel_credentials(
            root_certificates=tls_ca, private_key=tls_key, certificate_chain=tls_cert
        )
        channel = grpc.secure_channel(target, creds)
    else:
        channel = grpc.insecure_channel(target)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            resp = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as exc:
            return f"UNREACHABLE: {exc.code().name}"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def _read(path: str | None) -> bytes | None:
    from crowdmix.options import read_input

    return None if path is None else read_input(path, "file")


def run(args: argparse.Namespace) -> int:
    from crowdmix.cli import CliError

    if (args.tls_cert is None) != (args.tls_key is None):
        raise CliError("--tls-cert and --tls-key go together")
    if args.tls_cert is not None and args.tls_ca is None:
        raise CliError("--tls-cert needs --tls-ca (the daemon speaks TLS)")
    status = check_health(
        args.target,
        service=args.service,
        timeout=args.timeout,
        tls_ca=_read(args.tls_ca),
        tls_cert=_read(args.tls_cert),
        tls_key=_read(args.tls_key),
    )
    if status.startswith("UNREACHABLE"):
        reason = status.partition(": ")[2]
        raise CliError(f"{args.target} is unreachable ({reason})")
    print(f"{args.target}: {status}")
    return 0 if status == "SERVING" else 1
