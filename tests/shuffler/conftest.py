from __future__ import annotations

from collections.abc import Iterator

import pytest

from shuffler.memory_store import MemoryStore
from shuffler.store import ShufflerStore
from tests.shuffler.helpers import RecordingAggregator


@pytest.fixture(params=["memory", "redis"])
def store(request: pytest.FixtureRequest) -> Iterator[ShufflerStore]:
    """Each store implementation, fresh (the Redis one on the session's flushed server)."""
    if request.param == "memory":
        yield MemoryStore()
        return
    from shuffler.redis_store import RedisStore

    url = request.getfixturevalue("redis_url")
    s = RedisStore(url)
    yield s
    s.close()


@pytest.fixture
def aggregator() -> Iterator[RecordingAggregator]:
    agg = RecordingAggregator()
    yield agg
    agg.stop()
