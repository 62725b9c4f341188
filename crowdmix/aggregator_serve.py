"""``crowdmix aggregator serve``: run the aggregator daemon until SIGTERM.

    crowdmix aggregator serve --config metrics.toml [--redis URL]
        [--listen HOST:PORT] [--tls-cert PEM --tls-key PEM [--tls-client-ca PEM]]
        [--metrics-port N] [--port-file FILE] [--workers N]
        [--keys PRIVATE-KEYS [--open-workers N]] [--rounds-file FILE]

Settings: flags > the ``[aggregator]`` table of ``--config`` > defaults
(``crowdmix.aggregator.daemon.settings``; an unknown field stops it, naming the
field). Without ``redis`` counts live in memory, lost at exit, and the daemon
says so in a WARNING. ``--port-file`` receives the bound port once the server
listens (useful with ``--listen 127.0.0.1:0``). Exit codes: ``crowdmix.cli.ExitCode``.
"""

from __future__ import annotations

import argparse
from typing import Any

from crowdmix.options import add_daemon_options, add_tls_server_options

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("aggregator", help="the aggregator daemon (ingest shuffled batches)")
    asub = p.add_subparsers(dest="aggregator_command", metavar="COMMAND", required=True)
    s = asub.add_parser(
        "serve",
        help="serve Aggregator.Ingest until SIGTERM",
        description="Count shuffled batches exactly once. Settings: flags > [aggregator] "
        "table of --config > defaults.",
    )
    add_daemon_options(s, "aggregator")
    s.add_argument("--listen", metavar="HOST:PORT", help="(default 127.0.0.1:7500)")
    add_tls_server_options(s)
    s.add_argument("--workers", type=int, metavar="N", help="Ingest threads (default 8)")
    s.add_argument(
        "--keys",
        metavar="FILE",
        help="private key file (crowdmix keys new, mode 0600): open sealed batches; "
        "re-read when it changes",
    )
    s.add_argument(
        "--rounds-file",
        metavar="FILE",
        help="the round file of heavy-hitter discoveries (crowdmix discover writes it; "
        "needed with a heavy-hitters metric): each window's reports are counted against "
        "its round only; re-read when it changes",
    )
    s.add_argument(
        "--open-workers",
        type=int,
        metavar="N",
        help="processes opening sealed reports (0: in the Ingest threads; default 0)",
    )
    s.set_defaults(func=serve)


#: the in-memory store in a daemon: said at every start, in a WARNING
MEMORY_STORE_WARNING = (
    "in-memory store: counts are lost when this process exits, and the shufflers delete "
    "every batch once it is acknowledged, so nothing can recount them; give --redis URL "
    "(or redis in [aggregator]) for anything but a trial"
)


def serve(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.daemon.server import AggregatorServer, TlsFiles
    from crowdmix.aggregator.daemon.settings import FLAGS, load_config
    from crowdmix.aggregator.store import open_store
    from crowdmix.cli import CliError
    from crowdmix.options import (
        configure_logging,
        grpc_bind_noise_hidden,
        read_input,
        wait_for_stop_signal,
        write_port_file,
    )

    log = configure_logging("aggregator", args.log_level, args.log_format)
    registry, settings = load_config(args.config, {name: getattr(args, name) for name in FLAGS})
    if settings.keys is not None:
        from crowdmix.aggregator.sealing.keys import KeySetError, load_keyset

        try:
            load_keyset(settings.keys)  # fail now with one line, not at the first batch
        except KeySetError as exc:
            raise CliError(str(exc)) from None
    tls = None
    if settings.tls_cert is not None and settings.tls_key is not None:
        tls = TlsFiles(
            cert=read_input(settings.tls_cert, "TLS certificate"),
            key=read_input(settings.tls_key, "TLS key"),
            client_ca=None
            if settings.tls_client_ca is None
            else read_input(settings.tls_client_ca, "client CA"),
        )
    try:
        store = open_store(settings.redis, min_replicas_ack=settings.min_replicas_ack)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if settings.redis is None:
        log.warning(MEMORY_STORE_WARNING)
    try:
        store.metrics()  # fail now, not at the first batch, when the store is unreachable
        with grpc_bind_noise_hidden():
            server = AggregatorServer(
                registry,
                store,
                listen=settings.listen,
                tls=tls,
                workers=settings.workers,
                metrics_port=settings.metrics_port,
                metrics_host=settings.metrics_host,
                keys_file=settings.keys,
                open_workers=settings.open_workers,
                rounds_file=settings.rounds_file,
            ).start()
    except BaseException:
        store.close()
        raise
    write_port_file(settings.port_file, server.port)
    metrics_note = f", metrics on :{server.metrics_port}" if server.metrics_port else ""
    log.info(
        "serving %d metric(s) on %s, store %s%s%s",
        len(registry.metrics),
        server.target,
        "redis" if settings.redis else "memory",
        ", sealed reports (keys)" if settings.keys else "",
        metrics_note,
    )
    wait_for_stop_signal(log)
    server.stop(settings.shutdown_grace_seconds)
    store.close()
    log.info("aggregator stopped")
    return 0
