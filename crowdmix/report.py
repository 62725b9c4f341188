r"""``crowdmix report``: decode counts into a table, a summary and a chart.

    crowdmix report --counts counts.npz --config metrics.toml --metric NAME \
        [--candidates FILE] --out DIR
    crowdmix report --rappor-counts counts.csv --rappor-map map.csv \
        --rappor-params params.csv --out DIR

Counts come from a *source*: a function that returns a ``ReportJob`` when its own options
were given, else ``None`` (``_SOURCES``; a new source adds one function and its options in
``_add_source_arguments``). Only argparse/stdlib at module level. Exit codes: 0 the
report is written (also when nothing is significant, said in one line); 1 nothing could
be decoded. With ``--ledger`` the release is recorded under an id derived from the
windows and counts it covers (``--release-id`` only labels it), so reporting the same
release again costs nothing more.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crowdmix.aggregator.report.job import ReportJob

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "report",
        help="decode counts: frequencies, 95%% intervals, significance, privacy, plot",
        description="Decode counts (crowdmix counts file, or google/rappor's counts/map/"
        "params files) into results.csv, summary.json and plot.png, and print a table.",
    )
    _add_source_arguments(p)
    p.add_argument("--candidates", metavar="FILE", help="candidate values, one per line")
    p.add_argument("--out", metavar="DIR", required=True, help="output directory")
    p.add_argument(
        "--alpha",
        type=float,
        default=0.1,
        help="error rate of the test: the false discovery rate for bh, the family-wise "
        "error for bonferroni (0.1)",
    )
    p.add_argument(
        "--correction",
        choices=("bh", "bonferroni", "none"),
        default="bh",
        help="multiple-testing correction: bh (default: Benjamini-Hochberg, false discovery "
        "rate; chosen by bench/accuracy_rappor_client.py, see BENCHMARKS.md), "
        "bonferroni (family-wise), none",
    )
    p.add_argument(
        "--interval",
        choices=("selective", "wald"),
        default="selective",
        help="95%% intervals of detected values: selective (default, adjusted for having "
        "been selected by the test) or wald (estimate ± 1.96 se); other rows are Wald",
    )
    p.add_argument("--top", type=int, default=20, help="rows in the table and plot (20)")
    p.add_argument(
        "--project", action="store_true", help="basic mechanisms: project onto the simplex"
    )
    p.add_argument("--no-plot", action="store_true", help="skip plot.png")
    p.add_argument(
        "--plot-scale",
        choices=("auto", "linear", "log"),
        default="auto",
        help="plot.png's x axis: auto (default: log for a long tail, the largest share shown "
        "100 times the smallest), linear or log",
    )
    p.add_argument(
        "--no-privacy-statement",
        action="store_true",
        help="publish without the privacy statement (the summary says it was left out); "
        "without this flag a statement that cannot be computed stops the report",
    )
    p.add_argument(
        "--format",
        choices=("crowdmix", "rappor"),
        default="crowdmix",
        help="rappor: also write google/rappor's results.csv, metrics.json and residual.png "
        "in OUT/rappor/ (RAPPOR metrics)",
    )
    p.set_defaults(func=_run)


def _add_source_arguments(p: argparse.ArgumentParser) -> None:
    own = p.add_argument_group("crowdmix counts")
    own.add_argument("--counts", metavar="FILE", help="counts file written by the accumulator")
    own.add_argument("--config", metavar="FILE", help="metric registry (metrics.toml)")
    own.add_argument("--metric", metavar="NAME", help="metric name in the registry")
    own.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="collection windows the counts file covers (needed when it merges windows)",
    )
    live = p.add_argument_group("live counts (aggregator store)")
    live.add_argument("--redis", metavar="URL", help="the aggregator's Redis (needs --metric)")
    live.add_argument(
        "--windows", metavar="LIST", help="collection windows, e.g. 20400,20402-20405 (all)"
    )
    led = p.add_argument_group("privacy ledger (record the release; refuse it over budget)")
    led.add_argument(
        "--ledger", metavar="FILE", help="JSON ledger of the metric's releases (must exist)"
    )
    led.add_argument(
        "--new-ledger", action="store_true", help="start --ledger FILE as a new, empty ledger"
    )
    led.add_argument("--release-id", metavar="ID", help="this release's id (metric/window)")
    led.add_argument("--budget-epsilon", type=float, metavar="E", help="total ε allowed")
    led.add_argument("--budget-delta", type=float, default=1e-5, metavar="D", help="(1e-5)")
    rap = p.add_argument_group("google/rappor files")
    rap.add_argument("--rappor-counts", metavar="FILE", help="counts.csv (N, bit counts)")
    rap.add_argument("--rappor-map", metavar="FILE", help="map.csv (candidate, m·h rows)")
    rap.add_argument("--rappor-params", metavar="FILE", help="params.csv (k,h,m,p,q,f)")
    rap.add_argument(
        "--hashing",
        choices=("rappor-md5", "rappor-java"),
        help="with --candidates instead of --rappor-map: build the map as the reports' client "
        "hashes: rappor-md5 (google/rappor's Python and C++ clients) or rappor-java (its Java/"
        "Android client, two digest bytes per hash)",
    )


def _from_counts_file(args: argparse.Namespace) -> ReportJob | None:
    if args.counts is None:
        return None
    from crowdmix.aggregator.counting.files import load_counts
    from crowdmix.aggregator.report.job import ReportJob, read_candidates
    from crowdmix.cli import CliError
    from crowdmix.options import plural

    if not args.config or not args.metric:
        raise CliError("--counts needs --config FILE and --metric NAME")
    metric = _metric(args.config, args.metric)
    saved = load_counts(args.counts)
    saved.check_metric(metric)
    rounds = args.rounds
    if saved.windows is not None and rounds is not None and rounds != len(saved.windows):
        raise CliError(
            f"{args.counts} covers {plural(len(saved.windows), 'collection window')}, not --rounds "
            f"{rounds}: leave --rounds out"
        )
    if rounds is None and saved.windows:
        rounds = len(saved.windows)  # recorded by crowdmix counts export
    if metric.histogram is not None and saved.window is None and not args.no_privacy_statement:
        # --rounds 1 would state one window's figure at a device bound from the merged
        # total (each device counted once per window): refused, not composed
        raise CliError(
            f"{args.counts} merges collection windows (or names none): a shuffled-histogram "
            "release is stated per collection window; export one window at a time "
            "(crowdmix counts export --windows W)"
        )
    if rounds is None:
        if saved.window is None:
            # a merge of windows composes one report per client per window: the
            # statement must know how many, and defaulting to 1 would understate ε
            raise CliError(
                f"{args.counts} merges collection windows: give --rounds N, the number of "
                "windows it covers, so the privacy statement composes them"
            )
        rounds = 1
    if rounds < 1:
        raise CliError(f"--rounds must be at least 1, got {rounds}")
    if saved.window is not None and rounds != 1:
        raise CliError(f"{args.counts} holds one collection window ({saved.window}): --rounds is 1")
    candidates = read_candidates(args.candidates) if args.candidates else None
    if metric.rappor is not None and candidates is None:
        raise CliError("a RAPPOR metric needs --candidates FILE (one value per line)")
    return ReportJob(
        metric=metric,
        totals=saved.counts.totals,
        ones=saved.counts.ones,
        candidates=candidates,
        source=str(args.counts),
        window=saved.window,
        windows=saved.windows,
        window_seconds=_registry_window(args.config),
        rounds=rounds,
        # each None in a file from before the field: unknown, so the statement assumes the
        # conservative case (re-export it from the store to get the recorded figures)
        duplicate_reports=saved.duplicate_reports,
        batch_sizes=saved.batch_sizes,
        smallest_crowd=saved.smallest_crowd,
        sealed=saved.sealed,
    )


def _from_rappor_files(args: argparse.Namespace) -> ReportJob | None:
    from crowdmix.cli import CliError

    given = [args.rappor_counts, args.rappor_params]
    if not any(given) and args.rappor_map is None:
        if args.hashing is not None:
            raise CliError(
                "--hashing builds the map of google/rappor files: it needs --rappor-counts, "
                "--rappor-params and --candidates"
            )
        return None
    if not all(given) or (args.rappor_map is None and args.candidates is None):
        raise CliError(
            "google/rappor input needs --rappor-counts, --rappor-params and either "
            "--rappor-map or --candidates with --hashing"
        )
    if args.rappor_map is not None and args.hashing is not None:
        raise CliError("--hashing cannot be used with --rappor-map (the map fixes the bits)")
    if args.candidates is not None and args.hashing is None:
        raise CliError(
            "--candidates with google/rappor files needs --hashing: rappor-md5 (reports from "
            "its Python or C++ client) or rappor-java (from its Java/Android client)"
        )
    ignored = [
        flag
        for flag, value in (
            ("--rounds", args.rounds),
            ("--windows", args.windows),
            ("--config", args.config),
            ("--candidates", args.candidates if args.rappor_map is not None else None),
        )
        if value is not None
    ]
    if ignored:  # the three files say everything; a flag that changes nothing is refused
        raise CliError(
            f"{', '.join(ignored)} cannot be used with google/rappor files (the params, "
            "map and counts files define the metric, the candidates and the counts)"
        )
    from crowdmix.aggregator.report.job import ReportJob, read_candidates
    from crowdmix.aggregator.report.rappor_files import (
        read_counts_csv,
        read_map_csv,
        read_params_csv,
    )
    from crowdmix.aggregator.report.rappor_hashing import check_client_hashing, client_design
    from crowdmix.core.params import Hashing
    from crowdmix.core.registry import MetricConfig

    params = read_params_csv(args.rappor_params)
    totals, ones = read_counts_csv(args.rappor_counts, params)
    if args.rappor_map is not None:
        notes: list[str] = []
        values, design = read_map_csv(args.rappor_map, params, notes)
        for note in notes:
            print(f"crowdmix: note: {note}", file=sys.stderr)
    else:
        check_client_hashing(params, args.hashing)
        values = list(read_candidates(args.candidates))
        design = client_design(values, params, args.hashing)
    # The map fixes the Bloom bits; hashing only labels the config (privacy ignores it).
    hashing: Hashing = "rappor-md5" if params.k <= 32 else "mmh3"
    metric = MetricConfig(name=args.metric or "rappor", rappor=params, hashing=hashing)
    return ReportJob(
        metric=metric,
        totals=totals,
        ones=ones,
        candidates=tuple(values),
        design=design,
        source=str(args.rappor_counts),
        shuffled=False,  # google/rappor's pipeline has no shuffler: only local figures hold
    )


def _from_redis(args: argparse.Namespace) -> ReportJob | None:
    if args.redis is None:
        return None
    from crowdmix.aggregator.errors import StoreError
    from crowdmix.aggregator.report.job import ReportJob, read_candidates
    from crowdmix.aggregator.store import load_batch_sizes, load_counts, open_store
    from crowdmix.aggregator.store.base import parse_windows
    from crowdmix.cli import CliError

    if not args.metric:
        raise CliError("--redis needs --metric NAME")
    windows = parse_windows(args.windows) if args.windows else None
    store = open_store(args.redis)
    try:  # the registry entry is stored with the counts; --config, if given, must match it
        metric = _metric(args.config, args.metric) if args.config else args.metric
        stored_windows = store.windows(args.metric)
        # the windows this release covers: the same release however --windows is spelled
        covered = sorted(set(stored_windows) if windows is None else set(windows))
        counts = load_counts(store, metric, covered)
        covered = [w for w in covered if w in set(stored_windows)]
        config = metric if args.config else _stored(store, args.metric)
        batch_sizes = tuple(load_batch_sizes(store, args.metric, covered))
        smallest_crowd = store.smallest_crowd(args.metric, covered)
        duplicate_reports = store.duplicate_reports(args.metric, covered)
        sealed = store.sealing(args.metric, covered)
        window_seconds = (
            _registry_window(args.config) if args.config else store.window_seconds(args.metric)
        )
    except (LookupError, StoreError) as exc:
        raise CliError(str(exc).strip("'\"")) from None
    finally:
        store.close()
    candidates = read_candidates(args.candidates) if args.candidates else None
    if config.rappor is not None and candidates is None:
        raise CliError("a RAPPOR metric needs --candidates FILE (one value per line)")
    return ReportJob(
        metric=config,
        totals=counts.totals,
        ones=counts.ones,
        candidates=candidates,
        source=f"redis ({args.metric})",
        window=covered[0] if len(covered) == 1 else None,
        windows=tuple(covered),
        window_seconds=window_seconds,
        batch_sizes=batch_sizes or None,
        rounds=max(1, len(covered)),
        smallest_crowd=smallest_crowd,
        duplicate_reports=duplicate_reports,
        sealed=sealed,
    )


def _stored(store: Any, name: str) -> Any:
    from crowdmix.aggregator.store import stored_metric
    from crowdmix.cli import CliError

    config = stored_metric(store, name)
    if config is None:
        raise CliError(f"no metric description stored for {name!r}: give --config FILE")
    return config


_SOURCES: tuple[Callable[[argparse.Namespace], ReportJob | None], ...] = (
    _from_counts_file,
    _from_rappor_files,
    _from_redis,
)


def _registry_window(config: str) -> int:
    from crowdmix.core.registry import load_registry

    return load_registry(config).window_seconds


def _metric(config: str, name: str) -> Any:
    from crowdmix.cli import CliError
    from crowdmix.core.registry import load_registry

    registry = load_registry(config)
    metric = registry.get(name)
    if metric is None:
        known = ", ".join(sorted(registry.metrics))
        raise CliError(f"metric {name!r} is not in {config} (known: {known})")
    return metric


def _run(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.accounting import AccountingError
    from crowdmix.cli import CliError

    try:
        return _report(args)
    except ValueError as exc:  # DecodeError, CountsError, RapporFileError, RegistryError
        raise CliError(str(exc)) from None
    except AccountingError as exc:  # over budget: nothing recorded, nothing written
        raise CliError(f"release refused by the ledger {args.ledger}: {exc}") from None


def _check_ledger_readable(path: str) -> None:
    """A ledger that exists must be readable text; found before any work is done."""
    from pathlib import Path

    from crowdmix.cli import CliError

    ledger = Path(path)
    if not ledger.exists():
        return
    try:
        ledger.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"cannot read ledger {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise CliError(f"ledger {path} is not UTF-8 JSON") from None


def _rappor_outputs(job: ReportJob, outcome: Any, out: str) -> dict[str, Any]:
    """google/rappor's own files in OUT/rappor/ (see aggregator.report.rappor_output)."""
    from pathlib import Path

    from crowdmix.aggregator.decode.rappor import design_matrix
    from crowdmix.aggregator.report.rappor_output import write_rappor_outputs
    from crowdmix.cli import CliError

    params = job.metric.rappor
    if params is None or job.candidates is None:
        raise CliError("--format rappor is for RAPPOR metrics")
    design = job.design
    if design is None:
        design = design_matrix(job.candidates, params, job.metric.hashing)
    return write_rappor_outputs(
        outcome.result,
        Path(out) / "rappor",
        totals=job.totals,
        ones=job.ones,
        design=design,
        f=params.f,
        p=params.p,
        q=params.q,
        elapsed_seconds=float(outcome.summary["elapsed_seconds"]["total"]),
    )


