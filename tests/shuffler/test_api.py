"""The public surface of the shuffler package."""

from __future__ import annotations

import subprocess
import sys

from crowdmix import shuffler


def test_exported_members() -> None:
    assert sorted(shuffler.__all__) == sorted(
        [
            "BindError", "ConfigError", "ForwardError", "InFlightBatch", "InvalidRequest",
            "MemoryStore",
            "Overloaded", "PendingWrite", "QueueKey", "RedisStore", "RequestRejected",
            "ShufflerError", "ShufflerHandle", "ShufflerSettings", "ShufflerStore",
            "StoreUnavailable", "Unauthenticated", "load_config", "start_shuffler",
        ]
    )  # fmt: skip
    for name in shuffler.__all__:
        assert getattr(shuffler, name) is not None


def test_import_shuffler_loads_no_grpc_or_redis() -> None:
    code = (
        "import sys, shuffler; "
        "assert 'grpc' not in sys.modules and 'redis' not in sys.modules, sys.modules.keys()"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_error_hierarchy() -> None:
    assert issubclass(shuffler.ConfigError, ValueError)
    for cls in (shuffler.InvalidRequest, shuffler.Unauthenticated, shuffler.Overloaded):
        assert issubclass(cls, shuffler.RequestRejected)
        assert issubclass(cls, shuffler.ShufflerError)
