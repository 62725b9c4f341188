"""The report job as a library: counts + candidates + metric config → decoded
table, summary (with the privacy statement) and plot.

    job = ReportJob(metric=metric, totals=counts.totals, ones=counts.ones,
                    candidates=tuple(candidates), source="counts.npz")
    outcome = run_report(job)                 # decode + summary
    paths = write_outputs(outcome, out_dir)   # results.csv, summary.json, plot.png
    print(format_table(outcome.result))

Privacy figures: ``run_report(privacy=...)`` takes a ready dict, or a
function ``(metric, totals) -> dict``; by default :func:`privacy_figures`
gives the local ε_1/ε_∞ and, from ``crowdmix.aggregator.accounting``, the amplified
central (ε, δ) of the release.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.decode.errors import IllPosedError, ParamsMismatchError
from crowdmix.aggregator.decode.rappor import DecodeOptions
from crowdmix.aggregator.decode.result import DecodeResult
from crowdmix.core.registry import MetricConfig

__all__ = [
    "ANSWERS",
    "RESULT_COLUMNS",
    "PrivacyStatementError",
    "ReportJob",
    "ReportOutcome",
    "format_table",
    "plot_title",
    "privacy_figures",
    "read_candidates",
    "report_plot_layout",
    "run_report",
    "write_outputs",
    "write_results_csv",
]

RESULT_COLUMNS = (
    "value",
    "estimate",
    "std_error",
    "ci_low",
    "ci_high",
    "proportion",
    "p_value",
    "significant",
    # After the older eight columns, so their readers keep working.
    # "wald" or "selective" (selection-adjusted): how this row's ci_low/ci_high were made.
    "ci_method",
    # The second answer, "what is the distribution?": every candidate's share,
    # non-negative and summing to <= 1, with its 95% interval (proportions).
    # The columns before answer "which values are present?" (significant).
    "distribution",
    "distribution_low",
    "distribution_high",
)
#: What each answer in results.csv is (also written to summary.json).
ANSWERS = {
    "detected": "significant: values present, under the multiple-testing correction "
    "(bh: false discovery rate <= alpha; bonferroni: family-wise error <= alpha); "
    "estimate/std_error/ci_low/ci_high/proportion/p_value belong to this answer",
    "distribution": "distribution, distribution_low, distribution_high: every candidate's "
    "share of reports (non-negative, summing to <= 1) with a 95% interval",
}
PrivacySource = Callable[[MetricConfig, npt.NDArray[np.int64]], dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportJob:
    """What to decode. ``design`` (from a google/rappor map file) overrides hashing."""

    metric: MetricConfig
    totals: npt.NDArray[np.int64]
    ones: npt.NDArray[np.int64]
    candidates: tuple[str, ...] | None = None
    design: Any = None  # scipy.sparse matrix (m·k × C) or None
    source: str = ""
    #: the one collection window of a one-window release (None: several, or not known)
    window: int | None = None
    #: every collection window the counts cover (None: not known)
    windows: tuple[int, ...] | None = None
    #: the collection window's length in seconds (None: not known): windows as dates
    window_seconds: int | None = None
    # For the privacy statement: the shuffled batches the counts came from (None:
    # unknown, the metric's min_batch is assumed), whether they were shuffled at
    # all (google/rappor files were not), and how many windows (releases) merge.
    batch_sizes: tuple[int, ...] | None = None
    shuffled: bool = True
    rounds: int = 1
    smallest_crowd: int | None = None  # measured at ingest (CountStore.smallest_crowd)
    sealed: bool | None = None  # reports sealed to the aggregator (None: not known)
    # Report ids the aggregator saw twice in these windows (CountStore.duplicate_reports;
    # None: not recorded). A shuffled histogram states its central figure only at 0.
    duplicate_reports: int | None = None


@dataclass(frozen=True, slots=True)
class ReportOutcome:
    result: DecodeResult
    summary: dict[str, Any] = field(default_factory=dict)


def read_candidates(path: str | os.PathLike[str]) -> tuple[str, ...]:
    """Candidate values, one per line (UTF-8); blank lines skipped; duplicates are an error."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ParamsMismatchError(f"candidates file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsMismatchError(f"cannot read candidates file {path}: {exc}") from None
    values = [line.rstrip("\r") for line in text.split("\n")]
    values = [v for v in values if v.strip()]
    seen: set[str] = set()
    dups = [v for v in values if v in seen or seen.add(v)]  # type: ignore[func-returns-value]
    if dups:
        raise ParamsMismatchError(f"{path}: duplicate candidate(s) {dups[:5]}")
    if not values:
        raise ParamsMismatchError(f"{path}: no candidates")
    return tuple(values)


