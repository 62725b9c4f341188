"""The TypeScript SDK (sdk/typescript) through the real daemons: Node processes report
through a ``crowdmix shuffler serve``'s HTTP port (Connect protocol), sealed, to a
``crowdmix aggregator serve``; both on redis-servers this test starts.

- Reports of every encoding are opened and counted, each once.
- kill -9 of the Node app at random points loses no claimed report and counts none twice.
- The Node example in examples/ reports as its comment says.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crowdmix.cluster import LocalCluster
from tests.daemons import counted, local_cluster
from tests.doc_pages import code_blocks
from tests.typescript import built_sdk, node
from tests.waiting import eventually

pytestmark = pytest.mark.integration

HERE = Path(__file__).parent
REPO = HERE.parent.parent
SHUFFLE = """
[metrics.{name}.shuffle]
min_batch = 1
max_delay_seconds = 0.1
release = "max_batch"
"""
METRICS = {
    "home_page": 'encoding = "rappor"\nk = 16\nh = 2\nm = 8\nf = 0.5\np = 0.5\nq = 0.75',
    "dark_mode": 'encoding = "binary-rr"\nepsilon = 1.0',
    "theme": 'encoding = "krr"\nepsilon = 1.0\ndomain = ["light", "dark", "sepia", "blue", "red"]',
    "browser": 'encoding = "oue"\nepsilon = 1.0\ndomain_size = 5',
    "city": 'encoding = "olh"\nepsilon = 2.0\ndomain_size = 1000',
    "screens": 'encoding = "shuffled-histogram"\ndomain_size = 12\nfake_slots = 3\n'
    "fake_probability = 0.5\nlocal_epsilon = 4.0",
    "crash_rappor": 'encoding = "rappor"\nk = 32\nh = 2\nm = 4\nf = 0.5\np = 0.5\nq = 0.75',
    "crash_krr": 'encoding = "krr"\nepsilon = 1.0\ndomain_size = 7',
}
REGISTRY = "".join(
    f"[metrics.{n}]\n{body}\n{SHUFFLE.format(name=n)}" for n, body in METRICS.items()
)
EVERY_ENCODING = [
    ["home_page", "example.com/$i"],
    ["dark_mode", "1"],
    ["theme", "dark"],
    ["browser", "3"],
    ["city", "$i"],
    ["screens", "5"],
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    built_sdk()
    with local_cluster(tmp_path_factory.mktemp("typescript"), REGISTRY, shufflers=1) as c:
        yield c


def _job(
    cluster: LocalCluster,
    base: Path,
    devices: int,
    reports: list[list[str]],
    *,
    hang_after_ack: bool = False,
    name: str = "job.json",
) -> Path:
    base.mkdir(parents=True, exist_ok=True)
    path = base / name
    path.write_text(
        json.dumps(
            {
                "url": cluster.http_urls[0],
                "token": cluster.token,
                "base": str(base),
                "devices": devices,
                "reports": reports,
                "hangAfterAck": hang_after_ack,
            }
        )
    )
    return path


def _devices(job: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [node(), str(HERE / "typescript_devices.mjs"), str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_reports_of_every_encoding_are_opened_and_counted_once(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    devices = 12
    proc = _devices(_job(cluster, tmp_path / "devices", devices, EVERY_ENCODING))
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert summary["claimed"] == {m: devices for m, _ in EVERY_ENCODING}, summary
    assert summary["queued"] == 0 and not summary["errors"], summary
    # a histogram device sends its real report and 0..3 fakes: the rest of the delivered rows
    histogram_rows = summary["delivered"] - 5 * devices
    assert devices <= histogram_rows <= 4 * devices
    expected = {m: devices for m, _ in EVERY_ENCODING} | {"screens": histogram_rows}
    assert eventually(lambda: {m: counted(cluster, m) for m in expected} == expected, 60, 0.2)
    time.sleep(1.0)  # nothing more arrives: each report counted once
    assert {m: counted(cluster, m) for m in expected} == expected


def test_kill_9_of_the_node_app_loses_none_and_counts_none_twice(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    base = tmp_path / "crash"
    devices = 30
    job = _job(cluster, base, devices, [["crash_rappor", "v$i"], ["crash_krr", "3"]])
    rng = random.Random(20261125)
    progress = base / "progress"
    kills = 0
    for _ in range(6):
        # a random point of the run (it writes two progress lines per device), plus a
        # random fraction of a step: mid-claim, mid-write, mid-request
        seen = len(progress.read_text().splitlines()) if progress.exists() else 0
        target = seen + rng.randrange(2 * devices)
        proc = _devices(job)
        deadline = time.monotonic() + 60
        while not (progress.exists() and len(progress.read_text().splitlines()) >= target):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the Node app made no progress"
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.05))
        if proc.poll() is None:
            proc.kill()  # SIGKILL
            kills += 1
        proc.communicate(timeout=60)
    assert kills >= 3
    proc = _devices(job)  # a last run to the end: it sends what the killed ones left
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert json.loads(out)["queued"] == 0
    claimed = {"crash_rappor": 0, "crash_krr": 0}
    for i in range(devices):
        outbox = json.loads((base / f"device-{i}" / "outbox.json").read_text())
        assert outbox["rows"] == []
        for metric in claimed:
            claimed[metric] += metric in outbox["claims"]
    assert claimed == {"crash_rappor": devices, "crash_krr": devices}
    assert eventually(lambda: {m: counted(cluster, m) for m in claimed} == claimed, 60, 0.2)
    time.sleep(1.0)
    assert {m: counted(cluster, m) for m in claimed} == claimed


def test_a_kill_after_the_shuffler_acknowledged_sends_again_and_counts_once(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Killed between the shuffler's acknowledgement and the outbox's delete: the
    restarted app sends the report again (same id, same window), the aggregator counts it
    once."""
    base = tmp_path / "acked"
    reports = [["home_page", "acked.example"], ["theme", "sepia"]]
    before = {m: counted(cluster, m) for m, _ in reports}
    proc = _devices(_job(cluster, base, 1, reports, hang_after_ack=True))
    kill_at_line(proc, base / "progress", "acked")
    outbox = json.loads((base / "device-0" / "outbox.json").read_text())
    assert len(outbox["rows"]) == 2  # both still there: the first was acknowledged, not deleted
    proc = _devices(_job(cluster, base, 1, reports))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert json.loads(out) == {"claimed": {}, "queued": 0, "delivered": 2, "errors": []}
    expected = {m: before[m] + 1 for m in before}
    assert eventually(lambda: {m: counted(cluster, m) for m in expected} == expected, 60, 0.2)
    time.sleep(1.0)
    assert {m: counted(cluster, m) for m in expected} == expected


