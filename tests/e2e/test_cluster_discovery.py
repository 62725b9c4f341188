"""A local cluster with a heavy-hitters metric, driven by the operator's commands.

``crowdmix cluster``'s ``LocalCluster`` starts a shuffler and an aggregator as real
processes; with a heavy-hitters metric in the registry the shuffler serves the round
file in the cluster's directory (``rounds_path``). ``crowdmix discover open`` (a
subprocess) writes round 0 for the current window there; a device (``client.Reporter``)
fetches it through GetConfig, reports in it if its secret puts it in round 0, and the
shuffler takes the report; ``crowdmix discover step`` refuses, in one line, to decode a
window that is not over. The real clock throughout: the later rounds need the window to
end (an hour at least), which tests/e2e/test_discovery_pipeline.py covers in-process.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from crowdmix import client
from crowdmix.client.discovery import device_round
from crowdmix.core.registry import load_registry
from crowdmix.shuffler.redis_store import RedisStore
from tests.daemons import local_cluster

pytestmark = pytest.mark.slow  # real processes, seconds

METRIC = "words"
REGISTRY = f"""
[collection]
window_seconds = 3600

[metrics.{METRIC}]
encoding = "heavy-hitters"
alphabet = "abcehlnpry"
max_length = 6
spans = [3, 7]
keep = 20
candidates = 10
seeds = 16
weights = [0.3333333333333333, 0.3333333333333333, 0.3333333333333334]
epsilon = 9.5
delta = 1e-6
devices = 300

[metrics.{METRIC}.shuffle]
min_batch = 1
release_grace_seconds = 60
"""


def _discover(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crowdmix", "discover", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_cluster_serves_the_round_that_discover_open_writes(tmp_path: Path) -> None:
    with local_cluster(tmp_path, REGISTRY, shufflers=1, sealed=False) as cluster:
        assert cluster.rounds_path == cluster.workdir / "rounds.json"
        assert not cluster.rounds_path.exists()  # no round yet: the shuffler started anyway
        registry = load_registry(cluster.registry_path)
        metric = registry[METRIC]
        job = [
            "--config", str(cluster.registry_path), "--metric", METRIC,
            "--rounds", str(cluster.rounds_path), "--state", str(tmp_path / "state.json"),
        ]  # fmt: skip
        window = registry.window_of(time.time())
        left = (window + 1) * 3600 - time.time()
        if left < 30:  # too near the window's end for this test's seconds: the next one
            time.sleep(left + 1)
            window += 1
        opened = _discover("open", *job, "--window", str(window))
        assert opened.returncode == 0, opened.stderr
        assert f"served in window {window}" in opened.stdout
        # a device in round 0 (its secret draws it): the seeded secret file makes it one
        made = None
        for i in range(50):
            app = tmp_path / f"dev{i}"
            app.mkdir()
            secret = bytes([i]) * 32
            (app / "secret").write_bytes(secret)
            weights = metric.heavy_hitters.weights  # type: ignore[union-attr]
            if device_round(secret, METRIC, metric.fingerprint, window, weights) == 0:
                made = app
                break
        assert made is not None
        time.sleep(1.1)  # the shuffler re-reads the round file at most once a second
        with client.Reporter(
            made, cluster.shuffler_targets[0], cluster.token, tls=False, sealing="off",
            background=False,
        ) as dev:  # fmt: skip
            assert dev.flush(timeout=20) == 0  # fetches the config and its round
            config = dev.config()
            assert config is not None
            served = config.round_of(METRIC, window)
            assert served is not None and served.round == 0 and served.opened == window
            got = dev.report(METRIC, "apple")
            assert got.status is client.ReportStatus.CLAIMED, got
            assert dev.flush(timeout=20) == 0  # the shuffler took it
        store = RedisStore(cluster.shuffler_redis_url)
        try:
            assert sum(store.pending(METRIC).values()) == 1  # held until the window closes
        finally:
            store.close()
        step = _discover("step", *job, "--redis", cluster.aggregator_redis_url)
        assert step.returncode == 1
        assert f"round 0's window {window} is not over" in step.stderr
        assert "Traceback" not in step.stderr
        codes = cluster.stop()
    assert set(codes.values()) == {0}, codes
