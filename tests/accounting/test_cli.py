"""``crowdmix privacy`` and ``crowdmix plan`` through the real command entry point."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from crowdmix.cli import main


def run(capsys: pytest.CaptureFixture[str], command: str, *args: str) -> tuple[int, str, str]:
    """``crowdmix`` with the words of ``command``, then ``args`` as they are (paths)."""
    code = main([*command.split(), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_amplify_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "privacy amplify --epsilon0 4 --n 100000 --delta 1e-6 --json")
    data = json.loads(out)
    assert code == 0
    assert {"epsilon", "delta", "bound", "amplified"} <= set(data)
    assert data["epsilon"] == pytest.approx(0.11815, abs=5e-6)
    assert data["bound"] == "generic" and data["amplified"] is True
    code, out, _ = run(capsys, "privacy amplify --epsilon0 4 --n 30 --bound fmt21-closed --json")
    assert json.loads(out)["amplified"] is False and json.loads(out)["epsilon"] == 4.0


def test_counts_accept_scientific_notation(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "privacy amplify --epsilon0 4 --n 1e5 --json")
    assert code == 0 and json.loads(out)["n"] == 100_000
    with pytest.raises(SystemExit):  # argparse usage error, exit 2
        main(["privacy", "amplify", "--epsilon0", "4", "--n", "1.5"])
    code, _, err = run(capsys, "privacy amplify --epsilon0 inf --n 10")
    assert code == 1 and "finite" in err


def test_amplify_rappor_from_params(capsys: pytest.CaptureFixture[str]) -> None:
    # ε0 defaults to ε_1 of the RAPPOR flags; the generic bound applies.
    code, out, _ = run(capsys, "privacy amplify --n 1000000 --json")
    data = json.loads(out)
    assert code == 0 and data["epsilon"] == pytest.approx(0.003872, abs=5e-7)
    assert data["bound"] == "generic" and "beta" not in data


def test_amplify_a_known_mechanism_prints_the_smaller_of_its_bounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    krr = "privacy amplify --mechanism krr --domain 32 --epsilon0 1"
    code, out, _ = run(capsys, f"{krr} --n 1e5 --lower --json")
    data = json.loads(out)
    assert code == 0 and data["bound"] == "blanket" and data["mechanism"] == "32-ary RR"
    assert data["epsilon"] == min(data["candidates"].values()) < data["candidates"]["generic"]
    assert 0 < data["rr_lower_bound"] <= data["epsilon"]
    # the RAPPOR report of the -k.. flags: ε0 is their ε_1, its blanket bound is tried
    code, out, _ = run(capsys, "privacy amplify --mechanism rappor --n 300")
    assert code == 0 and "RAPPOR report" in out and "candidates: generic" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("--mechanism oue", "needs --epsilon0"),
        ("--epsilon0 1 --domain 3", "--domain needs --mechanism"),
        ("--mechanism rappor --epsilon0 1", "not --epsilon0"),
        ("--mechanism krr --epsilon0 1 --bound fmt21", "--mechanism any only"),
        ("--mechanism krr --epsilon0 1 --domain 1", "domain_size"),
    ],
)
def test_amplify_refuses_an_inconsistent_mechanism(
    capsys: pytest.CaptureFixture[str], argv: str, message: str
) -> None:
    code, out, err = run(capsys, f"privacy amplify --n 100 {argv}")
    assert code == 1 and out == "" and message in err and "Traceback" not in err


@pytest.mark.parametrize("extra", ["--bound rappor", "--beta 0.19"])
def test_amplify_refuses_the_variation_ratio_bound(
    capsys: pytest.CaptureFixture[str], extra: str
) -> None:
    # It printed 0.002289 here; the (p, β, q) pair is not a dominating pair.
    code, out, err = run(capsys, f"privacy amplify --n 1000000 {extra}")
    assert code != 0 and out == ""
    assert err.startswith("crowdmix: error:") and "not a dominating pair" in err
    assert "Traceback" not in err


def test_compose_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "privacy compose --epsilon 0.5 --delta 1e-8 --releases 100 --target-delta 1e-6"
        " --method optimal --json",
    )
    assert code == 0 and json.loads(out)["epsilon"] == pytest.approx(42.6521, abs=5e-5)
    code, out, _ = run(capsys, "privacy compose --epsilon 0.5 --releases 100 --method basic --json")
    assert json.loads(out)["epsilon"] == 50.0


def test_metric_statement_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    config = tmp_path / "metrics.toml"
    config.write_text(
        '[metrics.pages]\nencoding = "rappor"\nk = 16\nh = 2\nm = 4\nf = 0.5\np = 0.5\nq = 0.75\n'
    )

    def pages(flags: str) -> tuple[int, str, str]:
        return run(capsys, f"privacy metric --metric pages {flags} --config", str(config))

    code, out, _ = pages("--n 100000 --rounds 4 --cohort-share 0.25 --batch-sizes 100000 --json")
    data = json.loads(out)
    assert code == 0
    assert data["central"]["n_amplify"] == 25_000
    assert data["longitudinal"]["rounds"] == 4
    code, out, _ = pages("--n 1000")
    assert code == 0 and "differentially private" in out
    code, out, _ = pages("--n 100000 --batch-sizes 60000,40000 --cohort-per-report --json")
    assert code == 0 and json.loads(out)["central"]["n_amplify"] == 40_000
    code, _, err = pages("--n 10 --batch-sizes a,b")
    assert code == 1 and "--batch-sizes" in err


def test_plan_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "plan --epsilon 1 --n 1000000 --candidates 100 --json")
    data = json.loads(out)
    assert code == 0 and data["meets_target"] is True
    assert set(data["params"]) == {"k", "h", "m", "f", "p", "q"}
    assert data["central"]["epsilon"] <= 1.0


def test_plan_prints_a_registry_block_that_loads_with_the_exact_params(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from crowdmix.core.params import RapporParams
    from crowdmix.core.registry import load_registry

    plan = "plan --epsilon 1 --n 1000000 --candidates 100"
    code, out, _ = run(capsys, f"{plan} --metric home_page")
    assert code == 0
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("[metrics."))
    pasted = tmp_path / "metrics.toml"
    pasted.write_text("\n".join(lines[start:]) + "\n")  # pasted as printed
    metric = load_registry(pasted)["home_page"]
    _, out, _ = run(capsys, f"{plan} --json")
    data = json.loads(out)
    assert metric.rappor == RapporParams(**data["params"])  # p and q exactly, not rounded
    assert data["registry"].startswith("[metrics.my_metric]\n")
    assert "over 1 release of" in lines[0]
    code, _, err = run(capsys, f"{plan} --metric", "bad name")
    assert code == 1 and "--metric 'bad name'" in err


def test_ledger_show(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from crowdmix.aggregator.accounting.ledger import PrivacyLedger, Release
    from crowdmix.aggregator.accounting.ledger_stores import JsonFileLedgerStore
    from tests.accounting.test_ledger import own_segment

    path = tmp_path / "ledger.json"
    PrivacyLedger(JsonFileLedgerStore(path)).record(
        "pages",
        Release(
            release_id="w1",
            window=1,
            n_reports=10,
            mechanism="rr",
            epsilon=0.3,
            delta=1e-9,
            fresh_randomness=True,
            segment=own_segment(0.3, 1e-9, "w1"),
        ),
    )
    code, out, _ = run(capsys, "privacy ledger --metric pages --json --file", str(path))
    assert code == 0 and json.loads(out)["cumulative"]["epsilon"] == 0.3


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("privacy amplify --epsilon0 -1 --n 10", "epsilon0"),
        ("privacy amplify --epsilon0 1 --n 10 --bound rappor", "removed"),
        ("privacy compose --epsilon 1 --delta 0.1 --releases 100", "target_delta"),
        ("privacy metric --config /nonexistent.toml --metric x --n 5", "does not exist"),
        ("plan --epsilon 1 --n 10 --candidates 0", "candidates"),
    ],
)
def test_user_errors_exit_1_with_a_message(
    capsys: pytest.CaptureFixture[str], argv: str, message: str
) -> None:
    code, _, err = run(capsys, argv)
    assert code == 1
    assert message in err and "Traceback" not in err


def test_entry_point_lists_privacy_and_plan() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "crowdmix", "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0
    assert "privacy" in result.stdout and "plan" in result.stdout


def test_compose_needs_releases(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "privacy compose --epsilon 0.5 --method basic")
    assert code == 1 and "--releases" in err


def test_metric_without_batch_sizes_assumes_one_batch_of_n(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "m.toml"
    config.write_text(
        '[metrics.pages]\nencoding = "rappor"\nk = 20\nh = 2\nm = 8\nf = 0.5\np = 0.5\n'
        "q = 0.75\n[metrics.pages.shuffle]\nmin_batch = 10\n"
    )

    def pages(flags: str = "") -> tuple[int, str, str]:
        return run(
            capsys, f"privacy metric --metric pages --n 100000 {flags} --config", str(config)
        )

    code, out, _ = pages()
    assert code == 0 and "too few" not in out and "assumed: all 100,000 reports" in out
    code, out, _ = pages("--json")
    one_batch = json.loads(out)
    assert one_batch["assumed_batch_sizes"] == [100000]
    code, out, _ = pages("--batch-sizes 100000 --json")
    given = json.loads(out)
    assert "assumed_batch_sizes" not in given
    assert given["central"] == one_batch["central"]
