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


def test_an_answer_without_window_tolerance_keeps_the_shufflers_default() -> None:
    """A shuffler, a cached answer or a bundled file from before the field sends no
    ``window_tolerance``: proto3 reads it as 0, which must not make the device drop the
    previous window's reports unasked."""
    registry = parse_registry(
        {
            "collection": {"window_seconds": 3600},
            "metrics": {"a": {"encoding": "krr", "epsilon": 1.0, "domain_size": 4}},
        }
    )
    old = to_proto(DeviceConfig.of(registry, PublicKeySet(())))
    old.ClearField("window_tolerance")  # as a shuffler before the field wrote it
    assert from_proto(old).window_tolerance == 1
