"""``crowdmix aggregator serve``: run the aggregator daemon until SIGTERM.

    crowdmix aggregator serve --config metrics.toml [--redis URL]
        [--listen HOST:PORT] [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]
        [--metrics-port N] [--port-file FILE] [--workers N]
        [--keys PRIVATE-KEYS [--open-workers N]]

Without ``--redis`` counts live in memory (lost at exit). ``--port-file``
receives the bound port once the server listens (useful with ``--listen
127.0.0.1:0``). Exit codes are listed in :mod:`aggregator.daemon.server`.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["load_config_registry", "register"]


def register(sub: Any) -> None:
    p = sub.add_parser("aggregator", help="the aggregator daemon (ingest shuffled batches)")
    asub = p.add_subparsers(dest="aggregator_command", metavar="COMMAND", required=True)
    s = asub.add_parser("serve", help="serve Aggregator.Ingest until SIGTERM")
    s.add_argument("--config", required=True, metavar="FILE", help="metric registry (TOML)")
    s.add_argument(
        "--redis", metavar="URL", help="Redis URL for counts (default: in memory, lost at exit)"
    )
    s.add_argument(
        "--listen", default="127.0.0.1:7500", metavar="HOST:PORT", help="(default %(default)s)"
    )
    s.add_argument("--tls-cert", metavar="FILE", help="server certificate (PEM); enables TLS")
    s.add_argument("--tls-key", metavar="FILE", help="server private key (PEM)")
    s.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="CA (PEM) that client certificates must chain to: mTLS",
    )
    s.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve Prometheus metrics on this port"
    )
    s.add_argument(
        "--metrics-host",
        default="127.0.0.1",
        metavar="HOST",
        help="address for --metrics-port (%(default)s)",
    )
    s.add_argument(
        "--port-file", metavar="FILE", help="write the bound gRPC port here once listening"
    )
    s.add_argument(
        "--workers", type=int, default=8, metavar="N", help="Ingest threads (default %(default)s)"
    )
    s.add_argument(
        "--keys",
        metavar="FILE",
        help="private key file (crowdmix keys new, mode 0600): open sealed batches; "
        "re-read when it changes",
    )
    s.add_argument(
        "--open-workers",
        type=int,
        default=0,
        metavar="N",
        help="processes opening sealed reports (0: in the Ingest threads; default %(default)s)",
    )
    s.add_argument(
        "--grace",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds to drain on SIGTERM (%(default)s)",
    )
    s.set_defaults(func=serve)


def _read(path: str, what: str) -> bytes:
    from crowdmix.cli import CliError

    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CliError(f"cannot read {what} {path}: {exc.strerror}") from None


def load_config_registry(path: str) -> Any:
    """The metric registry of a config file shared with the shuffler.

    The shuffler's own ``[shuffler]`` table (and an ``[aggregator]`` table, kept
    for symmetry) may sit in the same file; they are daemon settings, not metrics.
    """
    from client.registry import RegistryError, load_registry
    from crowdmix.cli import CliError

    try:
        return load_registry(path)
    except RegistryError as exc:
        raise CliError(str(exc)) from None


def serve(args: argparse.Namespace) -> int:
    import logging

    from aggregator.daemon.server import (
        EXIT_BIND,
        EXIT_STORE,
        AggregatorServer,
        BindError,
        TlsFiles,
    )
    from aggregator.store.base import StoreUnavailable, open_store
    from crowdmix.cli import CliError, grpc_bind_noise_hidden

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s aggregator %(levelname)s %(message)s"
    )
    log = logging.getLogger("crowdmix.aggregator")
    registry = load_config_registry(args.config)
    if (args.tls_cert is None) != (args.tls_key is None):
        raise CliError("--tls-cert and --tls-key go together")
    if args.tls_client_ca and not args.tls_cert:
        raise CliError("--tls-client-ca needs --tls-cert and --tls-key")
    if args.workers < 1:
        raise CliError(f"--workers must be positive, got {args.workers}")
    if args.open_workers < 0:
        raise CliError(f"--open-workers must be >= 0, got {args.open_workers}")
    if args.keys is not None:
        from aggregator.sealing.keys import KeySetError, load_keyset

        try:
            load_keyset(args.keys)  # fail now with one line, not at the first batch
        except KeySetError as exc:
            raise CliError(str(exc)) from None
    tls = None
    if args.tls_cert:
        tls = TlsFiles(
            cert=_read(args.tls_cert, "TLS certificate"),
            key=_read(args.tls_key, "TLS key"),
            client_ca=_read(args.tls_client_ca, "client CA") if args.tls_client_ca else None,
        )
    try:
        store = open_store(args.redis)
        store.metrics()  # fail now, not at the first batch, when the store is unreachable
    except ValueError as exc:
        raise CliError(str(exc)) from None
    except StoreUnavailable as exc:
        print(f"crowdmix: error: {exc}", file=sys.stderr)
        return EXIT_STORE

    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        with grpc_bind_noise_hidden():
            server = AggregatorServer(
                registry,
                store,
                listen=args.listen,
                tls=tls,
                workers=args.workers,
                metrics_port=args.metrics_port,
                metrics_host=args.metrics_host,
                keys_file=args.keys,
                open_workers=args.open_workers,
            ).start()
    except BindError as exc:
        print(f"crowdmix: error: {exc}", file=sys.stderr)
        store.close()
        return EXIT_BIND
    if args.port_file:
        tmp = f"{args.port_file}.tmp{os.getpid()}"
        Path(tmp).write_text(f"{server.port}\n")
        os.replace(tmp, args.port_file)  # readers never see a half-written file
    metrics_note = f", metrics on :{server.metrics_port}" if server.metrics_port else ""
    log.info(
        "serving %d metric(s), store %s%s",
        len(registry.metrics),
        "redis" if args.redis else "memory",
        metrics_note,
    )
    while not stop.wait(0.5):
        pass
    server.stop(args.grace)
    store.close()
    return 0
