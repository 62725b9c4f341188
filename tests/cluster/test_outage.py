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

from aggregator.counting.counts import CohortCounts
from aggregator.errors import StoreUnavailable as AggregatorStoreUnavailable
from aggregator.store.redis import RedisCountStore
from shuffler.errors import StoreUnavailable
from shuffler.redis_store import RedisStore
from shuffler.store import QueueKey
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