def _ledger_privacy(args: argparse.Namespace, job: ReportJob) -> Any:
    """The privacy figures of a release recorded in ``--ledger`` (run after decoding).

    The statement's longitudinal figure covers every release in the ledger; a
    release over the budget raises BudgetExceededError and nothing is recorded
    or written. Reporting the same release id again re-decodes the same counts,
    which costs no privacy: it is not recorded twice.
    """
    from crowdmix.aggregator.accounting import (
        Budget,
        DuplicateReleaseError,
        JsonFileLedgerStore,
        PrivacyLedger,
        record_release,
    )
    from crowdmix.aggregator.report.job import privacy_figures

    budget = (
        Budget(epsilon=args.budget_epsilon, delta=args.budget_delta)
        if args.budget_epsilon is not None
        else None
    )
    store = JsonFileLedgerStore(args.ledger, create=False)
    if args.new_ledger:
        store.init()  # refused if the file exists: never restart a ledger by accident
    ledger = PrivacyLedger(store, budget)
    window = min(job.windows) if job.windows else (job.window if job.window is not None else 0)
    derived, content = release_identity(job)
    release_id = args.release_id or derived

    def figures(metric: Any, totals: Any) -> dict[str, Any]:
        out = privacy_figures(
            metric,
            totals,
            batch_sizes=job.batch_sizes,
            shuffled=job.shuffled,
            rounds=job.rounds,
            smallest_crowd=job.smallest_crowd,
            sealed=job.sealed,
            duplicate_reports=job.duplicate_reports,
        )
        n = int(totals.sum())
        sizes = job.batch_sizes if job.batch_sizes and sum(job.batch_sizes) == n else None
        try:
            statement, (eps, delta) = record_release(
                ledger,
                metric,
                n,
                release_id=release_id,
                window=window,
                cohort_sizes=[int(t) for t in totals],
                batch_sizes=sizes,
                shuffled=job.shuffled,
                smallest_crowd=job.smallest_crowd if sizes is not None else None,
                rounds=job.rounds,  # a release merging R windows is R rounds per client
                content=content,  # the same data under any id is recorded once
                sealed=job.sealed,
            )
            recorded = True
        except DuplicateReleaseError:
            eps, delta = ledger.spent(metric.name)
            recorded = False
        else:
            out["statement"] = statement.to_dict()
            out["text"] = statement.render()
        out["ledger"] = {
            "path": str(args.ledger),
            "release_id": release_id,
            "content": content,
            "recorded": recorded,
            "rounds": job.rounds,
            "releases": len(ledger.releases(metric.name)),
            "total_epsilon": eps,
            "total_delta": delta,
            "budget": None
            if budget is None
            else {"epsilon": budget.epsilon, "delta": budget.delta},
        }
        return out

    return figures


