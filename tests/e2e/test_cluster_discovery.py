"""A local cluster with a heavy-hitters metric, driven by the operator's commands.

``crowdmix cluster``'s ``LocalCluster`` starts a shuffler and an aggregator as real
processes; with a heavy-hitters metric in the registry the shuffler serves the round
file in the cluster's directory (``rounds_path``). ``crowdmix discover open`` (a
subprocess) writes round 0 for the current window there; a device (``client.Reporter``)
fetches it through GetConfig, reports in it if its secret puts it in round 0, and the
shuffler takes the report; ``crowdmix discover step`` refuses, in one line, to decode a
window that is not over. The real clock throughout: the later rounds need the window to
end (an hour at least): the second test moves the clocks instead.

The second test runs a whole discovery as an operator would: the daemons and every
``crowdmix discover`` command under Debian's ``faketime``, reading one offset file that
the test rewrites to move their wall clocks past each window (monotonic clocks are real);
the devices (seeded, as in tests/e2e/test_discovery_pipeline.py) read the same offset.
``discover open`` serves round 0 in the next window, the devices report, the clock
passes the window's close and grace, ``discover step`` (run again until the aggregator
has counted the window) serves the next round, and after the value round prints the
planted values: exactly the in-memory result of the same seeded devices.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import numpy as np
import pytest

from crowdmix import client
from crowdmix.client.discovery import device_round
from crowdmix.cluster import DaemonProcess, LocalCluster
from crowdmix.core.registry import load_registry
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.redis_store import RedisStore
from tests.daemons import local_cluster
from tests.e2e import test_discovery_pipeline as seeded

pytestmark = pytest.mark.slow  # real processes: ~5 s, and ~90 s for the whole discovery

METRIC = "words"
HOUR, GRACE = 3600, 60
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
min_batch = 50  # of ~100 per round: the crowd each round's ε0 is planned over
release_grace_seconds = {GRACE}
"""


LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"