def kill_at_line(proc: subprocess.Popen[str], path: Path, line: str) -> None:
    deadline = time.monotonic() + 60
    while not (path.exists() and line in path.read_text().splitlines()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"never reached {line!r}"
        time.sleep(0.02)
    proc.kill()
    proc.communicate(timeout=30)


def test_the_node_example_reports(cluster: LocalCluster, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "CROWDMIX_URL": cluster.http_urls[0],
        "CROWDMIX_TOKEN": cluster.token,
        "CROWDMIX_APP_DIR": str(tmp_path / "app"),
    }
    before = counted(cluster, "theme")
    out = subprocess.run(
        [node(), str(REPO / "examples" / "node" / "report.mjs"), "theme=sepia", "nope=1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "theme: reported" in out and "nope: not reported" in out
    assert json.loads(out.splitlines()[-1])["counters"]["delivered"] == 1
    assert eventually(lambda: counted(cluster, "theme") == before + 1, 60, 0.2)


def test_the_readmes_typescript_snippet_reports_from_node(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """README.md's TypeScript snippet, as written, in a Node app that installed the package."""
    snippet = code_blocks((REPO / "README.md").read_text(), "js")[0]
    assert "shuffler.example:7480" in snippet
    modules = tmp_path / "node_modules" / "@crowdmix"
    modules.mkdir(parents=True)
    (modules / "client").symlink_to(REPO / "sdk" / "typescript")
    app = tmp_path / "app.mjs"
    app.write_text(
        f"const APP_DIR = {json.dumps(str(tmp_path / 'app'))};\n"
        f"const APP_TOKEN = {json.dumps(cluster.token)};\n"
        + snippet.replace("https://shuffler.example:7480", cluster.http_urls[0])
        + "console.log(JSON.stringify(reporter.counters()));\nawait reporter.close();\n"
    )
    before = counted(cluster, "theme")
    out = subprocess.run(
        [node(), str(app)], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    assert json.loads(out.splitlines()[-1])["delivered"] == 1
    assert eventually(lambda: counted(cluster, "theme") == before + 1, 60, 0.2)