def privacy_figures(
    metric: MetricConfig,
    totals: npt.NDArray[np.int64],
    *,
    batch_sizes: Sequence[int] | None = None,
    shuffled: bool = True,
    rounds: int = 1,
    smallest_crowd: int | None = None,
    statement: bool = True,
    sealed: bool | None = None,
    duplicate_reports: int | None = None,
) -> dict[str, Any]:
    """Local ε figures plus the release's privacy statement (central (ε, δ) after shuffling).

    ``batch_sizes`` that do not add up to the reports counted (batches applied
    before sizes were recorded) are ignored, and the statement falls back to
    the conservative assumption it states. A statement that cannot be computed
    raises :class:`PrivacyStatementError`: a release is never published with its
    guarantee silently missing. ``statement=False`` is the caller's explicit
    opt-out (``crowdmix report --no-privacy-statement``), and the summary says so.

    ``duplicate_reports``: report ids the aggregator saw twice in the release's windows
    (None: not recorded). A shuffled histogram with any, or unknown, states no central
    figure (``HistogramRelease.linked``). For the other encodings it is informational
    only: their reports are single messages, so a repeated one shows the aggregator a
    copy of one report it has already counted once, linked to nothing else, and their
    figures do not change.
    """
    from crowdmix.core.privacy import epsilon_inf, epsilon_one

    out: dict[str, Any] = {}
    if metric.rappor is not None:
        out["local"] = {
            "epsilon_1": _finite(epsilon_one(metric.rappor)),
            "epsilon_inf": _finite(epsilon_inf(metric.rappor)),
        }
    elif metric.basic is not None:
        out["local"] = {"epsilon_1": metric.basic.epsilon, "epsilon_inf": None}
    elif metric.histogram is not None:
        out["local"] = {"epsilon_1": metric.histogram.local_epsilon, "epsilon_inf": None}
    out["duplicate_reports"] = duplicate_reports
    n = int(totals.sum())
    if batch_sizes is not None and sum(batch_sizes) != n:
        batch_sizes = smallest_crowd = None
    if not statement:
        out["statement"] = None
        out["text"] = "no privacy statement: left out on request (--no-privacy-statement)"
        return out
    if metric.histogram is not None:
        return _histogram_figures(
            out,
            metric,
            n,
            rounds=rounds,
            sealed=sealed,
            batch_sizes=batch_sizes,
            duplicate_reports=duplicate_reports,
        )
    from crowdmix.aggregator.accounting import privacy_statement

    try:
        stated = privacy_statement(
            metric,
            n,
            cohort_sizes=[int(t) for t in totals],
            batch_sizes=batch_sizes,
            shuffled=shuffled,
            rounds=rounds,
            smallest_crowd=smallest_crowd if batch_sizes is not None else None,
        )
    except (ValueError, ArithmeticError) as exc:
        raise PrivacyStatementError(f"cannot state the privacy guarantee: {exc}") from exc
    if sealed is not None:  # who can learn what; no figure depends on it
        stated = dataclasses.replace(stated, sealed=sealed)
    out["statement"] = stated.to_dict()
    out["text"] = stated.render()
    return out


