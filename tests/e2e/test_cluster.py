"""The local-cluster launcher starts Redis, two shufflers and an aggregator as real
processes; ``crowdmix simulate`` drives it; every acknowledged report is counted."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from crowdmix.cluster import DEMO_METRIC, LocalCluster
from crowdmix.health import check_health
from tests.daemons import counted
from tests.waiting import eventually


def _held_back(cluster: LocalCluster, settle: float = 3.0) -> int:
    """Reports pending in the shuffler's store once releases have settled."""
    from crowdmix.shuffler.redis_store import RedisStore

    store = RedisStore(cluster.shuffler_redis_url)
    try:
        last, stable_since = -1, time.monotonic()
        while time.monotonic() - stable_since < settle:
            now = sum(store.pending(DEMO_METRIC).values())
            if now != last:
                last, stable_since = now, time.monotonic()
            time.sleep(0.2)
        return last
    finally:
        store.close()


def _simulate(cluster: LocalCluster, target: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "crowdmix",
            "simulate",
            "--target",
            target,
            "--config",
            str(cluster.registry_path),
            "--metric",
            DEMO_METRIC,
            "--token",
            cluster.token,
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.slow
def test_launcher_simulate_and_clean_stop(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", shufflers=2, min_batch=500)
    cluster.start()
    try:
        for target in [*cluster.shuffler_targets, cluster.aggregator_target]:
            assert check_health(target) == "SERVING"
        # The aggregator cannot see the shufflers' queues: they live in another Redis.
        assert cluster.shuffler_redis_url != cluster.aggregator_redis_url
        # README: the aggregator's Redis fsyncs before every reply (an acknowledged batch
        # is deleted by the shuffler); the shufflers' follows --fsync (default everysec).
        for url, mode in (
            (cluster.aggregator_redis_url, "always"),
            (cluster.shuffler_redis_url, "everysec"),
        ):
            client = redis.Redis.from_url(url)
            assert client.config_get("appendfsync") == {"appendfsync": mode}
            client.close()
        batched = _simulate(cluster, cluster.shuffler_targets[0], "--clients", "3000")
        assert batched.returncode == 0, batched.stderr
        assert "3000 acknowledged" in batched.stdout
        unary = _simulate(
            cluster,
            cluster.shuffler_targets[1],
            "--clients", "600",
            "--mode", "unary",
            "--concurrency", "8",
        )  # fmt: skip
        assert unary.returncode == 0, unary.stderr
        assert "600 acknowledged" in unary.stdout
        # Thresholding: reports that arrive after the last batch was cut wait in the
        # shuffler until min_batch are pending, so counted + held back == acknowledged.
        held_back = _held_back(cluster)
        assert held_back < 500
        assert eventually(lambda: counted(cluster, DEMO_METRIC) >= 3600 - held_back, 30, 0.2)
        assert counted(cluster, DEMO_METRIC) == 3600 - held_back
        # A bad token is refused by the shuffler, and the simulator says so.
        cluster.token, good = "x" * 32, cluster.token
        refused = _simulate(cluster, cluster.shuffler_targets[0], "--clients", "10")
        cluster.token = good
        assert refused.returncode == 1
        assert "UNAUTHENTICATED" in refused.stderr
    finally:
        codes = cluster.stop()
    assert codes == {"shuffler-1": 0, "shuffler-2": 0, "aggregator": 0}
    assert all(not s.alive() for s in cluster.shufflers)
    assert not cluster.redis.ping() and not cluster.aggregator_redis.ping()


@pytest.mark.slow
def test_cluster_command_runs_until_sigterm(tmp_path: Path) -> None:
    import signal

    proc = subprocess.Popen(
        [sys.executable, "-m", "crowdmix", "cluster", "--dir", str(tmp_path / "c")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("Stop with") or not line:
                break
        assert lines[-1].startswith("Stop with"), "".join(lines) + proc.stderr.read()
        targets = [ln.split()[1] for ln in lines if ln.strip().startswith(("shuffler-", "aggr"))]
        assert len(targets) == 3
        assert all(check_health(t) == "SERVING" for t in targets)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert "shuffler-1 exit 0, shuffler-2 exit 0, aggregator exit 0" in out


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (the cluster's directory)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(cmdline)
    return found


def test_ctrl_c_during_start_up_stops_everything_and_exits_130(tmp_path: Path) -> None:
    import os
    import signal

    work = tmp_path / "c"
    proc = subprocess.Popen(
        [sys.executable, "-m", "crowdmix", "cluster", "--dir", str(work), "--shufflers", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, as in a terminal
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (work / "aggregator.log").exists():  # Redis is up, the daemons starting
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the terminal's process group
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, (out, err)
    assert "interrupted during start-up" in err
    assert "exited" not in err and "Traceback" not in err and "error:" not in err, err
    assert _processes_mentioning(str(work)) == []  # Redis and the daemons are all stopped
