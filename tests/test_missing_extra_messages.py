"""A command missing an optional dependency names every extra it needs at once (not the
extra of whichever package happened to be imported first: `[sim]`, then `[aggregator]`)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from crowdmix.cli import COMMAND_EXTRAS, build_parser

ROOT = Path(__file__).resolve().parents[1]


def test_every_command_but_info_names_its_extras_and_they_exist() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    commands = set(sub.choices or ()) - {"info"}  # info needs nothing beyond the core
    assert set(COMMAND_EXTRAS) == commands
    for needed in COMMAND_EXTRAS.values():
        assert set(needed.split(",")) <= set(extras), needed


@pytest.mark.slow  # a subprocess each, with a package hidden
@pytest.mark.parametrize(
    ("hidden", "argv", "extras"),
    [
        ("numpy", ["report", "--counts", "c.npz", "--config", "m.toml", "--metric", "x",
                   "--out", "o"], "aggregator"),
        ("scipy", ["report", "--counts", "c.npz", "--config", "m.toml", "--metric", "x",
                   "--out", "o"], "aggregator"),
        ("numpy", ["demo", "--clients", "100"], "shuffler,aggregator"),
        ("numpy", ["simulate", "--target", "127.0.0.1:1", "--config", "m.toml",
                   "--metric", "x"], "sim,transport"),
    ],
)  # fmt: skip
def test_a_missing_package_names_all_the_extras_the_command_needs(
    tmp_path: Path, hidden: str, argv: list[str], extras: str
) -> None:
    (tmp_path / "m.toml").write_text(
        '[metrics.x]\nencoding = "krr"\nepsilon = 1.0\ndomain = ["a", "b"]\n'
    )
    code = (
        f"import sys\nsys.modules[{hidden!r}] = None  # as if not installed\n"
        f"from crowdmix.cli import main\nsys.exit(main({argv!r}))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert r.returncode == 3, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert f"crowdmix {argv[0]} needs crowdmix[{extras}]" in line
    assert f"the '{hidden}' package is missing" in line
    assert line.endswith(f"pip install 'crowdmix[{extras}]'")
