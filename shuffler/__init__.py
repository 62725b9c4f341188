"""crowdmix shuffler daemon: authenticate, validate, store durably, threshold,
shuffle, forward (see DESIGN.md, "Shuffler daemon").

    from crowdmix.shuffler import MemoryStore, start_shuffler
    handle = start_shuffler(registry, MemoryStore(), aggregator="127.0.0.1:7500")
    ...                                   # clients submit to 127.0.0.1:{handle.port}
    handle.stop()

Importing ``shuffler`` loads no grpc; ``start_shuffler`` and the gRPC pieces
import it when used. Exceptions: ``crowdmix.shuffler.errors`` (hierarchy in its docstring).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from crowdmix.shuffler.config import ShufflerSettings, load_config
from crowdmix.shuffler.errors import (
    BindError,
    ConfigError,
    ForwardError,
    InvalidRequest,
    Overloaded,
    RequestRejected,
    ShufflerError,
    StoreUnavailable,
    Unauthenticated,
)
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.store import InFlightBatch, PendingWrite, QueueKey, ShufflerStore

if TYPE_CHECKING:
    from crowdmix.shuffler.redis_store import RedisStore
    from crowdmix.shuffler.server import ShufflerHandle, start_shuffler

__all__ = [
    "BindError",
    "ConfigError",
    "ForwardError",
    "InFlightBatch",
    "InvalidRequest",
    "MemoryStore",
    "Overloaded",
    "PendingWrite",
    "QueueKey",
    "RedisStore",
    "RequestRejected",
    "ShufflerError",
    "ShufflerHandle",
    "ShufflerSettings",
    "ShufflerStore",
    "StoreUnavailable",
    "Unauthenticated",
    "load_config",
    "start_shuffler",
]

_LAZY = {
    "RedisStore": "crowdmix.shuffler.redis_store",
    "ShufflerHandle": "crowdmix.shuffler.server",
    "start_shuffler": "crowdmix.shuffler.server",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shuffler' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
