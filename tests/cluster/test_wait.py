"""The stores on a real Redis Cluster (3 masters, 3 replicas, started by the session):
``--min-replicas-ack`` (WAIT on the write's own connection) and a group-commit flush
split per slot, atomic per metric. Several tests wait out WAIT's 1 s timeout: slow."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import redis

from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.aggregator.errors import StoreUnavailable as AggregatorStoreUnavailable
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.core.redis_url import parse_cluster_url
from crowdmix.shuffler.columns import Chunk
from crowdmix.shuffler.commit import GroupCommitter
from crowdmix.shuffler.errors import StoreNotReplicated, StoreUnavailable
from crowdmix.shuffler.redis_cluster import key_slot
from crowdmix.shuffler.redis_store import RedisStore
from crowdmix.shuffler.store import PendingWrite, QueueKey
from tests.redis_server import RedisClusterServers
from tests.shuffler.conftest import LoopAppended
from tests.shuffler.helpers import OUE, RAPPOR, make_registry, unique_chunk

WINDOW = 20_000  # the window every report of these writes names

pytestmark = pytest.mark.slow

KEY = QueueKey(window=20000, fingerprint=0xDEADBEEF12345678)


def _writes() -> list[PendingWrite]:
    # two metrics on two masters (slots 12530 and 6410): one flush, two scripts
    return [
        PendingWrite.of(RAPPOR, KEY, unique_chunk(30)),
        PendingWrite.of(OUE, KEY, unique_chunk(7, 100)),
    ]


def _master_of(url: str, metric: str) -> redis.Redis:
    from redis.cluster import ClusterNode, RedisCluster

    host, port = parse_cluster_url(url).nodes[0]
    rc = RedisCluster(startup_nodes=[ClusterNode(host, port)])  # type: ignore[no-untyped-call]
    try:
        node = rc.get_node_from_key(f"crowdmix:{{{metric}}}:pending")
        return redis.Redis(host=node.host, port=node.port)
    finally:
        rc.close()


def test_metrics_of_one_flush_sit_on_different_masters(cluster_url: str) -> None:
    a, b = _master_of(cluster_url, RAPPOR), _master_of(cluster_url, OUE)
    try:
        where = {c.connection_pool.connection_kwargs["port"] for c in (a, b)}
    finally:
        a.close()
        b.close()
    assert len(where) == 2  # so the flush tests below really cross masters
    assert key_slot(f"crowdmix:{{{RAPPOR}}}:q:1:2".encode()) == key_slot(b"{home_page}")


@pytest.mark.parametrize("loop", [False, True])
def test_a_write_waits_for_one_replica(cluster_url: str, loop: bool) -> None:
    store: Any = RedisStore(cluster_url, min_replicas_ack=1)
    s = LoopAppended(store) if loop else store
    try:
        s.append(_writes())
        assert s.pending(RAPPOR) == {KEY: 30}
        assert s.pending(OUE) == {KEY: 7}
    finally:
        s.close()


@pytest.mark.parametrize("loop", [False, True])
def test_a_write_too_few_replicas_have_is_not_acknowledged(cluster_url: str, loop: bool) -> None:
    store: Any = RedisStore(cluster_url, min_replicas_ack=2)  # each master has one replica
    s = LoopAppended(store) if loop else store
    try:
        with pytest.raises(StoreNotReplicated, match="1 replica"):
            s.append(_writes())
    finally:
        s.close()


def test_wait_on_a_single_node_without_replicas_refuses(redis_url: str) -> None:
    s = LoopAppended(RedisStore(redis_url, min_replicas_ack=1))
    try:
        with pytest.raises(StoreNotReplicated, match="0 replica"):
            s.append(_writes())
        # without WAIT the same node acknowledges (single-node behaviour unchanged)
    finally:
        s.close()


def _flush_while_oue_refuses(
    cluster_url: str, store: RedisStore, *requests: dict[str, Chunk]
) -> list[Any]:
    """``requests`` (metric → reports each) in one group-commit flush to ``store`` while
    the master of OUE refuses writes (OOM): what each request's commit returned or raised."""
    registry = make_registry()

    async def flush() -> list[Any]:
        committer = GroupCommitter(store, registry, max_delay=0.05)
        try:
            commits = (
                committer.commit({(m, registry[m].fingerprint, WINDOW): c for m, c in r.items()})
                for r in requests
            )
            return await asyncio.gather(*commits, return_exceptions=True)
        finally:
            await committer.aclose()

    oue_master = _master_of(cluster_url, OUE)
    oue_master.config_set("maxmemory", "1")
    try:
        return asyncio.run(flush())
    finally:
        oue_master.config_set("maxmemory", "0")
        oue_master.close()


