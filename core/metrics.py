"""What the two daemons' Prometheus metrics share (``prometheus-client``, which only the
daemons import): the latency buckets and the /metrics endpoint of one registry.

Each server has its own ``CollectorRegistry`` so several can run in one process (the
demos, the tests) without clashing series.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

__all__ = ["LATENCY_BUCKETS", "serve_metrics", "stop_metrics"]

#: seconds, for a call's latency: 1 ms to 2.5 s
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


def serve_metrics(registry: CollectorRegistry, port: int, host: str) -> tuple[Any, int]:
    """Serve ``registry`` at http://host:port/metrics in a thread; (server, bound port:
    port 0 takes any free one). ``OSError`` when the port cannot be bound."""
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return server, int(server.server_port)


def stop_metrics(server: Any) -> None:
    """Stop a :func:`serve_metrics` server and close its socket."""
    server.shutdown()
    server.server_close()
