"""Shared fixtures. Tests that need Redis use ``redis_url``: a private
redis-server (started once per session on a free loopback port), flushed
before each test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.redis_server import ListeningRedis, RedisClusterServers, RedisServer

# `scripts/check --fast` runs property tests with fewer examples (the full check
# keeps Hypothesis's default of 100, or what a test sets itself).
settings.register_profile("fast", max_examples=15, deadline=None)

_INTEGRATION = {
    "service",
    "shuffler",
    "e2e",
    "cluster",
    "test_readme.py",
    "test_smoke.py",
    "test_json_docs.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests under tests/service, tests/shuffler, tests/e2e and the README and smoke
    tests start real servers or processes: they are ``integration``
    (``scripts/check --fast`` skips them)."""
    here = Path(__file__).parent
    for item in items:
        path = Path(str(item.fspath))
        if path.is_relative_to(here) and _INTEGRATION & set(path.relative_to(here).parts[:1]):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer(appendonly=True)
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    import redis

    if redis_server.proc is None or redis_server.proc.poll() is not None:
        redis_server.start()
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def private_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of the test's own, for tests that kill or restart it."""
    server = RedisServer(appendonly=True, directory=str(tmp_path_factory.mktemp("redis")))
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="session")
def _listening_redis(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, ListeningRedis]]:
    servers: dict[str, ListeningRedis] = {}
    yield servers
    for server in servers.values():
        server.close()


def _listening_url(
    kind: str, servers: dict[str, ListeningRedis], tmp_path_factory: pytest.TempPathFactory
) -> str:
    if kind not in servers:
        servers[kind] = ListeningRedis(kind, tmp_path_factory.mktemp(f"redis-{kind}"))
    servers[kind].flush()
    return servers[kind].url


@pytest.fixture
def rediss_url(
    _listening_redis: dict[str, ListeningRedis], tmp_path_factory: pytest.TempPathFactory
) -> str:
    """A ``rediss://`` URL (TLS with client certificates, started once per session,
    flushed before each test); the certificate files are named in the URL."""
    return _listening_url("rediss", _listening_redis, tmp_path_factory)


@pytest.fixture
def unix_url(
    _listening_redis: dict[str, ListeningRedis], tmp_path_factory: pytest.TempPathFactory
) -> str:
    """A ``unix://`` URL of a redis-server listening on a unix socket only."""
    return _listening_url("unix", _listening_redis, tmp_path_factory)


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A Redis Cluster of the session's own: 3 masters, 3 replicas, on loopback (~2.5 s)."""
    cluster = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_url(redis_cluster: RedisClusterServers) -> str:
    """A ``redis+cluster://`` URL of the session's cluster, every master flushed."""
    import redis

    for port in redis_cluster.master_ports():
        client = redis.Redis(host="127.0.0.1", port=port)
        client.flushall()
        client.close()
    return redis_cluster.url