def release_identity(job: ReportJob) -> tuple[str, str]:
    """(release id, content digest) of the data a report releases: the metric, its
    params, the windows covered and the counts themselves. Two runs over the same
    counts get the same id whatever their flags; new reports in a window make a new
    release (both were published, so both are spent)."""
    import hashlib

    import numpy as np

    windows = (
        sorted(job.windows) if job.windows else ([job.window] if job.window is not None else None)
    )
    h = hashlib.sha256()
    h.update(f"{job.metric.name}|{job.metric.fingerprint:016x}|{windows}|".encode())
    h.update(np.ascontiguousarray(job.totals, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(job.ones, dtype="<i8").tobytes())
    content = h.hexdigest()[:32]
    if windows is None:
        span = "windows-unknown"
    elif len(windows) == 1:
        span = str(windows[0])
    elif windows[-1] - windows[0] + 1 == len(windows):
        span = f"{windows[0]}-{windows[-1]}"
    else:
        span = f"{windows[0]}..{windows[-1]}x{len(windows)}"
    return f"{job.metric.name}/{span}/{content[:8]}", content


def _report(args: argparse.Namespace) -> int:
    import warnings

    from crowdmix.aggregator.decode import DecodeOptions, DecodeWarning
    from crowdmix.aggregator.report.job import (
        PrivacyStatementError,
        format_table,
        privacy_figures,
        run_report,
        write_outputs,
    )
    from crowdmix.cli import CliError
    from crowdmix.options import out_dir, plural

    out_dir(args.out)  # before decoding: a bad --out is found before the work
    if args.ledger:
        _check_ledger_readable(args.ledger)
    jobs = [job for job in (source(args) for source in _SOURCES) if job is not None]
    if not jobs:
        raise CliError(
            "give counts: --counts FILE --config FILE --metric NAME [--candidates FILE], "
            "--redis URL --metric NAME [--windows LIST], "
            "or --rappor-counts/--rappor-params with --rappor-map (or --candidates and --hashing)"
        )
    if len(jobs) > 1:
        raise CliError("give one counts source, not several")
    options = DecodeOptions(alpha=args.alpha, correction=args.correction, interval=args.interval)
    if args.new_ledger and not args.ledger:
        raise CliError("--new-ledger needs --ledger FILE")
    if args.no_privacy_statement and args.ledger:
        raise CliError("--no-privacy-statement cannot record a release in --ledger")
    job = jobs[0]
    if job.metric.heavy_hitters is not None:
        raise CliError(
            f"metric {job.metric.name!r} is a heavy-hitters metric: each window is one round "
            "of its discovery, decoded by `crowdmix discover step`"
        )
    privacy: Any = None
    if args.ledger and job.metric.histogram is not None:
        raise CliError(
            "--ledger does not record shuffled-histogram releases yet (the ledger composes "
            "single-message LDP releases); the statement is printed per window"
        )
    if args.ledger:
        privacy = _ledger_privacy(args, job)
    elif args.no_privacy_statement:
        privacy = privacy_figures(job.metric, job.totals, statement=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DecodeWarning)  # they are in the summary and printed
        try:
            outcome = run_report(job, options=options, project=args.project, privacy=privacy)
        except PrivacyStatementError as exc:
            raise CliError(
                f"{exc}; nothing was written (--no-privacy-statement publishes without one)"
            ) from None
    paths = write_outputs(
        outcome, args.out, plot=not args.no_plot, top=args.top, scale=args.plot_scale
    )
    if args.format == "rappor":
        paths.update(_rappor_outputs(jobs[0], outcome, args.out))
    result, summary = outcome.result, outcome.summary
    print(format_table(result, top=args.top))
    print()
    for note in result.warnings:
        print(f"warning: {note}", file=sys.stderr)
    volume = (
        f"{plural(summary['reports'], 'report')}, "
        f"{plural(summary['cohorts']['with_reports'], 'cohort')}"
    )
    if job.metric.histogram is not None:  # the decoder counts devices, estimated from reports
        volume = (
            f"{plural(summary['diagnostics']['total_reports'], 'report')} from an estimated "
            f"{plural(summary['reports'], 'device')}"
        )
    print(
        f"{volume}; "
        f"{result.detected} of {len(result.values)} candidates detected "
        f"({result.correction}, α={result.alpha}); allocated mass {result.allocated_mass:.1%}"
        + (
            ""
            if result.distribution_mass is None
            else f" (the distribution column: {result.distribution_mass:.1%})"
        )
        + f"; detection threshold {result.detection_threshold:.2%}"
    )
    text = summary.get("privacy", {}).get("text")
    if text:
        print(f"privacy: {text}")
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    if result.detected == 0:  # an answer, not a failure: a scheduled job must not page
        print(
            "nothing detected: no candidate is significant (detection threshold "
            f"{result.detection_threshold:.2%} of reports); the distribution answer is in "
            "results.csv"
            + (
                f" and places {result.distribution_mass:.1%} of the reports"
                if result.distribution_mass
                else ""
            )
        )
    return 0