def test_a_flush_fails_only_for_the_requests_of_a_refusing_slot(cluster_url: str) -> None:
    """The master of OUE refuses writes (OOM): the request for RAPPOR in the same flush is
    acknowledged, the one for OUE is not, and nothing of OUE is stored."""
    store = RedisStore(cluster_url)
    try:
        rappor, oue = _flush_while_oue_refuses(
            cluster_url, store, {RAPPOR: unique_chunk(20)}, {OUE: unique_chunk(5, 50)}
        )
        assert rappor is None
        assert isinstance(oue, StoreUnavailable) and "OOM" in str(oue)
        assert sum(store.pending(RAPPOR).values()) == 20
        assert store.pending(OUE) == {}
    finally:
        store.close()


def _counts(n: int, seed: int) -> CohortCounts:
    rng = np.random.default_rng(seed)
    counts = CohortCounts.create(4, 16)
    counts.add(rng.integers(0, 4, n, dtype=np.uint32), rng.integers(0, 256, (n, 2), dtype=np.uint8))
    return counts


def test_an_apply_waits_and_its_retry_waits_again(
    cluster_url: str, redis_cluster: RedisClusterServers
) -> None:
    """A batch WAIT refused is retried by the shuffler: the retry finds it applied (a
    duplicate), writes a counter so that its own WAIT covers the first apply, and is
    acknowledged only once a replica has it."""
    strict = RedisCountStore.from_url(cluster_url, min_replicas_ack=2)
    store = RedisCountStore.from_url(cluster_url, min_replicas_ack=1)
    batch = b"b" * 16
    try:
        with pytest.raises(AggregatorStoreUnavailable, match="1 replica"):
            strict.apply("pages", 7, batch, 42, _counts(50, 1))
        assert store.apply("pages", 7, batch, 42, _counts(50, 1)) is False  # a duplicate
        assert store.apply("pages", 7, b"c" * 16, 42, _counts(10, 2)) is True
        master = _master_of(cluster_url, "pages")
        try:
            meta = master.hget("crowdmix:agg:{pages}:meta", "duplicate_batches")
        finally:
            master.close()
        assert meta == b"1"
        stored = store.load("pages")
        assert stored is not None and int(stored.totals.sum()) == 60
    finally:
        strict.close()
        store.close()


