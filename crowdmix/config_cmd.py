"""``crowdmix config export``: a shuffler's ``GetConfig`` answer as a file an app ships.

    crowdmix config export --shuffler HOST:PORT --out crowdmix-config.pb
        [--token-file FILE | --token T] [--tls-ca FILE | --insecure]

The app passes it to ``client.Reporter(..., bundled_config=FILE)``: its first report
is then encoded (never stored as the raw value) even when the shuffler has never
been reached; the SDK fetches a fresh config as soon as it can. The file holds the
metrics' params, the collection window and the public keys — nothing secret.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

__all__ = ["export_config", "register"]


def register(sub: Any) -> None:
    config = sub.add_parser("config", help="export a shuffler's config for an app to bundle")
    csub = config.add_subparsers(dest="config_command", metavar="WHAT")
    config.set_defaults(func=lambda args: _usage(config))
    export = csub.add_parser(
        "export",
        help="write the shuffler's GetConfig answer to a file (Reporter's bundled_config)",
    )
    export.add_argument("--shuffler", required=True, metavar="HOST:PORT", help="the shuffler")
    export.add_argument("--out", required=True, metavar="FILE", help="the file to write")
    export.add_argument("--token", help="bearer token (or --token-file)")
    export.add_argument("--token-file", metavar="FILE", help="file whose last token is used")
    export.add_argument("--tls-ca", metavar="FILE", help="CA certificate (default: the system's)")
    export.add_argument("--insecure", action="store_true", help="no TLS (a local test cluster)")
    export.add_argument("--timeout", type=float, default=10.0, help="seconds (default 10)")
    export.set_defaults(func=run)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def export_config(
    target: str,
    out: str | os.PathLike[str],
    *,
    token: str | None = None,
    tls: bool = True,
    root_certificates: bytes | None = None,
    timeout: float = 10.0,
) -> Any:
    """Fetch the config of the shuffler at ``target``, check that this SDK reads it and
    write it to ``out`` (atomically, 0644); returns the ``DeviceConfig``."""
    from crowdmix.cli import CliError
    from crowdmix.client.answers import classify
    from crowdmix.client.device_config import from_proto
    from crowdmix.client.errors import CrowdmixClientError
    from crowdmix.client.link import Link, LinkError
    from crowdmix.client.target import check_target
    from crowdmix.protos import crowdmix_pb2 as pb

    try:
        check_target(target)
    except ValueError as exc:
        raise CliError(f"--shuffler: {exc}") from None
    link = Link(target, token, tls=tls, root_certificates=root_certificates, timeout=timeout)
    try:
        raw = link.get_config()
    except LinkError as exc:
        raise CliError(
            f"cannot fetch the config from {target}: {classify(exc.code, exc.details).message}"
        ) from None
    finally:
        link.close()
    try:
        config = from_proto(pb.ConfigResponse.FromString(raw))
    except CrowdmixClientError as exc:
        raise CliError(f"{target} answered a config this SDK cannot use: {exc}") from None
    path = Path(out)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(raw)
        tmp.chmod(0o644)
        tmp.replace(path)
    except OSError as exc:
        raise CliError(f"cannot write {out}: {exc.strerror or exc}") from None
    return config


def run(args: argparse.Namespace) -> int:
    from crowdmix.cli import CliError
    from crowdmix.options import read_input, read_token_file

    if args.insecure and args.tls_ca:
        raise CliError("--insecure and --tls-ca exclude each other")
    token = read_token_file(args.token_file) if args.token_file else args.token
    ca = read_input(args.tls_ca, "--tls-ca") if args.tls_ca else None
    config = export_config(
        args.shuffler,
        args.out,
        token=token,
        tls=not args.insecure,
        root_certificates=ca,
        timeout=args.timeout,
    )
    names = ", ".join(sorted(config.metrics)) or "none"
    keys = len(config.keys.keys)
    print(
        f"wrote {args.out}: metrics {names}; {keys} public key{'s' if keys != 1 else ''}; "
        f"window {config.window_seconds} s. Ship it with the app: "
        f"client.Reporter(..., bundled_config={args.out!r})"
    )
    return 0
