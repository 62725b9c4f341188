"""Lose a master under load, lose nothing acknowledged, with real processes.

A Redis Cluster of 3 masters and 3 replicas on loopback (AOF always), two ``crowdmix
shuffler serve`` and two ``crowdmix aggregator serve`` processes on it, all with
``--min-replicas-ack 1``, started by ``LocalCluster(redis_cluster=True)`` (what
``crowdmix cluster --redis-cluster`` runs). Three metrics, one on each master; every
request carries reports of all three, so each group-commit flush spans three slots.
Senders behave like the SDK: each has a cohort of its own (per-cohort totals are
per-sender counts) and sends each request, with fixed report ids, until it is
acknowledged. Mid-load the master of one metric is killed with SIGKILL; its replica
takes over (and refuses writes under WAIT 1 until the killed node is back, as its
replica). Then every acknowledged report is counted exactly once, sender by sender,
metric by metric.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.cluster import LocalCluster
from crowdmix.core.registry import load_registry
from crowdmix.shuffler.redis_cluster import key_slot
from tests.service.pipeline import Senders, metric_toml

pytestmark = pytest.mark.slow

M = 16  # cohorts: one per sender at most (8-byte reports, as in tests/service/pipeline)
SENDERS, REQUESTS, PER_REQUEST = 6, 12, 100


def _one_metric_per_master() -> list[str]:
    """Three metric names whose hash tags fall in the three masters' slot ranges of a
    fresh ``redis-cli --cluster create`` (0-5460, 5461-10922, 10923-16383)."""
    chosen: dict[int, str] = {}
    for i in range(100):
        name = f"metric{i}"
        chosen.setdefault(key_slot(f"{{{name}}}".encode()) * 3 // 16384, name)
    return [chosen[r] for r in range(3)]


METRICS = _one_metric_per_master()


def _registry(path: Path) -> Path:
    text = "".join(metric_toml(name, min_batch=100, max_batch=100_000, m=M) for name in METRICS)
    # a batch whose forward was cut by the failover is offered again after 2.5 s; the
    # forward's deadline must exceed the aggregator's WAIT timeout (1 s)
    text += "\n[shuffler]\ninflight_retry_seconds = 2.5\nforward_timeout_seconds = 2.0\n"
    path.write_text(text)
    return path


def _per_sender(store: RedisCountStore, metric: str) -> list[int]:
    stored = store.load(metric)
    return [0] * SENDERS if stored is None else [int(t) for t in stored.totals[:SENDERS]]


def test_a_master_killed_mid_load_loses_no_acknowledged_report(tmp_path: Path) -> None:
    registry_path = _registry(tmp_path / "metrics.toml")
    registry = load_registry(registry_path)
    c = LocalCluster(
        tmp_path / "c",
        shufflers=2,
        aggregators=2,
        registry_path=registry_path,
        sealed=False,
        redis_cluster=True,
        min_replicas_ack=1,
    )
    c.start()
    try:
        assert c.cluster is not None
        fingerprints = {m: registry[m].fingerprint for m in METRICS}
        senders = Senders(fingerprints, SENDERS, REQUESTS, PER_REQUEST, seed=17, m=M, token=c.token)
        targets = c.shuffler_targets
        deadline = time.monotonic() + 60
        senders.send(targets, range(REQUESTS // 3), deadline=deadline)
        # the master of the first metric's slot, as the cluster sees it now
        store = RedisCountStore.from_url(c.cluster.url)
        victim_port = store._r.get_node_from_key(f"x:{{{METRICS[0]}}}").port
        masters_before = c.cluster.master_ports()
        assert victim_port in masters_before and len(masters_before) == 3

        def kill_and_bring_back() -> None:
            assert c.cluster is not None
            time.sleep(0.3)
            victim = c.cluster.node_on(victim_port)
            victim.kill()
            # the replica takes over; until the dead node is back (as the new master's
            # replica) that master has no replica, so WAIT 1 refuses its slot's writes
            until = time.monotonic() + 20
            while victim_port in c.cluster.master_ports() and time.monotonic() < until:
                time.sleep(0.1)
            time.sleep(1.0)
            victim.start()

        killer = threading.Thread(target=kill_and_bring_back)
        killer.start()
        senders.send(targets, range(REQUESTS // 3, REQUESTS), deadline=deadline, pace=0.15)
        killer.join(30)
        assert senders.acked.all(), f"not all acknowledged by the deadline: {senders.codes[-5:]}"
        # the kill hit the load: writes to the dead master's slot were refused, then retried
        assert "UNAVAILABLE" in senders.codes
        c.cluster.wait_ok(30)
        masters_after = c.cluster.master_ports()
        assert victim_port not in masters_after and len(masters_after) == 3  # a replica took over

        want = [REQUESTS * PER_REQUEST] * SENDERS
        wait_until = time.monotonic() + 40
        while time.monotonic() < wait_until:
            if all(_per_sender(store, m) == want for m in METRICS):
                break
            time.sleep(0.2)
        time.sleep(1.5)  # settle: a double count would show as more than wanted
        for j, metric in enumerate(METRICS):
            got = store.load(metric)
            assert got is not None, metric
            assert _per_sender(store, metric) == want, (
                f"{metric}: counted per sender {_per_sender(store, metric)}, acknowledged "
                f"{want}; refusals seen: {sorted(set(senders.codes))}"
            )
            assert not got.totals[SENDERS:].any()
            assert np.array_equal(got.ones, senders.expected(j).ones), metric
        store.close()
    finally:
        codes = c.stop()
    assert all(code == 0 for code in codes.values()), codes


def test_the_local_cluster_waits_for_one_replica_by_default(tmp_path: Path) -> None:
    """``crowdmix cluster --redis-cluster`` runs every daemon with --min-replicas-ack 1,
    both stores on the cluster's URL; without it, no WAIT and two redis-servers."""
    c = LocalCluster(tmp_path / "c", redis_cluster=True, aggregators=2, sealed=False)
    try:
        assert c.min_replicas_ack == 1
        assert c.cluster is not None
        assert c.aggregator_redis_url == c.shuffler_redis_url == c.cluster.url
        args = c._shuffler(1, "127.0.0.1:1").args
        assert args[args.index("--min-replicas-ack") + 1] == "1"
        assert "--min-replicas-ack" in c._aggregator(2).args
    finally:
        c.stop()
    plain = LocalCluster(tmp_path / "p", sealed=False)
    try:
        assert plain.min_replicas_ack == 0 and plain.cluster is None
        assert "--min-replicas-ack" not in plain._shuffler(1, "127.0.0.1:1").args
    finally:
        plain.stop()