def test_the_report_job_reads_counts_from_a_cluster(
    cluster_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``crowdmix counts list --redis redis+cluster://...`` and ``load_counts`` (what
    ``crowdmix report --redis`` calls) find the metrics on every master and merge them."""
    import json

    from crowdmix.aggregator.store import load_counts
    from crowdmix.cli import main

    store = RedisCountStore.from_url(cluster_url)
    try:
        for i, metric in enumerate(("pages", RAPPOR, OUE)):  # three slots
            assert store.apply(metric, 7, bytes([i]) * 16, 42, _counts(10 + i, i))
    finally:
        store.close()
    assert main(["counts", "list", "--redis", cluster_url, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {m["metric"]: m["reports"] for m in listed["metrics"]} == {
        "pages": 10,
        RAPPOR: 11,
        OUE: 12,
    }
    assert int(load_counts(cluster_url, OUE).totals.sum()) == 12


def _node_id(client: redis.Redis) -> str:
    return str(client.execute_command("CLUSTER", "MYID").decode())


def _move_slot(slot: int, source: redis.Redis, target: redis.Redis, masters: list[int]) -> None:
    """Move an empty slot from ``source`` to ``target`` (as a resharding does)."""
    src, dst = _node_id(source), _node_id(target)
    target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", src)
    source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", dst)
    for port in masters:
        client = redis.Redis(port=port)
        try:
            client.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst)
        finally:
            client.close()


@contextlib.contextmanager
def _rappors_slot_to_move(
    cluster_url: str, redis_cluster: RedisClusterServers
) -> Iterator[tuple[int, redis.Redis, redis.Redis, list[int]]]:
    """RAPPOR's slot, its master, a master that holds neither RAPPOR nor OUE, and the
    masters' ports; on leaving, the slot is emptied and given back to its master."""
    masters = redis_cluster.master_ports()
    source = _master_of(cluster_url, RAPPOR)
    other = _master_of(cluster_url, OUE)
    ports = {c.connection_pool.connection_kwargs["port"] for c in (source, other)}
    target = redis.Redis(port=next(p for p in masters if p not in ports))
    slot = key_slot(b"{home_page}")
    try:
        yield slot, source, target, masters
    finally:
        for c in (source, target):
            keys = c.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
            if keys:
                c.delete(*keys)
        _move_slot(slot, target, source, masters)
        for c in (source, target, other):
            c.close()


def test_an_appender_with_a_stale_slot_map_follows_moved(
    cluster_url: str, redis_cluster: RedisClusterServers
) -> None:
    """A slot moves to another master after the event-loop appender read the slot map:
    the old master answers MOVED (the script did not run), the appender reads the map
    again and writes to the new master, once."""
    with _rappors_slot_to_move(cluster_url, redis_cluster) as (slot, source, target, masters):
        s = LoopAppended(RedisStore(cluster_url))
        try:
            s.append([PendingWrite.of(OUE, KEY, unique_chunk(3))])  # the appender has the map
            _move_slot(slot, source, target, masters)
            s.append(_writes())  # RAPPOR's part: MOVED, then the new master
            assert s.pending(RAPPOR) == {KEY: 30}
            assert s.pending(OUE) == {KEY: 10}
            assert target.hget(f"crowdmix:{{{RAPPOR}}}:pending", KEY.field) == b"30"
            assert source.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        finally:
            s.close()


def test_a_slot_in_migration_refuses_new_writes_until_it_ends(
    cluster_url: str, redis_cluster: RedisClusterServers
) -> None:
    """While RAPPOR's slot is MIGRATING, a write to keys its old master does not hold is
    redirected (ASK or TRYAGAIN); the appender reads the map again, resends a few times,
    then refuses UNAVAILABLE (nothing written). Once the slot has moved, MOVED leads the
    same appender to the new master."""
    write = [PendingWrite.of(RAPPOR, KEY, unique_chunk(4))]
    with _rappors_slot_to_move(cluster_url, redis_cluster) as (slot, source, target, masters):
        s = LoopAppended(RedisStore(cluster_url))
        try:
            target.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source))
            source.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target))
            with pytest.raises(StoreUnavailable) as refused:
                s.append(write)
            assert not isinstance(refused.value, StoreNotReplicated)
            assert "ASK" in str(refused.value) or "TRYAGAIN" in str(refused.value)
            for c in (source, target):
                assert c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
            _move_slot(slot, source, target, masters)  # the migration ends (no keys to move)
            s.append(write)
            assert s.pending(RAPPOR) == {KEY: 4}
        finally:
            s.close()


def _pages_batch(registry: Any, seed: int) -> Any:
    from tests.service.helpers import now_window, random_batch

    rng = np.random.default_rng(seed)
    return random_batch(rng, registry["pages"], 40, now_window(registry), batch_id=rng.bytes(16))