def _histogram_figures(
    out: dict[str, Any],
    metric: MetricConfig,
    n: int,
    *,
    rounds: int,
    sealed: bool | None,
    batch_sizes: Sequence[int] | None,
    duplicate_reports: int | None,
) -> dict[str, Any]:
    """A shuffled histogram's statement: both figures (aggregator.accounting.histogram_release)."""
    from crowdmix.aggregator.accounting.histogram_release import histogram_release

    assert metric.histogram is not None
    if sealed is False:
        raise PrivacyStatementError(
            f"metric {metric.name!r} is a shuffled histogram and its reports were not sealed: "
            "the shuffler saw every device's true value, so no guarantee can be stated"
        )
    try:
        stated = histogram_release(
            metric.name,
            metric.histogram,
            n,
            honest_fraction=metric.honest_fraction,
            rounds=rounds,
            sealed=sealed,
            batch_sizes=None if batch_sizes is None else tuple(int(b) for b in batch_sizes),
            min_batch=metric.shuffle.min_batch,
            duplicate_reports=duplicate_reports,
        )
    except (ValueError, ArithmeticError) as exc:
        raise PrivacyStatementError(f"cannot state the privacy guarantee: {exc}") from exc
    out["statement"] = stated.to_dict()
    out["text"] = stated.render()
    return out


class PrivacyStatementError(ValueError):
    """The release's privacy statement cannot be computed (so it must not be published
    without the caller opting out)."""


def _finite(x: float) -> float | None:
    return None if math.isinf(x) or math.isnan(x) else x


def _decode(job: ReportJob, options: DecodeOptions, project: bool) -> DecodeResult:
    metric = job.metric
    if metric.rappor is not None:
        from crowdmix.aggregator.decode.rappor import decode_rappor, design_matrix

        if job.candidates is None:
            raise IllPosedError("RAPPOR needs a list of candidate values to decode against")
        design = job.design
        if design is None:
            design = design_matrix(job.candidates, metric.rappor, metric.hashing)
        return decode_rappor(job.totals, job.ones, metric.rappor, design, job.candidates, options)
    names = job.candidates if job.candidates is not None else metric.domain
    if metric.histogram is not None:
        from crowdmix.aggregator.decode.histogram import decode_histogram

        # devices are estimated from the report total (the aggregator never sees devices)
        return decode_histogram(
            job.ones[0],
            metric.histogram,
            values=names,
            alpha=options.alpha,
            correction=options.correction,
            level=options.level,
            interval=options.interval,
            project=project,
        )
    from crowdmix.aggregator.decode.basic import decode_basic

    assert metric.basic is not None  # MetricConfig holds exactly one encoding
    return decode_basic(
        job.totals,
        job.ones,
        metric.basic,
        names,
        alpha=options.alpha,
        correction=options.correction,
        level=options.level,
        project=project,
        interval=options.interval,
    )


def run_report(
    job: ReportJob,
    *,
    options: DecodeOptions | None = None,
    project: bool = False,
    privacy: dict[str, Any] | PrivacySource | None = None,
) -> ReportOutcome:
    """Decode ``job`` and assemble the summary. Raises DecodeError when nothing can be decoded."""
    started = time.perf_counter()
    opts = options if options is not None else DecodeOptions()
    result = _decode(job, opts, project)
    decoded = time.perf_counter()
    if privacy is None:
        figures = privacy_figures(
            job.metric,
            job.totals,
            batch_sizes=job.batch_sizes,
            shuffled=job.shuffled,
            rounds=job.rounds,
            smallest_crowd=job.smallest_crowd,
            sealed=job.sealed,
            duplicate_reports=job.duplicate_reports,
        )
    elif callable(privacy):
        figures = privacy(job.metric, job.totals)
    else:
        figures = privacy
    metric = job.metric
    params: dict[str, Any]
    if metric.rappor is not None:
        r = metric.rappor
        params = {"k": r.k, "h": r.h, "m": r.m, "f": r.f, "p": r.p, "q": r.q}
        params["hashing"] = metric.hashing if job.design is None else "map file"
    elif metric.histogram is not None:
        h = metric.histogram
        params = {
            "domain_size": h.domain_size,
            "fake_slots": h.fake_slots,
            "fake_probability": h.fake_probability,
            "local_epsilon": h.local_epsilon,
            "honest_fraction": metric.honest_fraction,
        }
    else:
        assert metric.basic is not None
        params = {"epsilon": metric.basic.epsilon, "domain_size": metric.basic.domain_size}
    summary: dict[str, Any] = {
        "metric": metric.name,
        "encoding": metric.encoding,
        "params": params,
        "source": job.source,
        "window": job.window,
        "windows": None if job.windows is None else list(job.windows),
        "window_seconds": job.window_seconds,
        "reports": result.num_reports,
        "cohorts": {"with_reports": result.num_cohorts, "total": metric.num_cohorts},
        "candidates": len(result.values),
        "detected": result.detected,
        "allocated_mass": result.allocated_mass,
        "detection_threshold": {
            "proportion": result.detection_threshold,
            "reports": result.detection_threshold * result.num_reports,
        },
        "method": result.method,
        "alpha": result.alpha,
        "correction": result.correction,
        "ci_method": result.ci_method,
        "answers": ANSWERS,
        "warnings": list(result.warnings),
        "diagnostics": {k: _json_safe(v) for k, v in result.diagnostics.items()},
        "privacy": figures,
        "elapsed_seconds": {
            "decode": decoded - started,
            "total": time.perf_counter() - started,
        },
    }
    return ReportOutcome(result, summary)


