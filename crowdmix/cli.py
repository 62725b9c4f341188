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
import importlib
import sys
from collections.abc import Sequence

from crowdmix import __version__

__all__ = ["EXIT_FAILURE", "EXIT_MISSING_EXTRA", "EXIT_OK", "EXIT_USAGE", "CliError", "main"]

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
    "crowdmix.keys",
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
        extra = _EXTRA_FOR.get((exc.name or "").split(".")[0])
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
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_OK


_EXTRA_FOR = {
    "grpc": "transport",
    "google": "transport",
    "numpy": "sim",
    "redis": "shuffler",
    "prometheus_client": "shuffler",
    "grpc_health": "shuffler",
    "scipy": "aggregator",
    "sklearn": "aggregator",
    "matplotlib": "aggregator",
    "dp_accounting": "aggregator",
}


if __name__ == "__main__":
    sys.exit(main())
