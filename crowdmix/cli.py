"""The ``crowdmix`` command.

Each subcommand lives in the package that owns it and exposes
``register(subparsers)``, which adds its parser and sets ``func`` (a callable
taking the parsed namespace and returning the exit code). Command modules
import only argparse at module level, so ``crowdmix --help`` stays fast; heavy
imports happen inside ``func``.

Exit codes are defined once, in :class:`ExitCode`. Components raise their own
domain errors; :func:`main` is the one place that maps them to a message and an
exit code (``_FAILURES``); shared flags and helpers live in ``crowdmix.options``.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import os
import sys
from collections.abc import Sequence

from crowdmix import __version__

__all__ = ["COMMAND_EXTRAS", "EXTRA_FOR", "CliError", "ExitCode", "main"]


class ExitCode(enum.IntEnum):
    """Every exit code of ``crowdmix``, numbered so supervisors can tell causes apart."""

    OK = 0  # done; a daemon stopped cleanly on SIGTERM / SIGINT
    FAILURE = 1  # the one-line message says what to fix (a file, a flag, a config field)
    USAGE = 2  # the command line itself is malformed (argparse's usage message)
    MISSING_EXTRA = 3  # an optional dependency is missing: the message names the extra
    BIND = 4  # a daemon cannot listen on the requested address
    STORE = 5  # a daemon's store is unreachable at start-up
    INTERRUPTED = 130  # Ctrl-C


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
    "crowdmix.discover",
    "crowdmix.counts",
    "crowdmix.keys",
    "crowdmix.config_cmd",
    "crowdmix.cluster",
)


class CliError(Exception):
    """A problem the user can fix; printed as ``crowdmix: error: <message>``, exit 1."""


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


def _failures() -> list[tuple[tuple[type[BaseException], ...], ExitCode]]:
    """Domain errors a command may let through, and the exit code each means. The
    message is the error's own (components write them for the user). Imported
    when an error happens: ``shuffler`` loads numpy, which ``crowdmix info`` and
    ``--help`` must not need."""
    from crowdmix.client.errors import ParamsError
    from crowdmix.core.registry import RegistryError

    table: list[tuple[tuple[type[BaseException], ...], ExitCode]] = [
        ((CliError, ParamsError, RegistryError), ExitCode.FAILURE)
    ]
    with contextlib.suppress(ImportError):  # an SDK-only install has no daemons
        import crowdmix.aggregator.errors
        import crowdmix.shuffler.errors

        table[:0] = [
            (
                (crowdmix.shuffler.errors.BindError, crowdmix.aggregator.errors.BindError),
                ExitCode.BIND,
            ),
            (
                (
                    crowdmix.shuffler.errors.StoreUnavailable,
                    crowdmix.aggregator.errors.StoreUnavailable,
                ),
                ExitCode.STORE,
            ),
            (
                (
                    crowdmix.shuffler.errors.ConfigError,
                    crowdmix.aggregator.errors.ConfigError,
                    crowdmix.aggregator.errors.ParamsConflict,
                ),
                ExitCode.FAILURE,
            ),
        ]
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return ExitCode.USAGE
    try:
        return int(func(args))
    except ModuleNotFoundError as exc:
        return _failure(exc, command=args.command)
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`crowdmix ... | head`): not an error of ours. Point
        # stdout at /dev/null so the interpreter's final flush cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return ExitCode.OK
    except Exception as exc:
        return _failure(exc)


def _failure(exc: Exception, *, command: str | None = None) -> ExitCode:
    """The one place that turns an error into one line on stderr and an exit code."""
    for kinds, code in _failures():
        if isinstance(exc, kinds):
            prefix = "store unavailable: " if code is ExitCode.STORE else ""
            print(f"crowdmix: error: {prefix}{exc}", file=sys.stderr)
            return code
    if isinstance(exc, ModuleNotFoundError):
        package = (exc.name or "").split(".")[0]
        if package in EXTRA_FOR:
            # everything the command needs at once: naming only the package that was
            # missing first sends the user round ([sim], then [aggregator], ...)
            extras = COMMAND_EXTRAS.get(command or "") or EXTRA_FOR[package]
            what = f"crowdmix {command}" if command in COMMAND_EXTRAS else "this command"
            print(
                f"crowdmix: error: {what} needs crowdmix[{extras}] (the '{package}' package "
                f"is missing): pip install 'crowdmix[{extras}]'",
                file=sys.stderr,
            )
            return ExitCode.MISSING_EXTRA
    if os.environ.get("CROWDMIX_DEBUG"):
        raise exc
    if isinstance(exc, OSError):  # last resort: a file or socket the command did not check
        where = f" {exc.filename}" if exc.filename else ""
        print(f"crowdmix: error: cannot use{where}: {exc.strerror or exc}", file=sys.stderr)
    else:  # last resort: one line, never a traceback for the user
        print(
            f"crowdmix: error: unexpected {type(exc).__name__}: {exc} "
            "(set CROWDMIX_DEBUG=1 to see where)",
            file=sys.stderr,
        )
    return ExitCode.FAILURE


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
    "hiredis": "shuffler",
    "prometheus_client": "shuffler",
    "grpc_health": "shuffler",
    "hypercorn": "shuffler",
    "scipy": "aggregator",
    "sklearn": "aggregator",
    "matplotlib": "aggregator",
    "dp_accounting": "aggregator",
    "threadpoolctl": "aggregator",
    "wordfreq": "words",
}


# The extras each command needs, all of them (pyproject's optional dependencies): a
# missing package is answered with the whole list for the command.
COMMAND_EXTRAS = {
    "demo": "shuffler,aggregator",
    "health": "shuffler",
    "aggregator": "aggregator",
    "shuffler": "shuffler",
    "simulate": "sim,transport",
    "privacy": "aggregator",
    "plan": "aggregator",
    "report": "aggregator",
    "discover": "aggregator",
    "counts": "aggregator",
    "keys": "transport",
    "cluster": "shuffler,aggregator",
    "config": "transport",
}


if __name__ == "__main__":
    sys.exit(main())