def _json_safe(v: Any) -> Any:
    if isinstance(v, float | np.floating):
        return _finite(float(v))
    if isinstance(v, np.integer):
        return int(v)
    return v


def write_results_csv(path: str | os.PathLike[str], result: DecodeResult) -> None:
    """One row per candidate: significant first, then by estimate (reports), descending."""
    n = result.num_reports
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(RESULT_COLUMNS)
        for i in result.order():
            w.writerow(
                [
                    result.values[i],
                    f"{result.proportion[i] * n:.6g}",
                    f"{result.std_error[i] * n:.6g}",
                    f"{result.ci_low[i] * n:.6g}",
                    f"{result.ci_high[i] * n:.6g}",
                    f"{result.proportion[i]:.6g}",
                    f"{result.p_value[i]:.6g}",
                    "true" if result.significant[i] else "false",
                    _row_ci_method(result, i),
                    *_distribution_cells(result, i),
                ]
            )


def _row_ci_method(result: DecodeResult, i: int) -> str:
    """Selection-adjusted intervals apply to detected rows only; the rest are Wald."""
    return "selective" if result.ci_method == "selective" and result.significant[i] else "wald"


def _distribution_cells(result: DecodeResult, i: int) -> list[str]:
    arrays = (result.distribution, result.distribution_low, result.distribution_high)
    return ["" if a is None else f"{a[i]:.6g}" for a in arrays]


