"""What several commands share: their RAPPOR flags, TLS files, logging, metrics
address, port file and the loop that runs a daemon until SIGTERM, plus the
checks on files the user names. Written once here, used by every command.

Only argparse and the standard library load at import time, so ``crowdmix
--help`` stays fast; everything returns plain values or raises ``CliError``.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from crowdmix.cli import CliError

__all__ = [
    "JsonLogFormatter",
    "add_daemon_options",
    "add_rappor_options",
    "add_tls_server_options",
    "configure_logging",
    "grpc_bind_noise_hidden",
    "out_dir",
    "plural",
    "positive_count",
    "rappor_params",
    "read_input",
    "read_token_file",
    "wait_for_stop_signal",
    "write_port_file",
]


def positive_count(text: str) -> int:
    """An argparse type: a positive count, also written like 1e8."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value.is_integer() or value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number, got {text!r}")
    return int(value)


def plural(n: int, word: str, words: str | None = None) -> str:
    """``"1 report"``, ``"2,000 reports"``: a count with its noun in the right number."""
    return f"{n:,} {word if n == 1 else (words or word + 's')}"


def read_input(path: str, what: str) -> bytes:
    """The bytes of a file the user named, or CliError naming it (missing, a directory...)."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise CliError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


def read_token_file(path: str) -> str:
    """The last token in a tokens file (``NAME TOKEN`` lines, ``#`` comments, or a bare
    token), as ``crowdmix shuffler serve --tokens`` reads it; CliError when it has none."""
    text = read_input(path, "--token-file").decode(errors="replace")
    lines = [ln.split()[-1] for ln in text.splitlines() if ln.strip() and not ln.startswith("#")]
    if not lines:
        raise CliError(f"{path} holds no token")
    return lines[-1]


def out_dir(path: str) -> Path:
    """An output directory, created if needed; CliError if it cannot be (checked before work)."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {path} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(
            f"cannot create the output directory {path}: {exc.strerror or exc}"
        ) from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise CliError(f"cannot write into the output directory {path}")
    return out


def add_rappor_options(
    parser: argparse.ArgumentParser | Any,
    *,
    k: int,
    h: int = 2,
    m: int | None,
    f: float,
    p: float,
    q: float,
) -> None:
    """``-k --hashes [--cohorts] -f -p -q`` with these defaults (``m=None``: no cohorts flag)."""
    parser.add_argument("-k", type=int, default=k, help=f"Bloom filter bits (default {k})")
    parser.add_argument("--hashes", type=int, default=h, help=f"hash functions h (default {h})")
    if m is not None:
        parser.add_argument("--cohorts", type=int, default=m, help=f"cohorts m (default {m})")
    parser.add_argument("-f", type=float, default=f, help=f"PRR noise f (default {f})")
    parser.add_argument("-p", type=float, default=p, help=f"IRR P(1|0) (default {p})")
    parser.add_argument("-q", type=float, default=q, help=f"IRR P(1|1) (default {q})")


def rappor_params(args: argparse.Namespace) -> Any:
    """The ``client.RapporParams`` of ``add_rappor_options``' flags; CliError if invalid."""
    from crowdmix.client.errors import ParamsError
    from crowdmix.core.params import RapporParams

    extra = {"m": args.cohorts} if hasattr(args, "cohorts") else {}
    try:
        return RapporParams(k=args.k, h=args.hashes, f=args.f, p=args.p, q=args.q, **extra)
    except ParamsError as exc:
        raise CliError(str(exc)) from None


def add_tls_server_options(parser: argparse.ArgumentParser | Any) -> None:
    parser.add_argument("--tls-cert", metavar="FILE", help="serve TLS with this certificate (PEM)")
    parser.add_argument("--tls-key", metavar="FILE", help="private key for --tls-cert (PEM)")
    parser.add_argument(
        "--tls-client-ca", metavar="FILE", help="require client certificates from this CA: mTLS"
    )


def add_daemon_options(parser: argparse.ArgumentParser | Any, table: str) -> None:
    """What both daemons take: ``--config`` (the registry, with its ``[table]`` of
    settings), ``--redis --min-replicas-ack --grace --metrics-port --metrics-host
    --port-file --log-level --log-format`` (None: not given)."""
    parser.add_argument(
        "--config",
        required=True,
        metavar="FILE",
        help=f"metric registry TOML (+ optional [{table}])",
    )
    parser.add_argument(
        "--redis",
        metavar="URL",
        help="Redis URL (default: in memory, lost at exit); a Redis Cluster: "
        "redis+cluster://HOST:PORT[,HOST:PORT...]",
    )
    parser.add_argument(
        "--min-replicas-ack",
        type=int,
        metavar="N",
        help="acknowledge only once N replicas have the write (Redis WAIT; default 0: off)",
    )
    parser.add_argument(
        "--grace",
        dest="shutdown_grace_seconds",
        type=float,
        metavar="SECONDS",
        help="seconds to drain on SIGTERM (default 10)",
    )
    parser.add_argument(
        "--metrics-port", type=int, metavar="PORT", help="serve Prometheus /metrics"
    )
    parser.add_argument(
        "--metrics-host",
        metavar="HOST",
        help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 in a container)",
    )
    parser.add_argument(
        "--port-file", metavar="FILE", help="write the bound gRPC port here once listening"
    )
    parser.add_argument(
        "--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"]
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="text (default) or json: one JSON object a line, for a log collector",
    )


class JsonLogFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601), ``component``, ``level``,
    ``logger``, ``message`` and, for an exception, ``exception``."""

    def __init__(self, component: str) -> None:
        super().__init__()
        self._component = component

    def format(self, record: logging.LogRecord) -> str:
        import datetime
        import json

        out = {
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(
                timespec="milliseconds"
            ),
            "component": self._component,
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False)


def configure_logging(component: str, level: str = "INFO", fmt: str = "text") -> logging.Logger:
    """One log format for every daemon: time, component, level, message (``fmt``
    "text"), or the same fields as one JSON object a line (``fmt`` "json")."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonLogFormatter(component))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s {component} %(levelname)s %(name)s: %(message)s")
        )
    logging.basicConfig(level=level, handlers=[handler])
    return logging.getLogger(f"crowdmix.{component}")


def write_port_file(path: str | None, port: int) -> None:
    """Write the bound port atomically: a reader never sees a half-written file."""
    if path is None:
        return
    tmp = f"{path}.tmp{os.getpid()}"
    Path(tmp).write_text(f"{port}\n")
    os.replace(tmp, path)


def wait_for_stop_signal(log: logging.Logger) -> None:
    """Block until SIGTERM or SIGINT (a daemon's main loop); then return to shut down."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("received %s, shutting down", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not stop.wait(0.5):
        pass


_C_CORE_BIND_LOG = re.compile(r"^[EWID]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ add_port\.cc:")


@contextlib.contextmanager
def grpc_bind_noise_hidden() -> Iterator[None]:
    """Hide gRPC C-core's log line of a failed bind (``E1123 ... add_port.cc:83] ...``).

    gRPC writes it to file descriptor 2 itself, before Python sees the failure, and
    our own one-line error already says what happened. Everything else written to
    stderr meanwhile is passed on unchanged.
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            kept = [
                line
                for line in capture.read().decode(errors="replace").splitlines(keepends=True)
                if not _C_CORE_BIND_LOG.match(line)
            ]
            if kept:
                sys.stderr.write("".join(kept))
                sys.stderr.flush()
