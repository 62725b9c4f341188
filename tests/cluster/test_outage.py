"""The whole Redis Cluster unreachable (every node down: a restart of the cluster, a
partition between a daemon and it): redis-py's cluster client raises
``RedisClusterException``, which is not a ``RedisError``. Both stores must still say
"store unavailable" (their own ``StoreUnavailable``): the shuffler's releaser thread and
the aggregator's fold thread catch only that, and died of anything else, leaving a
daemon that answered health checks but never forwarded (or folded) again. Found in
review by killing every node of a 3+3 cluster under two real daemons for 4 s."""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.aggregator.errors import StoreUnavailable as AggregatorStoreUnavailable
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.shuffler.errors import StoreUnavailable
from crowdmix.shuffler.redis_store import RedisStore
from crowdmix.shuffler.store import QueueKey
from tests.redis_server import RedisClusterServers

pytestmark = pytest.mark.slow


@pytest.fixture
def dead_cluster(tmp_path: Path) -> Iterator[RedisClusterServers]:
    """A cluster of 3 masters (no replicas: faster to start) that the test kills."""
    cluster = RedisClusterServers(tmp_path / "rc", replicas=0)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


def _kill_all(cluster: RedisClusterServers) -> None:
    for node in cluster.nodes:
        assert node.proc is not None
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait(timeout=10)


def test_every_node_down_is_store_unavailable_for_both_stores(
    dead_cluster: RedisClusterServers,
) -> None:
    counts = CohortCounts.create(4, 16)
    counts.add(np.zeros(3, dtype=np.uint32), np.zeros((3, 2), dtype=np.uint8))
    key = QueueKey(window=1, fingerprint=2)
    shuffler = RedisStore(dead_cluster.url)
    aggregator = RedisCountStore.from_url(dead_cluster.url, min_replicas_ack=0)
    waiting = RedisCountStore.from_url(dead_cluster.url, min_replicas_ack=1)
    assert aggregator.apply("pages", 7, b"a" * 16, 42, counts)  # up: the clients know the map
    _kill_all(dead_cluster)
    shuffler_calls: list[Callable[[], Any]] = [
        lambda: shuffler.pending("pages"),
        lambda: shuffler.take("pages", key, min_batch=1, max_batch=9, batch_id=b"x" * 16),
        lambda: shuffler.inflight_ids("pages"),
        lambda: shuffler.load_inflight("pages", b"x" * 16),
        lambda: shuffler.ack("pages", b"x" * 16),
        lambda: shuffler.dispose("pages", key),
        shuffler.ping,
    ]
    aggregator_calls: list[Callable[[], Any]] = [
        lambda: aggregator.apply("pages", 7, b"b" * 16, 42, counts),
        lambda: waiting.apply("pages", 7, b"b" * 16, 42, counts),
        lambda: waiting.is_applied("pages", b"a" * 16),
        aggregator.maintain,
        lambda: aggregator.dispose_ids("pages", 9),
        lambda: aggregator.load("pages"),
        aggregator.metrics,
    ]
    try:
        for call in shuffler_calls:
            with pytest.raises(StoreUnavailable):
                call()
        for call in aggregator_calls:
            with pytest.raises(AggregatorStoreUnavailable):
                call()
    finally:
        shuffler.close()
        aggregator.close()
        waiting.close()


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback on this machine")
def test_the_event_loop_appender_writes_to_a_cluster_on_ipv6(tmp_path: Path) -> None:
    """Three masters bound to ::1: the slot map names them ``::1``, and the shuffler's
    appender must reach them (it built ``redis://::1:PORT/0``, which redis-py cannot read,
    so every flush failed while the daemon's start-up check passed)."""
    import shutil
    import subprocess
    import time

    import redis

    from crowdmix.shuffler.store import PendingWrite
    from tests.redis_server import free_port
    from tests.shuffler.conftest import LoopAppended
    from tests.shuffler.helpers import RAPPOR, unique_chunk

    exe, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    assert exe is not None and cli is not None
    chosen: set[int] = set()
    while len(chosen) < 6:  # 3 client ports and 3 bus ports, distinct (nothing binds them yet)
        chosen.add(free_port())
    ports, bus = sorted(chosen)[:3], sorted(chosen)[3:]
    procs = []
    try:
        for port, bus_port in zip(ports, bus, strict=True):
            d = tmp_path / str(port)
            d.mkdir()
            args = [exe, "--bind", "::1", "--port", str(port), "--dir", str(d), "--save", "",
                    "--appendonly", "no", "--cluster-enabled", "yes",
                    "--cluster-config-file", str(d / "nodes.conf"),
                    "--cluster-port", str(bus_port),  # port + 10000 may be past 65535
                    "--logfile", str(d / "redis.log")]  # fmt: skip
            procs.append(
                subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        for port in ports:
            client = redis.Redis(host="::1", port=port)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    assert time.monotonic() < deadline, f"redis-server on [::1]:{port}"
                    time.sleep(0.05)
            client.close()
        subprocess.run(
            [cli, "--cluster", "create", *(f"::1:{p}" for p in ports), "--cluster-yes"],
            check=True, capture_output=True, timeout=30,
        )  # fmt: skip
        url = f"redis+cluster://[::1]:{ports[0]}"
        deadline = time.monotonic() + 20
        for port in ports:  # every node agrees the cluster is up
            client = redis.Redis(host="::1", port=port)
            while b"cluster_state:ok" not in client.execute_command("CLUSTER", "INFO"):
                assert time.monotonic() < deadline, "the IPv6 cluster did not come up"
                time.sleep(0.05)
            client.close()
        s = LoopAppended(RedisStore(url))
        try:
            key = QueueKey(window=1, fingerprint=2)
            s.append([PendingWrite.of(RAPPOR, key, unique_chunk(3))])
            assert s.pending(RAPPOR) == {key: 3}
        finally:
            s.close()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
