"""``crowdmix counts list|export``: what the aggregator's store holds, and a counts file of it.

    crowdmix counts list   --redis URL [--json]
    crowdmix counts export --redis URL --metric NAME [--windows LIST] --out FILE

``list`` shows every stored metric with its encoding, collection windows,
reports and applied batches. ``export`` writes the merged counts of the chosen
windows (all by default) as a counts file (``crowdmix.aggregator.counting.files``) that
``crowdmix report --counts FILE --config ... --metric NAME`` decodes; a file of
one window records it, a merge of several needs ``report --rounds N``, and the
export prints that N. Only argparse/stdlib at module level.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("counts", help="list the aggregator's stored counts, or export them")
    csub = p.add_subparsers(dest="counts_command", metavar="ACTION", required=True)
    ls = csub.add_parser("list", help="stored metrics, windows, reports and batches")
    ls.add_argument("--redis", required=True, metavar="URL", help="the aggregator's Redis")
    ls.add_argument("--json", action="store_true", help="print a JSON object")
    ls.set_defaults(func=_list)
    ex = csub.add_parser("export", help="write a counts file for `crowdmix report --counts`")
    ex.add_argument("--redis", required=True, metavar="URL", help="the aggregator's Redis")
    ex.add_argument("--metric", required=True, metavar="NAME")
    ex.add_argument(
        "--windows", metavar="LIST", help="collection windows, e.g. 20400,20402-20405 (all)"
    )
    ex.add_argument("--out", required=True, metavar="FILE", help="counts file to write (.npz)")
    ex.set_defaults(func=_export)


def _open(url: str) -> Any:
    from crowdmix.aggregator.store import open_store
    from crowdmix.cli import CliError

    try:
        return open_store(url)
    except ValueError as exc:
        raise CliError(str(exc)) from None


def _list(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.errors import StoreError
    from crowdmix.aggregator.store import load_counts, stored_metric
    from crowdmix.cli import CliError

    store = _open(args.redis)
    try:
        metrics = []
        for name in store.metrics():
            config = stored_metric(store, name)
            windows = store.windows(name)
            metrics.append(
                {
                    "metric": name,
                    "encoding": None if config is None else config.encoding,
                    "windows": windows,
                    "reports": int(load_counts(store, name).totals.sum()),
                    "batches": store.applied_batches(name),
                }
            )
    except (StoreError, LookupError) as exc:
        raise CliError(f"{args.redis}: {exc}") from None
    finally:
        store.close()
    if args.json:
        print(json.dumps({"store": args.redis, "metrics": metrics}, indent=2))
        return 0
    if not metrics:
        print(f"{args.redis}: no counts stored")
        return 0
    for m in metrics:
        w = m["windows"]
        span = f"{w[0]}" if len(w) == 1 else f"{w[0]}..{w[-1]} ({len(w)} windows)"
        print(
            f"{m['metric']}  {m['encoding'] or '?'}  windows {span}  "
            f"{m['reports']:,} reports in {m['batches']:,} batches"
        )
    return 0


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from crowdmix.aggregator.counting.files import save_counts
    from crowdmix.aggregator.errors import StoreError
    from crowdmix.aggregator.store import load_counts, stored_metric
    from crowdmix.aggregator.store.base import parse_windows
    from crowdmix.cli import CliError

    try:
        windows = parse_windows(args.windows) if args.windows else None
    except ValueError as exc:
        raise CliError(f"--windows: {exc}") from None
    out = Path(args.out)
    if not out.resolve().parent.is_dir():
        raise CliError(f"--out {args.out}: its directory does not exist")
    store = _open(args.redis)
    try:
        config = stored_metric(store, args.metric)
        if config is None:
            raise CliError(f"no counts stored for metric {args.metric!r} in {args.redis}")
        counts = load_counts(store, config, windows)
        stored = store.windows(args.metric)
        duplicates = store.duplicate_reports(args.metric, windows)
    except (StoreError, LookupError) as exc:
        raise CliError(f"{args.redis}: {str(exc).strip(chr(39) + chr(34))}") from None
    finally:
        store.close()
    covered = sorted(set(stored) if windows is None else set(windows) & set(stored))
    window = covered[0] if len(covered) == 1 else None
    try:
        save_counts(
            out,
            counts,
            metric=config.name,
            encoding=config.encoding,
            fingerprint=config.fingerprint,
            window=window,
            duplicate_reports=duplicates,
        )
    except OSError as exc:
        raise CliError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    rounds = "" if window is not None else f" (give `crowdmix report --rounds {len(covered)}`)"
    print(
        f"wrote {args.out}: {int(counts.totals.sum()):,} reports of {config.name!r} "
        f"from {len(covered)} window(s){rounds}"
    )
    return 0
