"""``crowdmix shuffler serve``: run the shuffler daemon.

With ``--processes N`` (Redis only) the first process binds the port with
SO_REUSEPORT and starts N-1 siblings on the same port and store; the kernel
spreads connections over them. SIGTERM to the first process stops them all.

Exit codes: ``crowdmix.cli.ExitCode`` (0 stopped cleanly on SIGTERM/SIGINT: stop
accepting, flush, forward what can be forwarded; 1 bad configuration, naming the
field; 4 the listen address cannot be bound; 5 the store is unreachable).
"""

from __future__ import annotations

import argparse
from typing import Any

from crowdmix.options import add_daemon_options, add_tls_server_options

__all__ = ["register"]


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("shuffler", help="the shuffler daemon")
    sub = parser.add_subparsers(dest="shuffler_command", metavar="ACTION", required=True)
    serve = sub.add_parser(
        "serve",
        help="run the shuffler daemon",
        description="Accept reports, store them durably, release shuffled batches of at least "
        "min_batch to the aggregator. Settings: flags > [shuffler] table of --config > defaults.",
    )
    a = serve.add_argument
    add_daemon_options(serve, "shuffler")
    a("--listen", metavar="HOST:PORT", help="gRPC address (default 127.0.0.1:7400; port 0 = any)")
    a("--aggregator", metavar="HOST:PORT", help="aggregator to forward batches to")
    a("--http-port", type=int, metavar="PORT",
      help="also serve Submit and GetConfig over HTTP POST (Connect protocol, for browsers) "
      "on --listen's host; 0 = any free port")  # fmt: skip
    a("--http-allow-origin", dest="http_allow_origins", action="append", metavar="ORIGIN",
      help="a web origin (https://app.example) whose pages may call the HTTP port (CORS); "
      "repeat for several, '*' for any")  # fmt: skip
    add_tls_server_options(serve)
    a("--aggregator-ca", metavar="FILE", help="CA of the aggregator's certificate (TLS)")
    a("--aggregator-cert", metavar="FILE", help="client certificate for mTLS to the aggregator")
    a("--aggregator-key", metavar="FILE", help="key of --aggregator-cert")
    a("--tokens", dest="tokens_file", metavar="FILE", help="bearer tokens, one a line (required)")
    # default None, not False: an absent switch must not override the [shuffler] table
    a("--allow-unauthenticated", action="store_true", default=None,
      help="serve without --tokens (or with the placeholder token of tokens.example.txt): "
      "anyone who reaches the port can submit reports")  # fmt: skip
    a("--public-keys", metavar="FILE",
      help="the aggregator's public key config (crowdmix keys export): take sealed reports "
      "only and serve the keys in GetConfig; re-read when it changes. Omit: plaintext")  # fmt: skip
    a("--rounds-file", metavar="FILE",
      help="the round file of heavy-hitter discoveries (crowdmix discover writes it): "
      "GetConfig serves each window's round; re-read when it changes")  # fmt: skip
    a("--max-request-bytes", type=int, metavar="N")
    a("--max-reports-per-request", type=int, metavar="N")
    a("--rate-limit", dest="rate_limit_reports", type=float, metavar="REPORTS_PER_S",
      help="per connection; 0 = unlimited")  # fmt: skip
    a("--max-buffered", dest="max_buffered_reports", type=int, metavar="N")
    a("--max-concurrent-rpcs", type=int, metavar="N",
      help="calls served at once; more are refused RESOURCE_EXHAUSTED (default 4096)")  # fmt: skip
    a("--commit-delay-ms", dest="commit_max_delay_ms", type=float, metavar="MS",
      help="how long a store write waits for more requests (default 1)")  # fmt: skip
    a("--window-tolerance", type=int, metavar="N",
      help="take reports of the current window and the N before it (default 1)")  # fmt: skip
    a("--max-clock-skew", dest="max_clock_skew_seconds", type=float, metavar="SECONDS",
      help="take reports of the window of now + SECONDS: how far ahead a device's "
      "clock may run (default 60; less than the collection window)")  # fmt: skip
    a("--processes", type=int, default=1, metavar="N",
      help="serve from N processes sharing the port (SO_REUSEPORT) and the Redis store; "
      "one per core: a single Python process is bound by its GIL")  # fmt: skip
    a("--reuse-port", action="store_true", default=None, help=argparse.SUPPRESS)
    serve.set_defaults(func=_serve)


#: a shuffler without the aggregator's public keys: said at every start, in a WARNING
PLAINTEXT_WARNING = (
    "no --public-keys: this shuffler takes clear reports only (it sees what each device "
    "reported) and says so in GetConfig; SDKs that require sealing (the default) send it "
    "nothing. Give --public-keys FILE (crowdmix keys export) unless plaintext is intended"
)

