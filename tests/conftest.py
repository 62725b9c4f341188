"""Shared fixtures. Tests that need Redis use ``redis_url``: a private
redis-server (started once per session on a free loopback port), flushed
before each test."""

from __future__ import annotations

import inspect
import itertools
import os
import re
from collections.abc import Iterator

import pytest
from hypothesis import settings

from tests.redis_server import ListeningRedis, RedisClusterServers, RedisServer

# `scripts/check --fast` runs property tests with fewer examples, a test's own
# @settings(max_examples=...) included (capped in pytest_collection_modifyitems); the
# full check keeps Hypothesis's default of 100, or what a test sets itself.
# Both draw their examples from a fixed seed (derandomize): a run fails the same way every
# time or never, so a property test cannot make the suite flaky.
settings.register_profile("fast", max_examples=15, deadline=None, derandomize=True)
settings.register_profile("deterministic", derandomize=True)
settings.load_profile("deterministic")


def _ports_of_this_worker() -> None:
    """Parallel workers (pytest-xdist) take free ports from disjoint ranges below the
    kernel's ephemeral range, so two workers (or a client's outgoing connection)
    never pick the same "free" port between the probe and the server's bind."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return
    import socket

    import crowdmix.cluster
    import tests.redis_server

    first = 20_000 + 1_000 * int(worker[2:])
    ports = itertools.cycle(range(first, first + 1_000))

    def free_port() -> int:
        for _ in range(1_000):
            port = next(ports)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
        raise RuntimeError(f"no free port in {first}..{first + 999} for worker {worker}")

    crowdmix.cluster.free_port = free_port
    tests.redis_server.free_port = free_port  # type: ignore[attr-defined]


_ports_of_this_worker()

# What makes a test ``integration`` (``scripts/check --fast`` leaves it to the full
# check): it starts a process, a server or Redis — seen in its own source, in the
# fixtures it uses and in the module's functions it calls — not the folder it is in.
_STARTS_SOMETHING = re.compile(
    r"subprocess|Popen|LocalCluster|local_cluster|RedisServer|RedisCluster|redis_url|"
    r"private_redis|cluster_url|rediss_url|unix_url|start_shuffler|start_aggregator|"
    r"grpc\.server|grpc\.aio\.server|aio\.server|serve_forever|multiprocessing|"
    r"run_demo|ShufflerHandle|AggregatorHandle|Pipeline\(|\bserving\(|sys\.executable|"
    r"\}_url\b"  # request.getfixturevalue(f"{kind}_url"): a store over a real Redis
)


def _source(obj: object) -> str | None:
    """``inspect.getsource(obj)``, read once per object: a fixture or helper is shared
    by many tests, and re-reading it for each was most of the suite's collection time."""
    key = id(obj)
    if key not in _SOURCE:
        try:
            _SOURCE[key] = (obj, inspect.getsource(obj))  # type: ignore[arg-type]
        except (OSError, TypeError):
            _SOURCE[key] = (obj, None)
    return _SOURCE[key][1]


_SOURCE: dict[int, tuple[object, str | None]] = {}  # the object is kept: its id stays its own


def _sources(item: pytest.Function) -> Iterator[str]:
    """The source of the test, of every fixture it uses, and of the module-level
    functions and classes either calls (one level deep)."""
    module = inspect.getmodule(item.function)
    seen: set[str] = set()
    todo = [item.function]
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        todo.extend(d.func for d in defs)
    depth = {id(f): 0 for f in todo}
    while todo:
        func = todo.pop()
        text = _source(func)
        if text is None:
            continue
        yield text
        if depth[id(func)] >= 1 or module is None:
            continue
        for name in set(re.findall(r"\b([A-Za-z_]\w*)\(", text)) - seen:
            seen.add(name)
            obj = getattr(module, name, None)
            own = getattr(obj, "__module__", None) in (module.__name__, "tests.daemons")
            if own and (inspect.isfunction(obj) or inspect.isclass(obj)):
                depth[id(obj)] = depth[id(func)] + 1
                todo.append(obj)


def _starts_something(item: pytest.Item) -> bool:
    if not isinstance(item, pytest.Function):
        return False
    # Parametrized cases of one test share its function and fixtures: one answer.
    info = getattr(item, "_fixtureinfo", None)
    fixtures = tuple(
        d.func for defs in (info.name2fixturedefs.values() if info else ()) for d in defs
    )
    key = (item.function, fixtures)
    if key not in _STARTS:
        _STARTS[key] = any(_STARTS_SOMETHING.search(text) for text in _sources(item))
    return _STARTS[key]


_STARTS: dict[tuple[object, ...], bool] = {}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``integration`` the tests that start real servers, processes or Redis; under
    the ``fast`` profile, cap every property test's examples at the profile's."""
    for item in items:
        if item.get_closest_marker("integration") is None and _starts_something(item):
            item.add_marker(pytest.mark.integration)
    if settings.get_current_profile_name() == "fast":
        cap = settings.get_profile("fast").max_examples
        for item in items:
            test = getattr(item, "obj", None)
            own = getattr(test, "_hypothesis_internal_use_settings", None)
            if isinstance(own, settings) and own.max_examples > cap:
                test._hypothesis_internal_use_settings = settings(own, max_examples=cap)  # type: ignore[union-attr]


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
