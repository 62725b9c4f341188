"""A ``GetConfig`` answer that does not carry ``window_tolerance`` (a shuffler, a cached
answer or a bundled file from before the field) must not make the device drop the
previous window's reports unasked: proto3 reads the missing field as 0."""

from __future__ import annotations

from crowdmix.client.device_config import from_proto
from crowdmix.core.device_config import DeviceConfig, to_proto
from crowdmix.core.registry import parse_registry
from crowdmix.core.sealed import PublicKeySet


def test_an_answer_without_window_tolerance_keeps_the_shufflers_default() -> None:
    registry = parse_registry(
        {
            "collection": {"window_seconds": 3600},
            "metrics": {"a": {"encoding": "krr", "epsilon": 1.0, "domain_size": 4}},
        }
    )
    old = to_proto(DeviceConfig.of(registry, PublicKeySet(())))
    old.ClearField("window_tolerance")  # as a shuffler before the field wrote it
    assert from_proto(old).window_tolerance == 1