def _discover(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crowdmix", "discover", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=None if env is None else {**os.environ, **env},
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


class FakeClock:
    """A wall-clock offset that the daemons (libfaketime, re-read each second) and the
    devices share: ``set(t)`` makes their time ``t`` now and running."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.path.write_text("+0\n")
        self.env = {
            "LD_PRELOAD": LIBFAKETIME,
            "FAKETIME_TIMESTAMP_FILE": str(path),
            "FAKETIME_CACHE_DURATION": "1",
            "FAKETIME_DONT_FAKE_MONOTONIC": "1",  # timeouts and gRPC keep the real pace
        }

    def set(self, t: float) -> None:
        self.offset = round(t - time.time())
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(f"{self.offset:+d}\n")
        os.replace(tmp, self.path)
        time.sleep(1.1)  # the shuffler re-reads the round file at most once a second

    def reached(self, target: str, token: str, timeout: float = 10.0) -> None:
        """Wait until the daemon at ``target`` tells this time (libfaketime re-reads the
        file once its cache of one to two seconds is over)."""
        with grpc.insecure_channel(target) as channel:
            stub = crowdmix_pb2_grpc.ShufflerStub(channel)
            md = (("authorization", f"Bearer {token}"),)
            deadline = time.monotonic() + timeout
            while True:
                told = stub.GetConfig(pb.GetConfigRequest(), metadata=md, timeout=5).server_time
                if abs(told - self.now()) < 30 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        assert abs(told - self.now()) < 30, (told, self.now())

    def now(self) -> float:
        return time.time() + self.offset


def _under(cluster: LocalCluster, clock: FakeClock) -> None:
    """Start the cluster's daemons again under the fake clock (same ports and stores)."""
    for group in (cluster.aggregators, cluster.shufflers):
        for i, old in enumerate(group):
            old.stop()
            new = DaemonProcess(old.name, old.args, old.port, old.log_path, env=clock.env)
            new.start()
            new.wait_healthy()
            group[i] = new


@pytest.mark.skipif(
    shutil.which("faketime") is None or not os.path.exists(LIBFAKETIME),
    reason="Debian's faketime is not installed (apt-get install faketime): it moves the "
    "daemons' clocks",
)
def test_a_discovery_through_the_cluster_and_the_discover_commands(tmp_path: Path) -> None:
    clock = FakeClock(tmp_path / "faketime.rc")
    with local_cluster(tmp_path, REGISTRY, shufflers=1, sealed=False) as cluster:
        clock.set((seeded.START - 1) * HOUR + HOUR / 2)  # the window before the first round
        _under(cluster, clock)
        metric = load_registry(cluster.registry_path)[METRIC]
        assert metric.heavy_hitters is not None
        assert cluster.rounds_path is not None
        job = [
            "--config", str(cluster.registry_path), "--metric", METRIC,
            "--rounds", str(cluster.rounds_path), "--state", str(tmp_path / "state.json"),
        ]  # fmt: skip
        opened = _discover("open", *job, env=clock.env)  # the next window
        assert opened.returncode == 0, opened.stderr
        assert f"served in window {seeded.START}" in opened.stdout
        values = seeded._values(np.random.default_rng(seeded.SEED))
        weights = metric.heavy_hitters.weights
        mine = [
            device_round(seeded._secret(seeded.SEED, i), METRIC, metric.fingerprint,
                         seeded.START, weights)
            for i in range(seeded.DEVICES)
        ]  # fmt: skip
        window, made, out = seeded.START, [], None
        for r in range(3):
            clock.set(window * HOUR + 600)
            clock.reached(cluster.shuffler_targets[0], cluster.token)

            def device(i: int, value: str) -> None:
                with client.Reporter(
                    seeded._device_dir(tmp_path, seeded.SEED, i),
                    cluster.shuffler_targets[0], cluster.token, tls=False, sealing="off",
                    background=False, clock=clock.now, rand=seeded._coins(seeded.SEED, i),
                ) as dev:  # fmt: skip
                    assert dev.flush(timeout=20) == 0
                    got = dev.report(METRIC, value)
                    assert got.status is client.ReportStatus.CLAIMED, got
                    assert dev.flush(timeout=20) == 0

            # the round's devices report at once (each its own app directory and coins)
            round_devices = [(i, v) for i, v in enumerate(values) if mine[i] == r]
            with ThreadPoolExecutor(max_workers=16) as pool:
                for done in [pool.submit(device, i, v) for i, v in round_devices]:
                    done.result()
            made.append(len(round_devices))
            # closed (window_tolerance 1) and its grace over: the shuffler releases it
            clock.set((window + 2) * HOUR + GRACE + 5)
            deadline = time.monotonic() + 20
            while True:
                step = _discover("step", *job, "--redis", cluster.aggregator_redis_url,
                                 "--json", env=clock.env)  # fmt: skip
                if step.returncode == 0 or time.monotonic() > deadline:
                    break
                assert "has no counts yet" in step.stderr, step.stderr
                time.sleep(0.3)
            logs = [d.tail_log(8) for d in (*cluster.shufflers, *cluster.aggregators)]
            assert step.returncode == 0, (step.stderr, logs)
            if r < 2:
                assert f"round {r} decoded from {made[-1]} reports" in step.stdout, step.stdout
                served = re.search(r"round (\d+) \(.*served in window (\d+)", step.stdout)
                assert served is not None and int(served[1]) == r + 1, step.stdout
                window = int(served[2])  # the window after the current one
            else:
                out = json.loads(step.stdout)
        codes = cluster.stop()
    assert set(codes.values()) == {0}, codes
    assert out is not None
    expected_made, expected = seeded._in_memory(metric, seeded.SEED)
    assert made == expected_made
    assert expected.table is not None
    assert [row["value"] for row in out["values"]][: len(expected.table.values)] == list(
        expected.table.values
    )[: len(out["values"])]
    found = {row["value"] for row in out["values"]}
    assert set(seeded.PLANTED) <= found, found
    # each round is stated over min_batch (every batch holds at least that many)
    assert [r["reports"] for r in out["rounds"]] == [min(n, 50) for n in made]
