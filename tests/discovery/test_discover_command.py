"""`crowdmix discover simulate` and the round job behind it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from crowdmix.aggregator.discovery import DiscoveryPlan, DiscoveryState
from crowdmix.aggregator.discovery.job import DiscoverySettings, absorb, round_params
from crowdmix.cli import main
from crowdmix.core.discovery import PrefixRound, SymbolMap, ValueRound

SM = SymbolMap(alphabet="abc", max_length=4)
PLAN = DiscoveryPlan(
    symbols=SM, spans=(2, 4, 5), keep=20, candidates=10, seeds=64, weights=(0.25,) * 4
)


def test_round_params_follow_the_plan_and_the_state() -> None:
    settings = DiscoverySettings(
        plan=PLAN, epsilon=1.0, delta=1e-6, devices=200_000, min_batch=25_000
    )
    eps0 = settings.epsilon0s()
    assert len(eps0) == 4 and len(set(eps0)) == 1  # every round planned over min_batch
    first = round_params(settings, DiscoveryState())
    assert isinstance(first, PrefixRound) and (first.start, first.stop) == (0, 2)
    with pytest.raises(ValueError, match="no complete value"):
        round_params(settings, DiscoveryState(next_round=3))
    done = DiscoveryState(next_round=3, harvest={SM.symbols("ab"): ((0, 0.5, 1e-4),)})
    last = round_params(settings, done)
    assert isinstance(last, ValueRound) and last.candidates == ("ab",)
    with pytest.raises(ValueError, match="finished"):
        round_params(settings, DiscoveryState(next_round=4))
    with pytest.raises(ValueError, match="counts must have"):
        absorb(settings, DiscoveryState(), np.zeros(3))


def test_discover_simulate_prints_values_and_the_privacy_statement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    values = tmp_path / "values.txt"
    values.write_text("ab\t50\nc\t30\nbca\t20\naaa\t5\ncab\t3\nb\t2\n")
    argv = [
        "discover", "simulate", "--values", str(values), "--devices", "40000",
        "--alphabet", "abc", "--max-length", "4", "--spans", "2,4,5", "--keep", "20",
        "--candidates", "10", "--seeds", "64", "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    found = [row["value"] for row in out["values"]]
    assert found[:3] == ["ab", "c", "bca"]
    assert out["privacy"]["epsilon"] <= 1.0 and out["privacy"]["delta"] == 1e-6
    assert [r["reports"] for r in out["rounds"]] == [10_000] * 4
    assert all(row["ci_low"] <= row["share"] <= row["ci_high"] for row in out["values"])


def test_discover_simulate_refuses_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.txt"
    bad.write_text("ab\tmany\n")
    assert main(["discover", "simulate", "--values", str(bad), "--devices", "100"]) == 1
    assert "not a number" in capsys.readouterr().err
    assert main(["discover", "simulate", "--values", str(bad), "--devices", "100",
                 "--spans", "3,2"]) == 1  # fmt: skip
    assert "spans" in capsys.readouterr().err


def test_the_round_job_commands_name_what_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import tomllib

    from tests.doc_pages import registry_example

    example = registry_example()
    assert "heavy-hitters" in tomllib.loads(example)["metrics"]["words"]["encoding"]
    config = tmp_path / "metrics.toml"
    config.write_text(example)
    rounds, state = tmp_path / "rounds.json", tmp_path / "state.json"
    job = ["--config", str(config), "--rounds", str(rounds), "--state", str(state)]
    assert main(["discover", "open", "--metric", "browser", *job]) == 1
    assert "is oue, not a heavy-hitters metric" in capsys.readouterr().err
    assert main(["discover", "step", "--metric", "words", "--redis", "memory://", *job]) == 1
    assert "no discovery state" in capsys.readouterr().err
    assert main(["discover", "open", "--metric", "words", *job]) == 0
    out = capsys.readouterr().out
    assert "words: round 0 (prefix symbols 0-3" in out and rounds.exists() and state.exists()
    assert main(["discover", "open", "--metric", "words", *job]) == 1
    assert "a discovery is under way" in capsys.readouterr().err
    assert main(["discover", "step", "--metric", "words", "--redis", "memory://", *job]) == 1
    assert "is not over" in capsys.readouterr().err


@pytest.mark.slow
def test_discover_demo_runs_through_the_daemons_and_finds_the_top_words(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The shipped word list, 40 000 devices in 4 rounds at central ε = 1: the 5 most
    frequent words hold 3.6% to 17% of the devices, each estimated to within ±0.5% (95%),
    far above the detection threshold; the population is seeded, the coins are not (a
    miss would take a 10-sigma error)."""
    assert main(["discover", "demo", "--seed", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    found = [row["value"] for row in out["values"]]
    assert {"the", "of", "and", "to", "a"} <= set(found)
    assert [r["round"] for r in out["rounds"]] == [0, 1, 2, 3]
    assert out["privacy"]["epsilon"] <= 1.0 + 1e-9
    assert out["ledger"]["releases"] == 4
    assert out["ledger"]["total_epsilon"] == pytest.approx(out["privacy"]["epsilon"])
