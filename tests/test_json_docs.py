"""docs/json.md lists exactly the keys each `--json` command prints."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "json.md").read_text()


def _sections() -> dict[str, tuple[str, set[str], set[str]]]:
    """title -> (command line, keys, optional keys)."""
    out = {}
    for block in re.split(r"^## ", DOC, flags=re.M)[1:]:
        title = block.splitlines()[0].strip()
        command = re.search(r"^    (crowdmix .+)$", block, flags=re.M)
        assert command, title
        keys, optional = set(), set()
        for key, meaning in re.findall(r"^\| `([^`]+)` \| (.*) \|$", block, flags=re.M):
            keys.add(key)
            if "*optional*" in meaning:
                optional.add(key)
        out[title] = (command.group(1), keys, optional)
    return out


SECTIONS = _sections()


def _keys(obj: dict[str, Any]) -> set[str]:
    keys = set()
    for k, v in obj.items():
        keys.add(k)
        if isinstance(v, dict):
            keys |= {f"{k}.{kk}" for kk in v}
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            keys.discard(k)
            keys |= {f"{k}[].{kk}" for x in v for kk in x}
    return keys


def test_counts_list_keys_match_the_doc() -> None:
    _, keys, _ = SECTIONS["crowdmix counts list --json"]
    sample = {"store": "u", "metrics": [{"metric": "m", "encoding": "rappor", "windows": [1],
                                         "window_seconds": 86400, "window_dates": ["x"],
                                         "reports": 1, "batches": 1}]}  # fmt: skip
    assert (
        _keys(sample) == keys
    )  # the real output is checked in tests/e2e/test_operator_commands.py


def _printed(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str:
    """What ``crowdmix ARGV`` prints, run from the repository (the documented paths are
    relative to it) through ``crowdmix.cli.main``: the command's own code, without a
    new interpreter per case (tests/test_smoke.py starts one)."""
    import contextlib
    import io

    from crowdmix.cli import main

    monkeypatch.chdir(ROOT)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    assert code == 0, err.getvalue()
    return out.getvalue()


@pytest.mark.slow  # computes the privacy figures of each example: the full check runs it
@pytest.mark.parametrize(
    "title", [t for t in SECTIONS if "URL" not in SECTIONS[t][0] and "DIR" not in SECTIONS[t][0]]
)
def test_documented_keys_are_the_printed_keys(title: str, monkeypatch: pytest.MonkeyPatch) -> None:
    command, documented, optional = SECTIONS[title]
    argv = shlex.split(command)[1:]
    printed = _keys(json.loads(_printed(argv, monkeypatch)))
    # a documented list of objects may be empty in the example (ledger releases)
    assert printed <= documented, sorted(printed - documented)
    assert documented - optional <= printed, sorted(documented - optional - printed)


def test_summary_json_top_level_keys_match_the_doc(tmp_path: Path) -> None:
    """A one-window krr release from a counts file: its summary.json has exactly the
    documented top-level keys, and ``window`` names its one window."""
    import contextlib
    import io

    import numpy as np

    from crowdmix.aggregator.counting import accumulator_for
    from crowdmix.aggregator.counting.files import save_counts
    from crowdmix.cli import main
    from crowdmix.core.registry import load_registry

    config = tmp_path / "metrics.toml"
    config.write_text(
        '[metrics.b]\nencoding = "krr"\nepsilon = 2.0\ndomain = ["x", "y", "z"]\n'
        "[metrics.b.shuffle]\nmin_batch = 100\n"
    )
    metric = load_registry(config)["b"]
    counts = accumulator_for(metric, totals=np.array([600]), ones=np.array([[400, 100, 100]]))
    path = tmp_path / "c.npz"
    save_counts(
        path, counts, metric="b", encoding="krr", fingerprint=metric.fingerprint, window=20400,
        windows=[20400], batch_sizes=[600], smallest_crowd=600, sealed=True,
    )  # fmt: skip
    with contextlib.redirect_stdout(io.StringIO()):
        argv = ["report", "--counts", str(path), "--config", str(config), "--metric", "b"]
        assert main([*argv, "--out", str(tmp_path / "o"), "--no-plot"]) == 0
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    _, documented, _ = SECTIONS["summary.json of crowdmix report"]
    assert set(summary) == documented
    assert summary["window"] == 20400 and summary["windows"] == [20400]
    assert summary["privacy"]["statement"]["sealed"] is True