@pytest.mark.parametrize("where", ["single", "cluster"])
def test_the_daemons_early_duplicate_answer_waits_too(
    tmp_path: Any, redis_url: str, cluster_url: str, where: str
) -> None:
    """The aggregator's ingest answers a batch id applied before as a duplicate before
    counting it (``is_applied``): with --min-replicas-ack that answer is an acknowledgement
    too (the shuffler then deletes the batch), so it must not come before a WAIT. Found in
    review: a batch whose WAIT failed was acknowledged on its retry without any WAIT, and a
    failover then lost it (the master died before its replica had it)."""
    from crowdmix.aggregator.daemon.ingest import Ingestor
    from tests.service.helpers import write_registry

    _, registry = write_registry(tmp_path)
    url = redis_url if where == "single" else cluster_url
    # single node: no replica, WAIT 1 never succeeds; cluster: one replica each, WAIT 2 never
    needs = 1 if where == "single" else 2
    strict = RedisCountStore.from_url(url, min_replicas_ack=needs, wait_timeout_ms=50)
    batch = _pages_batch(registry, 5)
    try:
        ingestor = Ingestor(registry, strict)
        with pytest.raises(AggregatorStoreUnavailable, match="replica"):
            ingestor.ingest(batch)  # applied on the master, not acknowledged
        with pytest.raises(AggregatorStoreUnavailable, match="replica"):
            ingestor.ingest(batch)  # the shuffler's retry: still not replicated enough
    finally:
        strict.close()
    plain = RedisCountStore.from_url(url)  # no WAIT: a plain look
    try:
        assert plain.is_applied("pages", batch.batch_id)  # the first apply ran on the master
    finally:
        plain.close()
    if where == "cluster":  # one replica suffices: the retry is acknowledged, after WAIT
        store = RedisCountStore.from_url(url, min_replicas_ack=1)
        try:
            result = Ingestor(registry, store).ingest(batch)
            assert result.duplicate and result.applied == 0
            master = _master_of(url, "pages")
        finally:
            store.close()
        try:
            # one per duplicate answer that waited: the refused retry and this one
            assert master.hget("crowdmix:agg:{pages}:meta", "duplicate_batches") == b"2"
        finally:
            master.close()


def test_a_request_partly_stored_is_not_told_nothing_was_stored(cluster_url: str) -> None:
    """UNAVAILABLE tells a sender "nothing was stored", so one without report ids retries
    it (README, the SDK's status table); DEADLINE_EXCEEDED ("it may have been stored") it
    must not. A request whose metrics sit on two masters, one of which refuses (OOM), had
    its other part stored: it is answered as may-have-been-stored. Likewise a write WAIT
    refused ran on the master: ``StoreNotReplicated`` is answered DEADLINE_EXCEEDED."""
    import grpc

    from crowdmix.shuffler.errors import StoreOutcomeUnknown
    from crowdmix.shuffler.servicer import status_for

    assert status_for(StoreNotReplicated("x")) == grpc.StatusCode.DEADLINE_EXCEEDED
    store = RedisStore(cluster_url)
    try:
        both, oue_only = _flush_while_oue_refuses(
            cluster_url,
            store,
            {RAPPOR: unique_chunk(20), OUE: unique_chunk(5, 50)},
            {OUE: unique_chunk(3, 80)},
        )
        assert sum(store.pending(RAPPOR).values()) == 20  # the first request's other part
        assert store.pending(OUE) == {}
        assert isinstance(both, StoreOutcomeUnknown), both
        assert status_for(both) == grpc.StatusCode.DEADLINE_EXCEEDED
        # nothing of the second request was stored: it may say so
        assert isinstance(oue_only, StoreUnavailable) and "OOM" in str(oue_only)
        assert status_for(oue_only) == grpc.StatusCode.UNAVAILABLE
    finally:
        store.close()