# dest -> flag, to start sibling processes with the same settings
_FLAGS = {
    "redis": "--redis", "min_replicas_ack": "--min-replicas-ack",
    "aggregator": "--aggregator", "tls_cert": "--tls-cert",
    "tls_key": "--tls-key", "tls_client_ca": "--tls-client-ca",
    "aggregator_ca": "--aggregator-ca", "aggregator_cert": "--aggregator-cert",
    "aggregator_key": "--aggregator-key", "tokens_file": "--tokens",
    "max_request_bytes": "--max-request-bytes",
    "max_reports_per_request": "--max-reports-per-request",
    "rate_limit_reports": "--rate-limit", "max_buffered_reports": "--max-buffered",
    "max_concurrent_rpcs": "--max-concurrent-rpcs",
    "commit_max_delay_ms": "--commit-delay-ms",
    "shutdown_grace_seconds": "--grace", "public_keys": "--public-keys",
    "rounds_file": "--rounds-file",
    "window_tolerance": "--window-tolerance", "max_clock_skew_seconds": "--max-clock-skew",
}  # fmt: skip
_SWITCHES = {"allow_unauthenticated": "--allow-unauthenticated"}


def _serve(args: argparse.Namespace) -> int:
    import dataclasses
    import signal
    import subprocess
    import sys

    from crowdmix.cli import CliError
    from crowdmix.options import (
        configure_logging,
        grpc_bind_noise_hidden,
        wait_for_stop_signal,
        write_port_file,
    )
    from crowdmix.shuffler.config import ShufflerSettings, load_config
    from crowdmix.shuffler.memory_store import MemoryStore
    from crowdmix.shuffler.redis_store import RedisStore
    from crowdmix.shuffler.server import start_shuffler
    from crowdmix.shuffler.store import ShufflerStore

    log = configure_logging("shuffler", args.log_level, args.log_format)
    fields = {f.name for f in dataclasses.fields(ShufflerSettings)}  # those with a flag override
    registry, settings = load_config(
        args.config, {k: v for k, v in vars(args).items() if k in fields}
    )
    if settings.tokens_file is None and not settings.allow_unauthenticated:
        raise CliError(
            "no --tokens FILE: the shuffler would accept reports from anyone who reaches it; "
            "give --tokens (or tokens_file in [shuffler]), or --allow-unauthenticated "
            "(or allow_unauthenticated = true in [shuffler])"
        )
    if settings.tokens_file is None:
        log.warning("allow_unauthenticated: no bearer token is asked of senders")
    if settings.public_keys is None:
        log.warning(PLAINTEXT_WARNING)
    if args.processes < 1:
        raise CliError(f"--processes must be at least 1, got {args.processes}")
    if args.processes > 1:
        if settings.redis is None:
            raise CliError("--processes > 1 needs --redis: the processes share one store")
        settings = dataclasses.replace(settings, reuse_port=True)
    store: ShufflerStore
    if settings.redis is not None:
        store = RedisStore(settings.redis, min_replicas_ack=settings.min_replicas_ack)
    else:
        store = MemoryStore()
        log.warning("in-memory store: acknowledged reports do not survive a crash (use --redis)")
    with grpc_bind_noise_hidden():
        handle = start_shuffler(
            registry,
            store,
            settings.aggregator,
            listen=settings.listen,
            settings=settings,
            owns_store=True,
        )
    siblings = [
        subprocess.Popen(_sibling_args(args, settings.listen, handle.port))
        for _ in range(args.processes - 1)
    ]
    write_port_file(settings.port_file, handle.port)
    print(f"shuffler listening on port {handle.port}", file=sys.stderr, flush=True)
    if handle.http_port is not None:
        print(f"shuffler HTTP port {handle.http_port}", file=sys.stderr, flush=True)
    if handle.metrics_port is not None:
        log.info("metrics on http://127.0.0.1:%d/metrics", handle.metrics_port)

    wait_for_stop_signal(log)
    for child in siblings:
        child.send_signal(signal.SIGTERM)
    handle.stop()
    codes = [child.wait() for child in siblings]
    return max([0, *codes])


def _sibling_args(args: argparse.Namespace, listen: str, port: int) -> list[str]:
    """The command line of a sibling process: same settings, the bound port, no files
    or ports of its own (the first process writes the port file and serves metrics)."""
    import sys

    host = listen.rpartition(":")[0]
    out = [sys.executable, "-m", "crowdmix", "shuffler", "serve", "--config", args.config]
    for dest, flag in _FLAGS.items():
        value = getattr(args, dest)
        if value is not None:
            out += [flag, str(value)]
    out += [flag for dest, flag in _SWITCHES.items() if getattr(args, dest)]
    return [
        *out,
        *("--listen", f"{host}:{port}", "--reuse-port"),
        *("--log-level", args.log_level, "--log-format", args.log_format),
    ]
