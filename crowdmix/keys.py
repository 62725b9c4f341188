"""``crowdmix keys``: the aggregator's HPKE key set (private file, mode 0600).

    crowdmix keys new    --file KEYS [--suite S] [--grace D] [--public OUT] [--if-missing]
    crowdmix keys list   --file KEYS [--json]
    crowdmix keys rotate --file KEYS [--suite S] [--pending D] [--grace D] [--public OUT]
    crowdmix keys retire --file KEYS --id N [--now] [--force] [--public OUT]
    crowdmix keys export --file KEYS --public OUT

Durations are seconds or a number with s/m/h/d. ``--public OUT`` (re)writes the
public key config, the only file a shuffler needs. Only argparse/stdlib at module
level; ``cryptography`` is imported when a command runs.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from typing import Any

from crowdmix.options import plural

__all__ = ["register"]

_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (seconds, or a number with s/m/h/d, e.g. 31d)"
        )
    return int(m.group(1)) * _UNITS[m.group(2)]


def _key_id(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a key id: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"key ids start at 1, got {value}")
    return value


def register(sub: Any) -> None:
    keys = sub.add_parser("keys", help="the aggregator's HPKE keys: new, list, rotate, retire")
    ksub = keys.add_subparsers(dest="keys_command", metavar="WHAT")
    keys.set_defaults(func=lambda args: _usage(keys))
    suites = ("x25519-hkdf-sha256-aes128gcm", "mlkem768x25519-hkdf-sha256-aes128gcm")

    def common(p: argparse.ArgumentParser, public: bool = True) -> None:
        p.add_argument("--file", required=True, metavar="KEYS", help="private key file (0600)")
        if public:
            p.add_argument("--public", metavar="OUT", help="also write the public key config")

    new = ksub.add_parser("new", help="create a key file with one active key")
    common(new)
    new.add_argument("--suite", choices=suites, default=suites[0], help="HPKE suite")
    new.add_argument("--grace", type=_duration, default=None, help="grace period (31d)")
    new.add_argument(
        "--if-missing",
        action="store_true",
        help="keep an existing key file (and rewrite --public from it): for start-up scripts",
    )
    new.set_defaults(func=_new)

    lst = ksub.add_parser("list", help="keys with their state and validity")
    common(lst, public=False)
    lst.add_argument("--json", action="store_true", help="print a JSON array")
    lst.set_defaults(func=_list)

    rot = ksub.add_parser("rotate", help="add a new key; the active one enters its grace period")
    common(rot)
    rot.add_argument("--suite", choices=suites, default=None, help="(that of the active key)")
    rot.add_argument("--pending", type=_duration, default=0, help="delay before it is used (0)")
    rot.add_argument("--grace", type=_duration, default=None, help="grace of the outgoing key")
    rot.set_defaults(func=_rotate)

    ret = ksub.add_parser("retire", help="end a key now (it still opens during its grace)")
    common(ret)
    ret.add_argument("--id", type=_key_id, required=True, help="key id")
    ret.add_argument(
        "--now", action="store_true", help="expire at once, no grace (a compromised key)"
    )
    ret.add_argument(
        "--force",
        action="store_true",
        help="retire the only active key although no other key replaces it (devices then "
        "have no key and wait; shufflers do not start on the public config)",
    )
    ret.set_defaults(func=_retire)

    exp = ksub.add_parser("export", help="write the public key config for shufflers")
    exp.add_argument("--file", required=True, metavar="KEYS", help="private key file (0600)")
    exp.add_argument("--public", required=True, metavar="OUT", help="public key config to write")
    exp.set_defaults(func=_export)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _guard(run: Any) -> Any:
    """Map key errors to one CLI line; a missing ``cryptography`` names the extra."""

    def wrapper(args: argparse.Namespace) -> int:
        from crowdmix.aggregator.sealing import (
            keys as _keys,
        )  # a missing extra: crowdmix.cli says which
        from crowdmix.cli import CliError

        try:
            return int(run(args, _keys, int(time.time())))
        except (_keys.KeySetError, OSError) as exc:
            message = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            where = f" ({exc.filename})" if isinstance(exc, OSError) and exc.filename else ""
            raise CliError(f"{message}{where}") from None

    return wrapper


def _publish(args: argparse.Namespace, keys: Any, ks: Any, now: int) -> None:
    if getattr(args, "public", None):
        config = keys.write_public_config(args.public, ks, now=now)
        keys_ = plural(len(config.keys), "public key")
        print(f"wrote {args.public} ({keys_}, version {config.version})")


@_guard
def _new(args: argparse.Namespace, keys: Any, now: int) -> int:
    import os

    if getattr(args, "if_missing", False) and os.path.exists(args.file):
        ks = keys.load_keyset(args.file)  # refuses a file others may read, as always
        print(f"kept {args.file} ({plural(len(ks.keys), 'key')})")
        _publish(args, keys, ks, now)
        return 0
    grace = keys.DEFAULT_GRACE_SECONDS if args.grace is None else args.grace
    ks, key = keys.KeySet().with_new_key(now, suite=args.suite, grace_seconds=grace)
    keys.save_keyset(args.file, ks, now=now, create=True)
    print(f"created {args.file} with key {key.key_id} ({key.suite}), active now")
    _publish(args, keys, ks, now)
    return 0


@_guard
def _list(args: argparse.Namespace, keys: Any, now: int) -> int:
    ks = keys.load_keyset(args.file)
    rows = [
        {
            "id": k.key_id,
            "suite": k.suite,
            "state": k.state(now),
            "not_before": k.not_before,
            "not_after": k.not_after,
            "expires": k.expires_at,
            "grace_seconds": k.grace_seconds,
        }
        for k in ks.keys
    ]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0

    def when(t: int | None) -> str:
        return "-" if t is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))

    print(f"{'id':>4}  {'state':8} {'suite':38} {'not before':20} {'not after':20} expires")
    for r in rows:
        print(
            f"{r['id']:>4}  {r['state']:8} {r['suite']:38} {when(r['not_before']):20} "
            f"{when(r['not_after']):20} {when(r['expires'])}"
        )
    return 0


@_guard
def _rotate(args: argparse.Namespace, keys: Any, now: int) -> int:
    ks = keys.load_keyset(args.file)
    ks, key = ks.rotate(
        now, suite=args.suite, pending_seconds=args.pending, grace_seconds=args.grace
    )
    keys.save_keyset(args.file, ks, now=now)
    print(f"added key {key.key_id} ({key.suite}), {key.state(now)}; earlier keys end then")
    _publish(args, keys, ks, now)
    return 0


@_guard
def _retire(args: argparse.Namespace, keys: Any, now: int) -> int:
    ks = keys.load_keyset(args.file).retire(args.id, now, immediately=args.now, force=args.force)
    keys.save_keyset(args.file, ks, now=now)
    key = ks.get(args.id)
    print(f"retired key {args.id}: {key.state(now)}")
    _publish(args, keys, ks, now)
    return 0


@_guard
def _export(args: argparse.Namespace, keys: Any, now: int) -> int:
    _publish(args, keys, keys.load_keyset(args.file), now)
    return 0
