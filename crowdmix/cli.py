"""The ``crowdmix`` command.

Each subcommand lives in the package that owns it and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (a callable
taking the parsed namespace and returning the exit code). Command modules
import only argparse at module level, so ``crowdmix --help`` stays fast; heavy
imports happen inside ``func``.

Exit codes: 0 ok, 1 failure (the message says why), 2 usage error,
3 a missing optional dependency (the message names the extra to install).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from crowdmix import __version__

__all__ = [
    "EXIT_FAILURE",
    "EXIT_MISSING_EXTRA",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXTRA_FOR",
    "CliError",
    "grpc_bind_noise_hidden",
    "main",
    "out_dir",
    "read_input",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_MISSING_EXTRA = 3

# name -> module providing register(subparsers); order is the order in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "crowdmix.demo",
    "crowdmix.info",
    "crowdmix.health",
    "crowdmix.aggregator_serve",
    "crowdmix.shuffler_serve",
    "crowdmix.simulate",
    "crowdmix.privacy",
    "crowdmix.report",
    "crowdmix.counts",
    "crowdmix.keys",
    "crowdmix.cluster",
)


class CliError(Exception):
    """A problem the user can fix; printed as ``crowdmix: error: <message>``, exit 1."""


def read_input(path: str, what: str) -> bytes:
    """The bytes of a file the user named, or CliError naming it (missing, a directory...)."""
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise CliError(f"cannot read {what} {path}: {exc.strerror or exc}") from None


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="crowdmix",
        description="Private usage statistics: encode on devices, shuffle, aggregate, report.",
    )
    parser.add_argument("--version", action="version", version=f"crowdmix {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        return int(func(args))
    except CliError as exc:
        print(f"crowdmix: error: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except ModuleNotFoundError as exc:
        extra = EXTRA_FOR.get((exc.name or "").split(".")[0])
        if extra is None:
            raise
        print(
            f"crowdmix: error: this command needs the '{exc.name}' package: "
            f"pip install 'crowdmix[{extra}]'",
            file=sys.stderr,
        )
        return EXIT_MISSING_EXTRA
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader went away (`crowdmix ... | head`): not an error of ours. Point
        # stdout at /dev/null so the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK
    except OSError as exc:  # last resort: a file or socket the command did not check
        where = f" {exc.filename}" if exc.filename else ""
        print(f"crowdmix: error: cannot use{where}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_FAILURE
    except Exception as exc:  # last resort: one line, never a traceback for the user
        if os.environ.get("CROWDMIX_DEBUG"):
            raise
        print(
            f"crowdmix: error: unexpected {type(exc).__name__}: {exc} "
            "(set CROWDMIX_DEBUG=1 to see where)",
            file=sys.stderr,
        )
        return EXIT_FAILURE


# Which extra installs each optional third-party package: the message for a
# missing one names it, and this is the one list of packages that library code
# may import lazily (inside a function) so that a module loads without them
# (tests/test_layers.py holds every module to it).
EXTRA_FOR = {
    "grpc": "transport",
    "cryptography": "transport",
    "google": "transport",
    "numpy": "sim",
    "redis": "shuffler",
    "prometheus_client": "shuffler",
    "grpc_health": "shuffler",
    "scipy": "aggregator",
    "sklearn": "aggregator",
    "matplotlib": "aggregator",
    "dp_accounting": "aggregator",
    "threadpoolctl": "aggregator",
}


if __name__ == "__main__":
    sys.exit(main())
