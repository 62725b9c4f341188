"""plot.png: both answers drawn, a log axis for a long tail (or as asked), the metric,
its windows with their dates and the release's ε in the title, and what the shares are
of (reports, or a shuffled histogram's estimated devices)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from crowdmix.aggregator.decode.result import DecodeResult
from crowdmix.aggregator.report.job import plot_title
from crowdmix.aggregator.report.plot import plot_estimates, plot_layout


def _result(shares: list[float], *, distribution: bool = True) -> DecodeResult:
    p = np.array(shares, dtype=np.float64)
    se = np.full_like(p, 0.001)
    return DecodeResult(
        values=tuple(f"v{i}" for i in range(p.size)),
        proportion=p,
        std_error=se,
        ci_low=p - 2 * se,
        ci_high=p + 2 * se,
        p_value=np.where(p > 0.01, 1e-9, 0.5),
        significant=p > 0.01,
        num_reports=1,
        num_cohorts=1,
        detection_threshold=0.01,
        method="test",
        distribution=np.clip(p, 0, None) if distribution else None,
        distribution_low=np.clip(p - 0.002, 0, None) if distribution else None,
        distribution_high=p + 0.002 if distribution else None,
    )


def test_a_long_tail_is_drawn_on_a_log_axis_unless_asked_otherwise() -> None:
    tail = _result([0.6, 0.3, 0.05, 0.004, 0.001])  # 600 times apart
    flat = _result([0.3, 0.25, 0.25, 0.2])
    assert plot_layout(tail).log and not plot_layout(flat).log
    assert not plot_layout(tail, scale="linear").log and plot_layout(flat, scale="log").log
    assert "log scale" in plot_layout(tail).xlabel
    with pytest.raises(ValueError, match="scale"):
        plot_layout(flat, scale="sqrt")


def test_the_distribution_answer_is_drawn_when_the_decoder_gives_it(tmp_path: Path) -> None:
    layout = plot_estimates(_result([0.6, 0.3, 0.1]), tmp_path / "p.png")
    assert layout.distribution and "distribution answer" in layout.subtitle
    assert (tmp_path / "p.png").stat().st_size > 1000
    assert not plot_layout(_result([0.6, 0.4], distribution=False)).distribution
    # a log axis with estimates at or below 0 still draws
    tiny = _result([0.9, 0.001, 0.0, -0.002])
    plot_estimates(tiny, tmp_path / "q.png", plot_layout(tiny, scale="log"))


def test_the_shares_of_a_histogram_are_of_devices_estimated_from_reports() -> None:
    result = _result([0.5, 0.5])
    layout = plot_layout(result, subject="devices", total_reports=3)
    assert layout.subtitle.startswith("3 reports from an estimated 1 device ·")
    assert layout.xlabel.startswith("share of devices (%)")
    assert plot_layout(result).subtitle.startswith("1 report · 2 of 2 candidates")


def test_the_title_names_the_windows_with_dates_and_the_epsilon() -> None:
    summary = {
        "metric": "home_page",
        "window": 20400,
        "windows": [20400],
        "window_seconds": 86400,
        "privacy": {
            "local": {"epsilon_1": 3.0},
            "statement": {
                "central": {"epsilon": 0.96412, "delta": 1e-6},
                "longitudinal": {"rounds": 1, "epsilon": 0.96412, "delta": 1e-6},
                "batch": {"shuffled": True},
            },
        },
    }
    assert plot_title(summary) == (
        "home_page · window 20400 (2025-11-08) · central ε = 0.9642, δ = 1e-06"
    )
    week = {**summary, "window": None, "windows": list(range(20400, 20407))}
    week["privacy"] = {
        "statement": {**summary["privacy"]["statement"],  # type: ignore[dict-item]
                      "longitudinal": {"rounds": 7, "epsilon": 2.5, "delta": 7e-6}},
    }  # fmt: skip
    assert plot_title(week) == (
        "home_page · windows 20400-20406 (2025-11-08 to 2025-11-14) · ε = 2.500 over 7 windows, "
        "δ = 7e-06"
    )
    bare = {"metric": "m", "privacy": {"statement": None}}
    assert plot_title(bare) == "m · no privacy statement"


def test_report_draws_the_plot_on_the_scale_asked(tmp_path: Path) -> None:
    from crowdmix.aggregator.counting import accumulator_for
    from crowdmix.aggregator.counting.files import save_counts
    from crowdmix.cli import main
    from crowdmix.core.registry import load_registry

    config = tmp_path / "metrics.toml"
    config.write_text(
        '[metrics.b]\nencoding = "krr"\nepsilon = 4.0\ndomain = ["x", "y", "z", "w"]\n'
    )
    metric = load_registry(config)["b"]
    counts = accumulator_for(
        metric, totals=np.array([20000]), ones=np.array([[15000, 4000, 700, 300]])
    )
    save_counts(tmp_path / "c.npz", counts, metric="b", encoding="krr",
                fingerprint=metric.fingerprint, window=20400, windows=[20400])  # fmt: skip
    argv = ["report", "--counts", str(tmp_path / "c.npz"), "--config", str(config),
            "--metric", "b", "--out", str(tmp_path / "o"), "--plot-scale", "log"]  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(argv) == 0
    assert (tmp_path / "o" / "plot.png").stat().st_size > 1000
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["window_seconds"] == 86400
    assert plot_title(summary).startswith("b · window 20400 (2025-11-08) · ")
