"""What GetConfig tells a device, both ways through the wire (crowdmix.client.device_config)."""

from __future__ import annotations

import pytest

from crowdmix.client.device_config import from_proto
from crowdmix.client.errors import ParamsError
from crowdmix.core.device_config import DeviceConfig, to_proto
from crowdmix.core.registry import parse_registry
from crowdmix.core.sealed import PublicKeySet
from crowdmix.protos import crowdmix_pb2 as pb


def test_window_and_disposal_age_travel_with_the_params() -> None:
    registry = parse_registry(
        {
            "collection": {"window_seconds": 7200},
            "metrics": {
                "a": {"encoding": "krr", "epsilon": 1.0, "domain_size": 4},
                "b": {
                    "encoding": "krr",
                    "epsilon": 1.0,
                    "domain_size": 4,
                    "shuffle": {"disposal_days": 1.5},
                },
            },
        }
    )
    config = DeviceConfig.of(registry, PublicKeySet(()), cache_seconds=60, window_tolerance=2)
    back = from_proto(pb.ConfigResponse.FromString(to_proto(config).SerializeToString()))
    assert back.window_seconds == 7200 and back.cache_seconds == 60
    assert back.window_tolerance == 2
    assert back.disposal_seconds == {"a": 30 * 86400, "b": 129600}
    assert back.version == config.version
    # an answer without a window is refused, never given a default one
    bare = to_proto(config)
    bare.ClearField("window_seconds")
    with pytest.raises(ParamsError, match="window_seconds 0"):
        from_proto(bare)
