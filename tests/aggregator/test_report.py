"""The report job: google/rappor files, `crowdmix report` end to end, outputs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.counting.files import save_counts
from crowdmix.aggregator.decode import design_matrix
from crowdmix.aggregator.decode.simulate import simulate_rappor_counts
from crowdmix.aggregator.report.job import RESULT_COLUMNS, ReportJob, read_candidates, run_report
from crowdmix.aggregator.report.rappor_files import (
    RapporFileError,
    read_counts_csv,
    read_map_csv,
    read_params_csv,
    write_counts_csv,
    write_map_csv,
    write_params_csv,
)
from crowdmix.cli import main
from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams
from crowdmix.core.privacy import epsilon_one
from crowdmix.core.registry import load_registry

PARAMS = RapporParams(k=16, h=2, m=8, p=0.25, q=0.75, f=0.5)
TRUE = [f"page-{i}" for i in range(6)]
SHARES = np.array([0.35, 0.25, 0.15, 0.12, 0.08, 0.05])
CANDIDATES = [*TRUE, "never-1", "never-2", "never-3"]

CONFIG = """
[metrics.pages]
encoding = "rappor"
hashing = "rappor-md5"
k = 16
h = 2
m = 8
f = 0.5
p = 0.25
q = 0.75

[metrics.pages_other]
encoding = "rappor"
hashing = "rappor-md5"
k = 16
h = 2
m = 8
f = 0.25
p = 0.25
q = 0.75

