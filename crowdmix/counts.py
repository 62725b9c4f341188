"""``crowdmix counts list|export``: what the aggregator's store holds, and a counts file of it.

    crowdmix counts list   --redis URL [--config FILE] [--json]
    crowdmix counts export --redis URL --metric NAME [--windows LIST] --out FILE

``list`` shows every stored metric (and every metric of ``--config``, with 0
where nothing is counted) with its encoding, collection windows as numbers and
dates, reports and applied batches. ``export`` writes the merged counts of the chosen
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
    ls.add_argument(
        "--config", metavar="FILE", help="metric registry: list its metrics too (0 when none)"
    )
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
    from crowdmix.aggregator.report.windows import window_date, window_span
    from crowdmix.aggregator.store import stored_metric
    from crowdmix.cli import CliError
    from crowdmix.core.registry import load_registry
    from crowdmix.options import plural

    registry = load_registry(args.config) if args.config else None
    store = _open(args.redis)
    try:
        names = sorted(set(store.metrics()) | set(registry.metrics if registry else ()))
        metrics = []
        for name in names:  # one metric's state never hides another's
            config = stored_metric(store, name) or (registry.get(name) if registry else None)
            windows = store.windows(name)
            stored = store.load(name, windows) if windows else None
            seconds = store.window_seconds(name)
            if seconds is None and registry is not None:
                seconds = registry.window_seconds
            metrics.append(
                {
                    "metric": name,
                    "encoding": None if config is None else config.encoding,
                    "windows": windows,
                    "window_seconds": seconds,
                    "window_dates": [window_date(w, seconds) or None for w in windows],
                    "reports": 0 if stored is None else int(stored.totals.sum()),
                    "batches": store.applied_batches(name),
                }
            )
    except StoreError as exc:
        raise CliError(f"{args.redis}: {exc}") from None
    finally:
        store.close()
    if args.json:
        print(json.dumps({"store": args.redis, "metrics": metrics}, indent=2))
        return 0
    if not metrics:
        print(f"{args.redis}: no counts stored (give --config FILE to list the registry's metrics)")
        return 0
    for m in metrics:
        span = window_span(m["windows"], m["window_seconds"])
        print(
            f"{m['metric']}  {m['encoding'] or '?'}  {span}  "
            f"{plural(m['reports'], 'report')} in {plural(m['batches'], 'batch', 'batches')}"
        )
    return 0


def _export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from crowdmix.aggregator.counting.files import save_counts
    from crowdmix.aggregator.errors import StoreError
    from crowdmix.aggregator.report.windows import window_span
    from crowdmix.aggregator.store import load_batch_sizes, load_counts, stored_metric
    from crowdmix.aggregator.store.base import parse_windows
    from crowdmix.aggregator.store.codec import describe_metric
    from crowdmix.cli import CliError
    from crowdmix.options import plural

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
        covered = sorted(set(stored) if windows is None else set(windows) & set(stored))
        # what the live store's statement rests on travels with the counts
        duplicates = store.duplicate_reports(args.metric, covered)
        sizes = load_batch_sizes(store, args.metric, covered)
        crowd = store.smallest_crowd(args.metric, covered)
        sealed = store.sealing(args.metric, covered)
        seconds = store.window_seconds(args.metric)
    except (StoreError, LookupError) as exc:
        raise CliError(f"{args.redis}: {str(exc).strip(chr(39) + chr(34))}") from None
    finally:
        store.close()
    window = covered[0] if len(covered) == 1 else None
    if sum(sizes) != counts.num_reports:  # batches counted before sizes were recorded
        sizes, crowd = [], None
    try:
        save_counts(
            out,
            counts,
            metric=config.name,
            encoding=config.encoding,
            fingerprint=config.fingerprint,
            window=window,
            duplicate_reports=duplicates,
            windows=covered,
            batch_sizes=sizes or None,
            smallest_crowd=crowd,
            sealed=sealed,
            params=describe_metric(config),
        )
    except OSError as exc:
        raise CliError(f"cannot write {args.out}: {exc.strerror or exc}") from None
    print(
        f"wrote {args.out}: {plural(counts.num_reports, 'report')} of {config.name!r} "
        f"from {window_span(covered, seconds)}"
    )
    return 0