def write_outputs(
    outcome: ReportOutcome,
    out_dir: str | os.PathLike[str],
    *,
    plot: bool = True,
    top: int = 20,
    scale: str = "auto",
) -> dict[str, Path]:
    """results.csv, summary.json and (unless ``plot=False``) plot.png in ``out_dir``;
    ``scale`` is the plot's x axis (``aggregator.report.plot.SCALES``)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"results": out / "results.csv", "summary": out / "summary.json"}
    write_results_csv(paths["results"], outcome.result)
    paths["summary"].write_text(
        json.dumps(outcome.summary, indent=2, allow_nan=False, default=_json_safe) + "\n",
        encoding="utf-8",
    )
    if plot:
        from crowdmix.aggregator.report.plot import plot_estimates

        paths["plot"] = out / "plot.png"
        layout = report_plot_layout(outcome, top=top, scale=scale)
        plot_estimates(outcome.result, paths["plot"], layout)
    return paths


def report_plot_layout(outcome: ReportOutcome, *, top: int = 20, scale: str = "auto") -> Any:
    """What :func:`write_outputs` draws in plot.png (``aggregator.report.plot.PlotLayout``)."""
    from crowdmix.aggregator.report.plot import plot_layout

    return plot_layout(outcome.result, top=top, scale=scale, **_plot_args(outcome))


def _plot_args(outcome: ReportOutcome) -> dict[str, Any]:
    """The title, and what the shares are of: a shuffled histogram's decoder estimates
    devices from the reports, the other decoders count reports."""
    summary = outcome.summary
    histogram = summary.get("encoding") == "shuffled-histogram"
    return {
        "title": plot_title(summary),
        "subject": "devices" if histogram else "reports",
        "total_reports": summary.get("diagnostics", {}).get("total_reports"),
    }


def plot_title(summary: dict[str, Any]) -> str:
    """The metric, its windows with their dates, and the release's ε, e.g.
    ``"home_page · window 20400 (2025-11-08) · central ε = 0.964, δ = 1e-06"``."""
    from crowdmix.aggregator.report.windows import window_span

    parts = [_plot_name(summary)]
    windows = summary.get("windows") or (
        [summary["window"]] if summary.get("window") is not None else []
    )
    if windows:
        parts.append(window_span(windows, summary.get("window_seconds")))
    parts.append(_epsilon_label(summary.get("privacy") or {}))
    return " · ".join(p for p in parts if p)


def _epsilon_label(privacy: dict[str, Any]) -> str:
    """The release's ε as the statement gives it (rounded up, never down)."""
    from crowdmix.aggregator.accounting.histogram import format_up

    stmt = privacy.get("statement")
    local = (privacy.get("local") or {}).get("epsilon_1")
    if not isinstance(stmt, dict):
        return "no privacy statement" if "statement" in privacy else ""
    if stmt.get("encoding") == "shuffled-histogram":
        central = stmt.get("central_total") or stmt.get("central")
        if isinstance(central, dict) and central.get("epsilon") is not None:
            return f"central ε = {format_up(central['epsilon'])}, δ = {central['delta']:.2g}"
        colluding = stmt.get("colluding_local_epsilon_total")
        return "no central ε" + (f"; ε_L = {format_up(colluding)}" if colluding else "")
    longitudinal = stmt.get("longitudinal") or {}
    central = stmt.get("central") or {}
    if longitudinal.get("rounds", 1) > 1 and longitudinal.get("epsilon") is not None:
        return (
            f"ε = {format_up(longitudinal['epsilon'])} over {longitudinal['rounds']} windows, "
            f"δ = {longitudinal['delta']:.2g}"
        )
    if central.get("epsilon") is not None and (stmt.get("batch") or {}).get("shuffled", True):
        return f"central ε = {format_up(central['epsilon'])}, δ = {central['delta']:.2g}"
    return f"local ε_1 = {format_up(local)}" if local is not None else ""


def _plot_name(summary: dict[str, Any]) -> str:
    """The metric's name; for google/rappor files (no name of their own), the counts file."""
    if summary.get("params", {}).get("hashing") == "map file":
        return f"google/rappor {Path(str(summary.get('source', ''))).name}"
    return str(summary.get("metric", ""))


def format_table(result: DecodeResult, top: int = 20) -> str:
    """A fixed-width table of the top rows (significant first) for the terminal."""
    n = result.num_reports
    order = result.order()[:top]
    width = max([5, *(len(_clip(result.values[i])) for i in order)])
    head = (
        f"{'value':<{width}}  {'estimate':>10}  {'std err':>9}  {'95% CI':>23}  "
        f"{'share':>7}  {'p-value':>9}  sig"
    )
    lines = [head, "-" * len(head)]
    for i in order:
        ci = f"[{result.ci_low[i] * n:,.0f}, {result.ci_high[i] * n:,.0f}]"
        lines.append(
            f"{_clip(result.values[i]):<{width}}  {result.proportion[i] * n:>10,.0f}  "
            f"{result.std_error[i] * n:>9,.0f}  {ci:>23}  {result.proportion[i]:>7.2%}  "
            f"{_p(result.p_value[i]):>9}  {'yes' if result.significant[i] else 'no'}"
        )
    hidden = len(result.values) - len(order)
    if hidden > 0:
        lines.append(f"... {hidden} more rows in results.csv")
    return "\n".join(lines)


def _p(p: float) -> str:
    """p-values below float range print as a bound, not as a misleading 0."""
    return "<1e-300" if p < 1e-300 else f"{p:.2g}"


def _clip(value: str, width: int = 40) -> str:
    return value if len(value) <= width else value[: width - 1] + "…"
