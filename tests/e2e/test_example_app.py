"""examples/daily_setting.py, as the README walks through it, against real daemons:
Redis, ``crowdmix shuffler serve`` with the aggregator's public key,
``crowdmix aggregator serve``; each run of the example is a separate process."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crowdmix.cluster import LocalCluster, free_port
from tests.daemons import counted, local_cluster
from tests.waiting import eventually

pytestmark = pytest.mark.slow  # real processes or servers, seconds each

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "daily_setting.py"
REGISTRY = """
[metrics.theme]
encoding = "krr"
epsilon = 2.0
domain = ["light", "dark", "system"]
[metrics.theme.shuffle]
min_batch = 1
max_delay_seconds = 0.1
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("example-app"), REGISTRY, shufflers=1) as c:
        yield c


def _run(app: Path, target: str, token_file: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--app-dir", str(app), "--shuffler", target,
         "--token-file", str(token_file), "--insecure", *extra],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )  # fmt: skip


def test_the_example_reports_once_a_day_and_delivers_what_waited(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    token = tmp_path / "token.txt"
    token.write_text(cluster.token + "\n")
    target = cluster.shuffler_targets[0]
    offline = f"127.0.0.1:{free_port()}"  # nothing listens: a device without network
    # at build time: the config the app ships
    bundle = tmp_path / "crowdmix-config.pb"
    export = subprocess.run(
        [sys.executable, "-m", "crowdmix", "config", "export", "--shuffler", target,
         "--token-file", str(token), "--insecure", "--out", str(bundle)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert export.returncode == 0, export.stderr
    config = ("--config", str(bundle))

    # device 1, online: one report, delivered; a second start the same day makes none
    first = _run(tmp_path / "d1", target, token, *config, "--theme", "dark")
    assert first.returncode == 0, first.stderr
    assert "reported theme for this window" in first.stdout
    assert "0 report(s) waiting" in first.stdout
    again = _run(tmp_path / "d1", target, token, *config, "--theme", "light")
    assert "no new report" in again.stdout and again.returncode == 0

    # device 2: its first start is offline: the bundled config makes the report, which
    # waits encoded on disk and leaves at the next start
    cold = _run(tmp_path / "d2", offline, token, *config, "--theme", "light")
    assert "reported theme for this window" in cold.stdout and cold.returncode == 0
    assert "1 report(s) waiting" in cold.stdout
    warm = _run(tmp_path / "d2", target, token, *config, "--theme", "light")
    assert "no new report" in warm.stdout and "0 report(s) waiting" in warm.stdout

    # device 3, offline without a bundled config: no config, so no report and no claim
    bare = _run(tmp_path / "d3", offline, token, "--theme", "light")
    assert "no config yet, no report made" in bare.stdout and bare.returncode == 0

    # bad input: one line, a failing exit, no traceback
    bad = _run(tmp_path / "d6", target, token, *config, "--theme", "purple")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr and "purple" in bad.stderr
    missing = _run(tmp_path / "d7", target, tmp_path / "nope.txt", "--theme", "dark")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    url = _run(tmp_path / "d8", f"http://{target}", token, "--theme", "dark")
    assert url.returncode == 2 and "without a scheme" in url.stderr, url.stderr

    expected = 2  # d1 and d2, once each
    eventually(lambda: counted(cluster, "theme") >= expected, 60, 0.1)
    time.sleep(0.5)
    assert counted(cluster, "theme") == expected
