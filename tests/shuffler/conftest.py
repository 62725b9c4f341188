from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.store import AsyncAppender, PendingWrite, ShufflerStore, async_appender
from tests.shuffler.helpers import RecordingAggregator


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[ShufflerStore]:
    """Each store implementation, fresh (the Redis one on the session's flushed server)."""
    if request.param == "memory":
        yield MemoryStore()
        return
    from crowdmix.shuffler.redis_store import RedisStore

    url = request.getfixturevalue("redis_url")
    s = RedisStore(url)
    yield s
    s.close()


class LoopAppended:
    """A store whose ``append`` goes through its event-loop appender: the path the
    server's group commit takes (``crowdmix.shuffler.commit``). Everything else is the store's."""

    def __init__(self, store: ShufflerStore) -> None:
        appender = async_appender(store)
        assert appender is not None, f"{type(store).__name__} offers no event-loop appender"
        self._store = store
        self._appender: AsyncAppender = appender
        self._runner = asyncio.Runner()  # the appender's connection belongs to one loop

    def append(self, writes: Sequence[PendingWrite]) -> None:
        self._runner.run(self._appender.append(writes))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def close(self) -> None:
        try:
            self._runner.run(self._appender.aclose())
        finally:
            self._runner.close()
            self._store.close()


STORE_URLS = {
    "redis": "redis_url",
    "rediss": "rediss_url",
    "unix": "unix_url",
    "cluster": "cluster_url",
}


@pytest.fixture(
    params=[
        f"{backend}{path}"
        for backend in ("memory", "redis", "rediss", "unix", "cluster")
        for path in ("", "+loop")
    ]
)
def every_store(request: pytest.FixtureRequest) -> Iterator[Any]:
    """Every backend and every way to reach it: memory; Redis over ``redis://``,
    ``rediss://`` (TLS) and ``unix://``; a Redis Cluster (``redis+cluster://``); each
    with ``append`` called directly and (``+loop``) through the event-loop appender the
    server uses."""
    backend, _, loop = str(request.param).partition("+")
    store: ShufflerStore
    if backend == "memory":
        store = MemoryStore()
    else:
        from crowdmix.shuffler.redis_store import RedisStore

        store = RedisStore(request.getfixturevalue(STORE_URLS[backend]))
    s: Any = LoopAppended(store) if loop else store
    yield s
    s.close()


@pytest.fixture
def aggregator() -> Iterator[RecordingAggregator]:
    agg = RecordingAggregator()
    yield agg
    agg.stop()
