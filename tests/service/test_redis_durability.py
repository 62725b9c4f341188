"""Redis-backed ingest: several processes at once, Redis restarts (AOF), Redis down."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

import grpc
import numpy as np
import pytest

from crowdmix.aggregator.daemon.ingest import IngestBatch, Ingestor
from crowdmix.aggregator.daemon.server import start_aggregator
from crowdmix.aggregator.daemon.service import batch_to_proto
from crowdmix.aggregator.store import load_counts
from crowdmix.aggregator.store.redis import RedisCountStore
from crowdmix.core.registry import Registry
from crowdmix.protos import crowdmix_pb2_grpc
from tests.redis_server import RedisServer
from tests.service.helpers import (
    REGISTRY_TOML,
    direct_count,
    now_window,
    random_batch,
    write_registry,
)
from tests.waiting import eventually


def _batches(registry: Registry, n_batches: int, seed: int) -> list[IngestBatch]:
    rng = np.random.default_rng(seed)
    window = now_window(registry)
    config = registry["pages"]
    # ids from the seeded generator too, so every process builds the very same batches
    return [
        random_batch(rng, config, int(rng.integers(1, 300)), window, batch_id=rng.bytes(16))
        for _ in range(n_batches)
    ]


def _ingest_worker(registry_path: str, url: str, seed: int, order_seed: int) -> int:
    """A separate aggregator process: ingests every batch of ``seed`` in its own order."""
    from crowdmix.core.registry import load_registry

    registry = load_registry(registry_path)
    store = RedisCountStore.from_url(url, fold_chunk=5)
    ingestor = Ingestor(registry, store)
    batches = _batches(registry, 60, seed)
    applied = 0
    for i in np.random.default_rng(order_seed).permutation(len(batches)):
        applied += not ingestor.ingest(batches[int(i)]).duplicate
        if i % 10 == 0:
            store.maintain()  # folders race each other and the ingesters
    store.close()
    return applied


def test_several_processes_ingesting_the_same_batches_count_each_once(
    tmp_path: Path, redis_url: str
) -> None:
    path, registry = write_registry(tmp_path)
    ctx = mp.get_context("spawn")
    with ctx.Pool(3) as pool:
        applied = pool.starmap(
            _ingest_worker, [(str(path), redis_url, 21, order) for order in (1, 2, 3)]
        )
    batches = _batches(registry, 60, 21)
    assert sum(applied) == len(batches)  # each batch applied by exactly one process
    store = RedisCountStore.from_url(redis_url)
    assert store.applied_batches("pages") == len(batches)
    assert load_counts(store, registry["pages"]) == direct_count(registry["pages"], batches)
    store.maintain()
    assert load_counts(store, registry["pages"]) == direct_count(registry["pages"], batches)
    store.close()


@pytest.mark.parametrize("how", ["restart", "sigkill"])
def test_counts_and_ids_survive_a_redis_restart(
    tmp_path: Path, private_redis: RedisServer, how: str
) -> None:
    _, registry = write_registry(tmp_path)
    batches = _batches(registry, 20, 31)
    store = RedisCountStore.from_url(private_redis.url)
    ingestor = Ingestor(registry, store)
    for i, b in enumerate(batches):
        ingestor.ingest(b)
        if i == 10:
            store.maintain()  # some folded, some still per-batch deltas
    if how == "restart":
        private_redis.restart()  # SHUTDOWN writes the AOF out
    else:
        time.sleep(1.5)  # appendfsync everysec: acknowledged writes reach disk within 1 s
        private_redis.kill()
        private_redis.start()
    expected = direct_count(registry["pages"], batches)
    assert load_counts(store, registry["pages"]) == expected
    # the applied ids survived too: re-sent batches are still duplicates
    assert all(ingestor.ingest(b).duplicate for b in batches)
    assert load_counts(store, registry["pages"]) == expected
    store.close()


def test_redis_down_means_unavailable_then_retry_applies_once(
    tmp_path: Path, private_redis: RedisServer
) -> None:
    _, registry = write_registry(tmp_path)
    batches = _batches(registry, 4, 41)
    store = RedisCountStore.from_url(private_redis.url)
    with (
        start_aggregator(registry, store) as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = crowdmix_pb2_grpc.AggregatorStub(channel)
        stub.Ingest(batch_to_proto(batches[0]))
        private_redis.stop()
        with pytest.raises(grpc.RpcError) as info:
            stub.Ingest(batch_to_proto(batches[1]), timeout=30)
        assert info.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "Traceback" not in (info.value.details() or "")
        private_redis.start()
        for b in batches:  # the shuffler's retry: everything again
            stub.Ingest(batch_to_proto(b), timeout=30)
        assert load_counts(store, registry["pages"]) == direct_count(registry["pages"], batches)


def test_params_changed_under_a_metric_name_is_failed_precondition(
    tmp_path: Path, redis_url: str
) -> None:
    _, registry = write_registry(tmp_path)
    other_dir = tmp_path / "other"
    other_dir.mkdir()
    _, changed = write_registry(other_dir, REGISTRY_TOML.replace("f = 0.5", "f = 0.25"))
    first = _batches(registry, 1, 51)[0]
    Ingestor(registry, RedisCountStore.from_url(redis_url)).ingest(first)
    rng = np.random.default_rng(52)
    batch = random_batch(rng, changed["pages"], 10, first.window)
    with (
        start_aggregator(changed, RedisCountStore.from_url(redis_url)) as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = crowdmix_pb2_grpc.AggregatorStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Ingest(batch_to_proto(batch))
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "other params than the registry" in (info.value.details() or "")
    store = RedisCountStore.from_url(redis_url)
    assert load_counts(store, registry["pages"]) == direct_count(registry["pages"], [first])
    store.close()


def test_the_daemon_folds_deltas_in_the_background(tmp_path: Path, redis_url: str) -> None:
    _, registry = write_registry(tmp_path)
    batches = _batches(registry, 12, 61)
    store = RedisCountStore.from_url(redis_url)
    with (
        start_aggregator(registry, store, maintain_interval=0.05) as server,
        grpc.insecure_channel(server.target) as channel,
    ):
        stub = crowdmix_pb2_grpc.AggregatorStub(channel)
        for b in batches:
            stub.Ingest(batch_to_proto(b))
        eventually(lambda: not store.pending("pages", batches[0].window), 10)
        assert store.pending("pages", batches[0].window) == 0
        folded = server.metrics.registry.get_sample_value("crowdmix_aggregator_deltas_folded_total")
        assert folded == len(batches)
    assert load_counts(store, registry["pages"]) == direct_count(registry["pages"], batches)
    store.close()