[metrics.browser]
encoding = "krr"
epsilon = 2.0
domain = ["chrome", "firefox", "safari", "edge"]
"""


def simulated_counts(n: int = 100_000, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = design_matrix(TRUE, PARAMS, "rappor-md5")
    return simulate_rappor_counts(rng.multinomial(n, SHARES), x, PARAMS, rng)


def write_rappor_files(tmp: Path, n: int = 100_000) -> tuple[Path, Path, Path]:
    totals, ones = simulated_counts(n)
    paths = tmp / "counts.csv", tmp / "map.csv", tmp / "params.csv"
    write_counts_csv(paths[0], totals, ones)
    write_map_csv(paths[1], CANDIDATES, PARAMS, "rappor-md5")
    write_params_csv(paths[2], PARAMS)
    return paths


def test_rappor_files_round_trip(tmp_path: Path) -> None:
    counts, map_, params = write_rappor_files(tmp_path)
    assert read_params_csv(params) == PARAMS
    totals, ones = read_counts_csv(counts, PARAMS)
    want_totals, want_ones = simulated_counts()
    np.testing.assert_array_equal(totals, want_totals)
    np.testing.assert_array_equal(ones, want_ones)
    values, x = read_map_csv(map_, PARAMS)
    assert values == CANDIDATES
    assert (x != design_matrix(CANDIDATES, PARAMS, "rappor-md5")).nnz == 0
    # google/rappor layout: N first, then bit 0..k-1; map entries cohort*k + bit + 1
    first = next(csv.reader(counts.open()))
    assert int(first[0]) == totals[0] and len(first) == PARAMS.k + 1
    row = next(csv.reader(map_.open()))
    assert len(row) == 1 + PARAMS.m * PARAMS.h
    assert all(1 <= int(e) <= PARAMS.k for e in row[1:3])  # cohort 0 rows


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("params", "k,h,m,p,q\n16,2,8,0.25,0.75\n", "header"),
        ("params", "k,h,m,p,q,f\n16,2,8,0.75,0.25,0.5\n", "p must be below q"),
        ("counts", "10," + ",".join(["1"] * 16) + "\n", "1 cohort rows"),
        ("counts", "\n".join(["10," + ",".join(["1"] * 15)] * 8) + "\n", "= 17 columns"),
        ("counts", "\n".join(["10," + ",".join(["11"] * 16)] * 8) + "\n", "between 0"),
        ("map", "a," + ",".join(["1"] * 15) + "\n", "expected m·h = 16"),
        ("map", "a," + ",".join(["200"] * 16) + "\n", "must be in"),
    ],
)
def test_bad_rappor_files_are_rejected(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    path = tmp_path / f"{name}.csv"
    path.write_text(content)
    with pytest.raises((RapporFileError, ValueError), match=message):
        if name == "params":
            read_params_csv(path)
        elif name == "counts":
            read_counts_csv(path, PARAMS)
        else:
            read_map_csv(path, PARAMS)
    with pytest.raises(RapporFileError, match="does not exist"):
        read_counts_csv(tmp_path / "nope.csv", PARAMS)


def test_report_cli_on_rappor_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    counts, map_, params = write_rappor_files(tmp_path)
    out = tmp_path / "out"
    code = main(
        [
            "report",
            "--rappor-counts", str(counts),
            "--rappor-map", str(map_),
            "--rappor-params", str(params),
            "--out", str(out),
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    assert code == 0
    assert "page-0" in printed.splitlines()[2]  # the biggest value tops the table
    assert "privacy:" in printed
    with (out / "results.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert tuple(rows[0]) == RESULT_COLUMNS
    by_value = {r["value"]: r for r in rows}
    assert by_value["page-0"]["significant"] == "true"
    assert by_value["never-1"]["significant"] == "false"
    est = float(by_value["page-0"]["estimate"])
    assert float(by_value["page-0"]["ci_low"]) <= est <= float(by_value["page-0"]["ci_high"])
    assert float(by_value["page-0"]["proportion"]) == pytest.approx(est / 100_000, rel=1e-4)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["reports"] == 100_000
    assert summary["detected"] == sum(r["significant"] == "true" for r in rows)
    assert 0 < summary["allocated_mass"] <= 1.2
    assert summary["privacy"]["local"]["epsilon_1"] == pytest.approx(epsilon_one(PARAMS))
    # google/rappor's pipeline has no shuffler: no amplification may be claimed.
    central = summary["privacy"]["statement"]["central"]
    assert central["amplified"] is False
    assert central["epsilon"] == pytest.approx(epsilon_one(PARAMS))
    assert summary["privacy"]["statement"]["batch"]["shuffled"] is False
    assert summary["elapsed_seconds"]["total"] > 0
    assert (out / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_cli_on_own_counts_and_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "metrics.toml"
    config.write_text(CONFIG)
    metric = load_registry(config)["pages"]
    totals, ones = simulated_counts()
    acc = accumulator_for(metric, totals=totals, ones=ones)
    counts = tmp_path / "pages.npz"
    save_counts(
        counts, acc, metric="pages", encoding="rappor", fingerprint=metric.fingerprint, window=3
    )
    cands = tmp_path / "candidates.txt"
    cands.write_text("\n".join(CANDIDATES) + "\n")
    out = tmp_path / "out"
    args = ["report", "--counts", str(counts), "--config", str(config), "--out", str(out)]
    assert main([*args, "--metric", "pages", "--candidates", str(cands), "--no-plot"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["window"] == 3 and summary["metric"] == "pages"
    assert not (out / "plot.png").exists()
    capsys.readouterr()
    # The same counts against a metric with other params: refused, not mis-decoded.
    code = main([*args, "--metric", "pages_other", "--candidates", str(cands)])
    assert code == 1
    assert "params mismatch" in capsys.readouterr().err
    assert main([*args, "--metric", "pages"]) == 1  # RAPPOR needs candidates
    assert "--candidates" in capsys.readouterr().err
    assert main([*args, "--metric", "nope", "--candidates", str(cands)]) == 1
    assert "not in" in capsys.readouterr().err


def test_report_cli_basic_mechanism(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "metrics.toml"
    config.write_text(CONFIG)
    metric = load_registry(config)["browser"]
    assert metric.basic is not None
    acc = accumulator_for(metric)
    rng = np.random.default_rng(3)
    p = metric.basic.keep_probability
    true = rng.choice(4, 20_000, p=[0.6, 0.3, 0.1, 0.0])
    other = rng.integers(0, 3, true.size)
    reported = np.where(rng.random(true.size) < p, true, other + (other >= true))
    acc.add(np.zeros(true.size, dtype=np.int64), reported.astype(np.uint8)[:, None])
    counts = tmp_path / "b.npz"
    save_counts(counts, acc, metric="browser", encoding="krr", fingerprint=metric.fingerprint)
    out = tmp_path / "out"
    base = ["report", "--counts", str(counts), "--config", str(config), "--metric", "browser"]
    # the file merges windows (none named): the statement needs to know how many
    assert main([*base, "--out", str(out), "--project"]) == 1
    assert "--rounds N" in capsys.readouterr().err
    code = main([*base, "--out", str(out), "--project", "--rounds", "3"])
    assert code == 0
    statement = json.loads((out / "summary.json").read_text())["privacy"]["statement"]
    assert statement["longitudinal"]["rounds"] == 3
    rows = list(csv.DictReader((out / "results.csv").open()))
    assert rows[0]["value"] == "chrome" and rows[0]["significant"] == "true"
    assert {r["value"] for r in rows} == {"chrome", "firefox", "safari", "edge"}
    assert sum(float(r["proportion"]) for r in rows) == pytest.approx(1.0)


def test_a_report_with_nothing_significant_succeeds_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    counts, map_, params = write_rappor_files(tmp_path)
    # Every bit set at exactly the rate of a Bloom 0 bit (p01 = 0.375): no value is there.
    write_counts_csv(counts, np.full(8, 1000), np.full((8, 16), 375))
    base = ["report", "--rappor-map", str(map_), "--rappor-params", str(params)]
    code = main([*base, "--rappor-counts", str(counts), "--out", str(tmp_path / "o1")])
    out, err = capsys.readouterr()
    assert code == 0  # an empty detection list is an answer: a scheduled job must not page
    assert "nothing detected: no candidate is significant" in out and "error" not in err
    assert json.loads((tmp_path / "o1" / "summary.json").read_text())["detected"] == 0
    assert (tmp_path / "o1" / "results.csv").exists()
    empty = tmp_path / "empty.csv"
    write_counts_csv(empty, np.zeros(8, np.int64), np.zeros((8, 16), np.int64))
    assert main([*base, "--rappor-counts", str(empty), "--out", str(tmp_path / "o2")]) == 1
    assert "no reports" in capsys.readouterr().err
    assert main(["report", "--out", str(tmp_path / "o3")]) == 1
    assert "give counts" in capsys.readouterr().err
    # google/rappor's counts.csv given as a crowdmix counts file: one line that says so,
    # without numpy's advice to load it "unsafely with allow_pickle"
    config = tmp_path / "metrics.toml"
    config.write_text(CONFIG)
    code = main(["report", "--counts", str(counts), "--config", str(config), "--metric",
                 "pages", "--out", str(tmp_path / "o4")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "is not a crowdmix counts file" in err and "--rappor-counts" in err
    assert "pickle" not in err
    assert main([*base, "--out", str(tmp_path / "o4")]) == 1
    assert "--rappor-counts" in capsys.readouterr().err


def test_run_report_takes_privacy_figures_from_a_function(tmp_path: Path) -> None:
    totals, ones = simulated_counts()
    config = tmp_path / "metrics.toml"
    config.write_text(CONFIG)
    metric = load_registry(config)["pages"]
    job = ReportJob(metric=metric, totals=totals, ones=ones, candidates=tuple(CANDIDATES))
    seen = []

    def figures(m: object, t: np.ndarray) -> dict[str, object]:
        seen.append(int(t.sum()))
        return {"custom": True}

    outcome = run_report(job, privacy=figures)
    assert seen == [100_000] and outcome.summary["privacy"] == {"custom": True}
    assert run_report(job, privacy={"x": 1}).summary["privacy"] == {"x": 1}


def test_read_candidates(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("a\r\nb\n\nc d\n")
    assert read_candidates(path) == ("a", "b", "c d")
    path.write_text("a\nb\na\n")
    with pytest.raises(ValueError, match="duplicate"):
        read_candidates(path)


def test_basic_params_in_summary(tmp_path: Path) -> None:
    params = BasicParams(mechanism="oue", epsilon=1.0, domain_size=3)
    from crowdmix.core.registry import MetricConfig

    metric = MetricConfig(name="o", basic=params, domain=("x", "y", "z"))
    job = ReportJob(metric=metric, totals=np.array([1000]), ones=np.array([[700, 300, 200]]))
    outcome = run_report(job)
    assert outcome.summary["params"] == {"epsilon": 1.0, "domain_size": 3}
    assert outcome.result.values == ("x", "y", "z")


def test_a_statement_that_cannot_be_computed_stops_the_report_unless_left_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release is never published with its privacy guarantee silently missing."""
    import crowdmix.aggregator.accounting

    config = tmp_path / "metrics.toml"
    config.write_text(CONFIG)
    metric = load_registry(config)["pages"]
    totals, ones = simulated_counts()
    counts = tmp_path / "pages.npz"
    save_counts(
        counts,
        accumulator_for(metric, totals=totals, ones=ones),
        metric="pages",
        encoding="rappor",
        fingerprint=metric.fingerprint,
        window=3,
    )
    cands = tmp_path / "candidates.txt"
    cands.write_text("\n".join(CANDIDATES) + "\n")

    def broken(*_args: object, **_kwargs: object) -> None:
        raise ValueError("no crowd can be bounded")

    monkeypatch.setattr(crowdmix.aggregator.accounting, "privacy_statement", broken)
    base = ["report", "--counts", str(counts), "--config", str(config), "--metric", "pages"]
    base += ["--candidates", str(cands), "--no-plot"]
    assert main([*base, "--out", str(tmp_path / "refused")]) == 1
    err = capsys.readouterr().err
    assert "cannot state the privacy guarantee: no crowd can be bounded" in err
    assert "--no-privacy-statement" in err
    assert not (tmp_path / "refused" / "summary.json").exists()

    assert main([*base, "--out", str(tmp_path / "out"), "--no-privacy-statement"]) == 0
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["privacy"]["statement"] is None
    assert "--no-privacy-statement" in summary["privacy"]["text"]
    assert "privacy: no privacy statement" in capsys.readouterr().out
