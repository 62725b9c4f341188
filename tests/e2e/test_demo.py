"""``crowdmix demo`` at a small size: the whole pipeline in one process decodes the
truth, writes its outputs and states the privacy guarantee."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np

from crowdmix.aggregator.report.job import RESULT_COLUMNS
from crowdmix.cli import build_parser
from crowdmix.demo import run_demo
from tests.client.bitsources import SeededBytes


def _args(tmp_path: Path, *extra: str) -> object:
    return build_parser().parse_args(
        ["demo", "--clients", "30000", "--seed", "7", "--out", str(tmp_path / "out"), *extra]
    )


def test_demo_decodes_the_truth_within_its_intervals(tmp_path: Path) -> None:
    rng = random.Random(11)
    demo = run_demo(
        _args(tmp_path),  # type: ignore[arg-type]
        quiet=True,
        byte_source=SeededBytes(12),
        new_secret=lambda: rng.randbytes(32),
    )
    result = demo.outcome.result
    assert demo.acknowledged == 30000
    assert demo.counted + demo.held_back == 30000
    assert result.num_reports == demo.counted
    # The five most frequent true values are detected, and each estimate is within
    # 5.5 standard errors of the truth. Seeded, so deterministic; were the seed
    # changed, P(false failure) <= 5 * P(|Z| > 5.5) ~ 2e-7 for the normal estimate
    # (a missed detection of a >= 3.9% value at these params is rarer still).
    top_true = sorted(demo.truth, key=lambda v: -demo.truth[v])[:5]
    index = {v: i for i, v in enumerate(result.values)}
    for v in top_true:
        i = index[v]
        assert result.significant[i], v
        assert abs(result.proportion[i] - demo.truth[v]) <= 5.5 * result.std_error[i], v
    # Decoys nobody holds get no mass beyond 6 standard errors: for an unbiased
    # estimate of 0, P(false failure) <= 20 * P(Z > 6) ~ 2e-8.
    decoys = [i for v, i in index.items() if v.startswith("decoy-")]
    assert np.all(result.proportion[decoys] <= 6 * result.std_error[decoys] + 1e-12)
    assert demo.total_variation < 0.2

    paths = demo.paths
    assert {"results", "summary", "plot"} <= set(paths)
    header = paths["results"].read_text().splitlines()[0]
    assert header == ",".join(RESULT_COLUMNS)
    # the first eight columns keep their order for existing readers
    assert header.startswith(
        "value,estimate,std_error,ci_low,ci_high,proportion,p_value,significant,"
    )
    summary = json.loads(paths["summary"].read_text())
    assert summary["demo"]["clients"] == 30000
    assert summary["demo"]["truth"]["v1"] == demo.truth["v1"]
    privacy = summary["privacy"]
    # The central figure never exceeds the local one; whether shuffling improves on it
    # depends on the smallest same-cohort crowd of the released batches (sealed devices
    # are slower, so the demo's shuffler may release several smaller batches).
    assert privacy["local"]["epsilon_1"] >= privacy["statement"]["central"]["epsilon"] > 0
    assert "locally differentially private" in privacy["text"]
    # The central figure rests on the batches the shuffler actually released.
    assert privacy["statement"]["batch"]["assumed_min_batch"] is False
    assert sum(privacy["statement"]["batch"]["sizes"]) == demo.counted
    assert privacy["statement"]["batch"]["smallest_crowd_measured"] is True
    assert paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_plot_draws_intervals_that_exclude_their_estimate(tmp_path: Path) -> None:
    # Selection-adjusted intervals near the detection cutoff may lie wholly below the
    # estimate; the plot must draw them as they are (this crashed an unseeded run).
    from crowdmix.aggregator.decode.result import DecodeResult
    from crowdmix.aggregator.report.job import ReportOutcome
    from crowdmix.demo import _plot_against_truth

    result = DecodeResult(
        values=("a", "b"),
        proportion=np.array([0.5, 0.02]),
        std_error=np.array([0.01, 0.01]),
        ci_low=np.array([0.48, 0.0]),
        ci_high=np.array([0.52, 0.015]),  # b's interval lies below its estimate
        p_value=np.array([0.0, 0.01]),
        significant=np.array([True, True]),
        num_reports=1000,
        num_cohorts=1,
        detection_threshold=0.01,
        method="test",
    )
    path = tmp_path / "plot.png"
    _plot_against_truth(ReportOutcome(result, {}), {"a": 0.5, "b": 0.01}, path, top=5)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_seals_by_default_and_says_who_learns_what(tmp_path: Path) -> None:
    sealed = run_demo(_args(tmp_path / "s", "--clients", "3000"), quiet=True)  # type: ignore[arg-type]
    plain = run_demo(_args(tmp_path / "p", "--clients", "3000", "--plaintext"), quiet=True)  # type: ignore[arg-type]
    assert sealed.outcome.summary["demo"]["sealed"] is True
    assert plain.outcome.summary["demo"]["sealed"] is False
    assert sealed.counted + sealed.held_back == plain.counted + plain.held_back == 3000
    s_text = sealed.outcome.summary["privacy"]["text"]
    p_text = plain.outcome.summary["privacy"]["text"]
    assert "the shuffler alone learns only metadata" in s_text
    assert "the shuffler alone learns each report beside the connection" in p_text
    # (batch cuts depend on timing, so the figures are compared in
    # tests/accounting/test_sealed_statement.py, on equal inputs)
