"""Every interval a report prints is a real interval containing its estimate.

Checked on what the user reads: results.csv, summary.json and the terminal table,
for random inputs (Hypothesis) of both decoders and both interval methods.
"""

from __future__ import annotations

import csv
import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crowdmix.aggregator.decode import DecodeError, DecodeOptions, DecodeWarning, design_matrix
from crowdmix.aggregator.decode.simulate import simulate_rappor_counts
from crowdmix.aggregator.report.job import (
    RESULT_COLUMNS,
    ReportJob,
    format_table,
    run_report,
    write_outputs,
)
from crowdmix.aggregator.report.rappor_files import (
    write_counts_csv,
    write_map_csv,
    write_params_csv,
)
from crowdmix.cli import main
from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import MetricConfig

PARAMS = RapporParams(k=16, h=2, m=8, p=0.25, q=0.75, f=0.5)
CANDIDATES = tuple(f"v{i}" for i in range(1, 13))
DESIGN = design_matrix(CANDIDATES, PARAMS)
RAPPOR = MetricConfig(name="pages", rappor=PARAMS)
KRR = MetricConfig(
    name="browser",
    basic=BasicParams(mechanism="krr", epsilon=1.0, domain_size=6),
    domain=tuple(f"b{i}" for i in range(6)),
)
ROW = re.compile(r"^(\S+)\s+(-?[\d,]+)\s+\S+\s+\[(-?[\d,]+), (-?[\d,]+)\]")


def _num(text: str) -> float:
    return float(text.replace(",", ""))


def check_printed_intervals(job: ReportJob, options: DecodeOptions, out: Path) -> int:
    """Run the report; assert low <= estimate <= high in every output. Returns rows checked."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DecodeWarning)
        try:
            outcome = run_report(job, options=options, privacy={})
        except DecodeError:
            return 0  # refused with a clear error (e.g. collinear detections): nothing printed
    write_outputs(outcome, out, plot=False)
    rows = list(csv.DictReader((out / "results.csv").open(encoding="utf-8")))
    assert tuple(rows[0]) == RESULT_COLUMNS
    for r in rows:
        low, est, high = float(r["ci_low"]), float(r["estimate"]), float(r["ci_high"])
        assert low <= est <= high, r
        if est >= 0:
            assert low >= 0, r
        want = options.interval if r["significant"] == "true" else "wald"
        assert r["ci_method"] == want
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ci_method"] == options.interval
    assert set(summary["answers"]) == {"detected", "distribution"}
    # The distribution answer is consistent: non-negative, summing to <= 1,
    # each share inside its interval (6 significant digits in the file).
    dist = [float(r["distribution"]) for r in rows]
    assert min(dist) >= 0 and sum(dist) <= 1 + 1e-5
    for r in rows:
        d, lo, hi = (float(r[k]) for k in ("distribution", "distribution_low", "distribution_high"))
        assert 0 <= lo <= d <= hi, r
    table = format_table(outcome.result, top=len(rows)).splitlines()[2:]
    for line in table:
        m = ROW.match(line)
        assert m is not None, line
        est, low, high = _num(m[2]), _num(m[3]), _num(m[4])
        assert low <= est <= high, line
    return len(rows)


options_st = st.builds(
    DecodeOptions,
    alpha=st.sampled_from([0.01, 0.05, 0.2]),
    correction=st.sampled_from(["bonferroni", "bh", "none"]),
    interval=st.sampled_from(["selective", "wald"]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(200, 200_000),
    shares=st.lists(st.floats(0.0, 1.0), min_size=len(CANDIDATES), max_size=len(CANDIDATES)),
    options=options_st,
)
@pytest.mark.slow  # statistical: the full check runs it
def test_rappor_report_intervals_contain_estimates(
    tmp_path: Path, seed: int, n: int, shares: list[float], options: DecodeOptions
) -> None:
    # Shares include values at and just past the detection threshold, where the
    # selection-adjusted interval used to lie wholly below its estimate.
    w = np.array(shares) ** 3 + 1e-12
    rng = np.random.default_rng(seed)
    totals, ones = simulate_rappor_counts(rng.multinomial(n, w / w.sum()), DESIGN, PARAMS, rng)
    job = ReportJob(metric=RAPPOR, totals=totals, ones=ones, candidates=CANDIDATES)
    check_printed_intervals(job, options, tmp_path / "out")


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    n=st.integers(1, 100_000),
    support=st.lists(st.floats(0.0, 1.0), min_size=6, max_size=6),
    options=options_st,
    project=st.booleans(),
)
def test_basic_report_intervals_contain_estimates(
    tmp_path: Path, n: int, support: list[float], options: DecodeOptions, project: bool
) -> None:
    # Arbitrary support counts: most k-RR estimates here are negative (the "[0, -60]" case).
    totals = np.array([n], dtype=np.int64)
    ones = np.floor(np.array(support) * n).astype(np.int64)[None, :]
    job = ReportJob(metric=KRR, totals=totals, ones=ones)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DecodeWarning)
        outcome = run_report(job, options=options, project=project, privacy={})
    write_outputs(outcome, tmp_path / "out", plot=False)
    assert check_printed_intervals(job, options, tmp_path / "out") == 6


def test_krr_negative_estimate_prints_a_real_interval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exact case once reported: k-RR printed "[0, -60]" for a negative estimate."""
    job = ReportJob(
        metric=KRR,
        totals=np.array([10_000]),
        ones=np.array([[4000, 3000, 2000, 1000, 200, 100]]),
    )
    outcome = run_report(job, privacy={})
    write_outputs(outcome, tmp_path, plot=False)
    rows = {r["value"]: r for r in csv.DictReader((tmp_path / "results.csv").open())}
    b5 = rows["b5"]
    assert float(b5["estimate"]) < 0
    assert float(b5["ci_low"]) <= float(b5["estimate"]) <= float(b5["ci_high"])


@pytest.mark.parametrize("interval", ["selective", "wald"])
def test_report_cli_interval_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], interval: str
) -> None:
    rng = np.random.default_rng(5)
    shares = np.array([0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0, 0, 0, 0, 0, 0], dtype=float)
    hashing_design = design_matrix(CANDIDATES, PARAMS, "rappor-md5")
    totals, ones = simulate_rappor_counts(
        rng.multinomial(50_000, shares / shares.sum()), hashing_design, PARAMS, rng
    )
    paths = [tmp_path / f"{n}.csv" for n in ("counts", "map", "params")]
    write_counts_csv(paths[0], totals, ones)
    write_map_csv(paths[1], list(CANDIDATES), PARAMS, "rappor-md5")
    write_params_csv(paths[2], PARAMS)
    out = tmp_path / "out"
    args = ["report", "--rappor-counts", str(paths[0]), "--rappor-map", str(paths[1])]
    args += ["--rappor-params", str(paths[2]), "--out", str(out), "--no-plot"]
    assert main([*args, "--interval", interval]) == 0
    printed = capsys.readouterr().out
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert {r["ci_method"] for r in rows if r["significant"] == "true"} == {interval}
    assert {r["ci_method"] for r in rows if r["significant"] == "false"} <= {"wald"}
    assert json.loads((out / "summary.json").read_text())["ci_method"] == interval
    for line in printed.splitlines()[2:]:
        m = ROW.match(line)
        if m:
            assert _num(m[3]) <= _num(m[2]) <= _num(m[4]), line
