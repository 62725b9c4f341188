"""``crowdmix aggregator serve``: run the aggregator daemon until SIGTERM.

    crowdmix aggregator serve --config metrics.toml [--redis URL]
        [--listen HOST:PORT] [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]
        [--metrics-port N] [--port-file FILE] [--workers N]
        [--keys PRIVATE-KEYS [--open-workers N]]

Without ``--redis`` counts live in memory (lost at exit). ``--port-file``
receives the bound port once the server listens (useful with ``--listen
127.0.0.1:0``). Exit codes: ``crowdmix.cli.ExitCode``.
"""

from __future__ import annotations

import argparse
from typing import Any

from crowdmix.options import add_daemon_options, add_tls_server_options

__all__ = ["load_config_registry", "register"]


def register(sub: Any) -> None:
    p = sub.add_parser("aggregator", help="the aggregator daemon (ingest shuffled batches)")
    asub = p.add_subparsers(dest="aggregator_command", metavar="COMMAND", required=True)
    s = asub.add_parser("serve", help="serve Aggregator.Ingest until SIGTERM")
    s.add_argument("--config", required=True, metavar="FILE", help="metric registry (TOML)")
    s.add_argument(
        "--redis",
        metavar="URL",
        help="Redis URL for counts (default: in memory, lost at exit); a Redis Cluster: "
        "redis+cluster://HOST:PORT[,HOST:PORT...]",
    )
    s.add_argument(
        "--min-replicas-ack",
        type=int,
        default=0,
        metavar="N",
        help="acknowledge a batch only once N replicas have its counts (Redis WAIT; "
        "default 0: off)",
    )
    s.add_argument(
        "--listen", default="127.0.0.1:7500", metavar="HOST:PORT", help="(default %(default)s)"
    )
    add_tls_server_options(s)
    add_daemon_options(s)
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


def load_config_registry(path: str) -> Any:
    """The metric registry of a config file shared with the shuffler.

    The shuffler's own ``[shuffler]`` table (and an ``[aggregator]`` table, kept
    for symmetry) may sit in the same file; they are daemon settings, not metrics.
    ``RegistryError`` names the file and field (the command line prints it).
    """
    from crowdmix.core.registry import load_registry

    return load_registry(path)


def serve(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.daemon.server import AggregatorServer, TlsFiles
    from crowdmix.aggregator.store import open_store
    from crowdmix.cli import CliError
    from crowdmix.options import (
        configure_logging,
        grpc_bind_noise_hidden,
        server_tls,
        wait_for_stop_signal,
        write_port_file,
    )

    log = configure_logging("aggregator", args.log_level)
    registry = load_config_registry(args.config)
    if args.workers < 1:
        raise CliError(f"--workers must be positive, got {args.workers}")
    if args.open_workers < 0:
        raise CliError(f"--open-workers must be >= 0, got {args.open_workers}")
    if args.keys is not None:
        from crowdmix.aggregator.sealing.keys import KeySetError, load_keyset

        try:
            load_keyset(args.keys)  # fail now with one line, not at the first batch
        except KeySetError as exc:
            raise CliError(str(exc)) from None
    files = server_tls(args)
    tls = (
        None
        if files is None
        else TlsFiles(cert=files.cert, key=files.key, client_ca=files.client_ca)
    )
    if args.min_replicas_ack < 0:
        raise CliError(f"--min-replicas-ack must be >= 0, got {args.min_replicas_ack}")
    try:
        store = open_store(args.redis, min_replicas_ack=args.min_replicas_ack)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        store.metrics()  # fail now, not at the first batch, when the store is unreachable
        with grpc_bind_noise_hidden():
            server = AggregatorServer(
                registry,
                store,
                listen=args.listen,
                tls=tls,
                workers=args.workers,
                metrics_port=args.metrics_port,
                metrics_host=args.metrics_host or "127.0.0.1",
                keys_file=args.keys,
                open_workers=args.open_workers,
            ).start()
    except BaseException:
        store.close()
        raise
    write_port_file(args.port_file, server.port)
    metrics_note = f", metrics on :{server.metrics_port}" if server.metrics_port else ""
    log.info(
        "serving %d metric(s), store %s%s",
        len(registry.metrics),
        "redis" if args.redis else "memory",
        metrics_note,
    )
    wait_for_stop_signal(log)
    server.stop(args.grace)
    store.close()
    log.info("aggregator stopped")
    return 0
