"""google/rappor users at home: its files read as rappor reads them, its output beside ours."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from crowdmix.aggregator.decode.rappor import design_matrix
from crowdmix.aggregator.report.rappor_files import RapporFileError, read_counts_csv, read_map_csv
from crowdmix.aggregator.report.rappor_output import RAPPOR_COLUMNS
from crowdmix.cli import main
from crowdmix.core.privacy import epsilon_inf, epsilon_one
from tests.aggregator.test_report import CANDIDATES, PARAMS, write_rappor_files


def _run(tmp: Path, *extra: str) -> tuple[int, Path]:
    counts, map_, params = tmp / "counts.csv", tmp / "map.csv", tmp / "params.csv"
    out = tmp / "out"
    code = main(
        ["report", "--rappor-counts", str(counts), "--rappor-map", str(map_),
         "--rappor-params", str(params), "--out", str(out), "--no-plot", *extra]
    )  # fmt: skip
    return code, out


def test_a_header_row_in_the_map_is_skipped_not_a_candidate(tmp_path: Path) -> None:
    _, map_, _ = write_rappor_files(tmp_path, n=1000)
    rows = map_.read_text()
    header = "string," + ",".join(f"h{i}" for i in range(PARAMS.m * PARAMS.h)) + "\n"
    map_.write_text(header + rows)
    notes: list[str] = []
    values, x = read_map_csv(map_, PARAMS, notes)
    assert values == CANDIDATES and x.shape[1] == len(CANDIDATES)
    assert "header" in notes[0]


def test_repeated_map_values_keep_their_first_row_as_rappor_does(tmp_path: Path) -> None:
    _, map_, _ = write_rappor_files(tmp_path, n=1000)
    lines = map_.read_text().splitlines()
    first = lines[0].split(",")
    other = ",".join([first[0], *lines[1].split(",")[1:]])  # same value, other bits: dropped
    map_.write_text("\n".join([*lines, other, ",".join(["", *first[1:]])]) + "\n")
    notes: list[str] = []
    values, x = read_map_csv(map_, PARAMS, notes)
    assert values == [*CANDIDATES, "Empty"]  # an empty value is named "Empty", as in rappor
    first_bits = design_matrix(CANDIDATES[:1], PARAMS, "rappor-md5")
    assert (x[:, 0] != first_bits).nnz == 0  # the first row's bits, not the repeat's
    assert "repeated" in notes[0] and first[0] in notes[0]


def test_a_multiple_of_m_count_rows_is_summed_per_cohort(tmp_path: Path) -> None:
    counts, _, _ = write_rappor_files(tmp_path, n=10_000)
    totals, ones = read_counts_csv(counts, PARAMS)
    rows = counts.read_text().splitlines()
    # google/rappor's AdjustCounts: row r adds to cohort r mod m
    counts.write_text("\n".join(rows + rows + rows) + "\n")
    t3, o3 = read_counts_csv(counts, PARAMS)
    np.testing.assert_array_equal(t3, 3 * totals)
    np.testing.assert_array_equal(o3, 3 * ones)
    counts.write_text("\n".join(rows + rows[:3]) + "\n")
    with pytest.raises(RapporFileError, match="multiple of m"):
        read_counts_csv(counts, PARAMS)


@pytest.mark.parametrize("cell", ["12.5", "1e400", "twelve"])
def test_non_integer_counts_are_refused_not_truncated(tmp_path: Path, cell: str) -> None:
    counts, _, _ = write_rappor_files(tmp_path, n=1000)
    rows = counts.read_text().splitlines()
    cells = rows[2].split(",")
    cells[1] = cell
    rows[2] = ",".join(cells)
    counts.write_text("\n".join(rows) + "\n")
    with pytest.raises(RapporFileError, match="line 3"):
        read_counts_csv(counts, PARAMS)
    rows[2] = ",".join(c + ".0" for c in counts.read_text().splitlines()[0].split(","))
    counts.write_text("\n".join(rows) + "\n")
    read_counts_csv(counts, PARAMS)  # "12.0" is a whole number, as R may write it


@pytest.mark.parametrize(
    "flag", [("--rounds", "2"), ("--windows", "1"), ("--config", "x.toml"), ("--candidates", "c")]
)
def test_flags_that_rappor_files_ignore_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: tuple[str, str]
) -> None:
    write_rappor_files(tmp_path, n=1000)
    code, _ = _run(tmp_path, *flag)
    assert code == 1 and flag[0] in capsys.readouterr().err


def test_format_rappor_writes_rappors_results_metrics_and_residual(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_rappor_files(tmp_path)
    code, out = _run(tmp_path, "--format", "rappor")
    assert code == 0
    ours = {r["value"]: r for r in csv.DictReader((out / "results.csv").open())}
    with (out / "rappor" / "results.csv").open() as fh:
        reader = csv.DictReader(fh)
        assert tuple(reader.fieldnames or ()) == RAPPOR_COLUMNS
        rows = list(reader)
    detected = {v for v, r in ours.items() if r["significant"] == "true"}
    assert [r["string"] for r in rows] == sorted(
        detected, key=lambda v: -float(ours[v]["estimate"])
    )
    # (which strings are detected is the decoder's business, tested elsewhere: at the
    # default BH 0.1 a false discovery here is allowed, so none is asserted absent)
    for r in rows:
        n = 100_000
        est, std = int(r["estimate"]), int(r["std_error"])
        assert est == int(float(ours[r["string"]]["estimate"]))  # floor, as rappor
        assert float(r["proportion"]) == pytest.approx(est / n)
        assert float(r["prop_std_error"]) == pytest.approx(std / n)
        low, high = float(r["prop_low_95"]), float(r["prop_high_95"])
        assert low == pytest.approx(max(est / n - 1.96 * std / n, 0))
        assert low <= float(r["proportion"]) <= high <= 1
    metrics = json.loads((out / "rappor" / "metrics.json").read_text())
    assert set(metrics) == {
        "sample_size", "allocated_mass", "num_detected", "explained_var", "missing_var",
        "total_elapsed_time",
    }  # fmt: skip
    assert metrics["sample_size"] == 100_000 and metrics["num_detected"] == len(rows)
    # the true values explain nearly all the variance of the bit estimates
    assert 0.9 < metrics["explained_var"] <= 1.0
    assert (out / "rappor" / "residual.png").read_bytes()[:4] == b"\x89PNG"


def test_unshuffled_rappor_files_state_local_figures_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_rappor_files(tmp_path)
    code, out = _run(tmp_path)
    assert code == 0
    text = json.loads((out / "summary.json").read_text())["privacy"]["text"]
    assert f"{epsilon_one(PARAMS):.4g}" in text and f"{epsilon_inf(PARAMS):.4g}" in text
    for word in ("batch", "crowd", "Shuffling", "cohort", "collude"):
        assert word not in text, text
