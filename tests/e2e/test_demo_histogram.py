"""``crowdmix demo --encoding shuffled-histogram``: seeded devices, sealed, one call per
device through the real shuffler and aggregator (in process, real gRPC on loopback);
the counts equal what was sent, the decoded histogram covers the truth, and the
statement gives both figures. ``--plaintext`` is refused with one line."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from crowdmix.cli import build_parser
from crowdmix.demo_histogram import run_histogram_demo
from tests.client.bitsources import SeededBits


@pytest.mark.slow  # a whole demo run in process: seconds, left to the full check
def test_histogram_demo_counts_exactly_and_states_both_figures(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            "demo", "--encoding", "shuffled-histogram", "--clients", "3000", "--seed", "5",
            "--values", "10", "--decoys", "5", "--out", str(tmp_path / "out"),
        ]
    )  # fmt: skip
    ids = random.Random(9)
    demo = run_histogram_demo(
        args, quiet=True, rand=SeededBits(21), random_bytes=lambda n: ids.randbytes(n)
    )
    # what the aggregator counted per value is exactly what the devices sent
    assert demo.counted_counts == demo.sent_counts
    assert sum(demo.sent_counts) == demo.acknowledged
    params = demo.metric.histogram
    assert params is not None
    assert 3000 <= demo.acknowledged <= 3000 * params.max_messages

    result = demo.outcome.result
    index = {v: i for i, v in enumerate(result.values)}
    # Unbiased estimates with exact standard errors: each of the 15 values within 5.5
    # of them. Seeded, so deterministic; with another seed P(false failure) <=
    # 15 * P(|Z| > 5.5) ~ 6e-7 under the normal approximation.
    for v, i in index.items():
        truth = demo.truth.get(v, 0.0)
        assert abs(result.proportion[i] - truth) <= 5.5 * result.std_error[i], v

    summary = json.loads(demo.paths["summary"].read_text())
    statement = summary["privacy"]["statement"]
    assert statement["encoding"] == "shuffled-histogram"
    assert statement["sealed"] is True
    # both figures: a central one from the exact accounting, the local one of k-RR
    central = statement["central"]["epsilon"]
    local = statement["colluding_local_epsilon"]
    assert local == params.local_epsilon
    assert central is not None and 0 < central <= local
    # the device count is never overstated: a lower bound below the devices that sent
    assert statement["honest_lower_bound"] <= 3000
    assert statement["smallest_batch"] == demo.acknowledged  # one batch: the window
    assert "Shuffler + aggregator colluding" in summary["privacy"]["text"]
    # its plot: shares of devices, estimated from the reports the aggregator counted
    from crowdmix.aggregator.report.job import report_plot_layout

    layout = report_plot_layout(demo.outcome)
    assert layout.xlabel.startswith("share of devices")
    assert layout.subtitle.startswith(f"{demo.acknowledged:,} reports from an estimated ")
    assert demo.paths["plot"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert np.isclose(sum(demo.truth.values()), 1.0)


def test_histogram_demo_refuses_plaintext_with_one_line(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable, "-m", "crowdmix", "demo", "--encoding", "shuffled-histogram",
            "--plaintext", "--out", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert "--plaintext" in lines[0] and "sealed" in lines[0]


def test_histogram_demo_command_prints_the_table_and_both_figures(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable, "-m", "crowdmix", "demo", "--encoding", "shuffled-histogram",
            "--clients", "1500", "--values", "8", "--decoys", "2", "--out", str(tmp_path),
        ],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "95% CI" in run.stdout and "total variation" in run.stdout
    assert "Privacy:" in run.stdout and "Shuffler + aggregator colluding" in run.stdout
    assert (tmp_path / "results.csv").is_file()
