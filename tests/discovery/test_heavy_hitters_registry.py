"""A heavy-hitters metric in the registry: every field stated, errors name the field."""

from __future__ import annotations

from typing import Any

import pytest

from crowdmix.core.discovery import REPORT_BYTES
from crowdmix.core.registry import RegistryError, parse_registry

ENTRY: dict[str, Any] = {
    "encoding": "heavy-hitters",
    "alphabet": "abcdefghijklmnopqrstuvwxyz",
    "max_length": 6,
    "spans": [3, 7],
    "keep": 20,
    "candidates": 10,
    "seeds": 16,
    "weights": [0.4, 0.3, 0.3],
    "epsilon": 2.0,
    "delta": 1e-6,
    "devices": 100_000,
}
FIELDS = [k for k in ENTRY if k != "encoding"]


def _parse(entry: dict[str, Any]) -> Any:
    return parse_registry({"metrics": {"words": entry}, "collection": {"window_seconds": 3600}})


def test_a_full_entry_parses_released_per_window() -> None:
    metric = _parse(dict(ENTRY))["words"]
    hh = metric.heavy_hitters
    assert hh is not None and hh.spans == (3, 7) and hh.weights == (0.4, 0.3, 0.3)
    assert (metric.encoding, metric.report_bytes, metric.num_cohorts) == (
        "heavy-hitters",
        REPORT_BYTES,
        1,
    )
    assert metric.windowed and not metric.requires_sealing and metric.domain_size is None
    assert metric.shuffle.release == "window"  # one shuffle per round's window
    assert metric.fingerprint == hh.fingerprint()
    other = _parse({**ENTRY, "keep": 21})["words"]
    assert other.fingerprint != metric.fingerprint


@pytest.mark.parametrize("field", FIELDS)
def test_a_missing_field_is_named(field: str) -> None:
    entry = {k: v for k, v in ENTRY.items() if k != field}
    with pytest.raises(RegistryError, match=rf"metric 'words': {field} is required for heavy"):
        _parse(entry)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("spans", [3, 6], "the last span must be 7"),
        ("spans", [4, 3, 7], "spans must be increasing"),
        ("weights", [0.5, 0.5], "weights needs 3 shares"),
        ("weights", [0.5, 0.3, 0.3], "weights must be positive and sum to 1"),
        ("keep", 0, "keep must be a positive integer"),
        ("epsilon", -1.0, "epsilon must be a positive number"),
        ("delta", 1.5, "delta must be in"),
        ("devices", 2, "devices must be at least 3"),
        ("alphabet", "aab", "alphabet characters must be distinct"),
        ("max_length", 0, "max_length must be an integer"),
        ("bogus", 1, r"unknown field\(s\) \['bogus'\]"),
    ],
)
def test_a_bad_field_is_named(field: str, value: Any, message: str) -> None:
    with pytest.raises(RegistryError, match=rf"metric 'words': .*{message}"):
        _parse({**ENTRY, field: value})


def test_a_round_is_one_shuffle_of_its_window() -> None:
    with pytest.raises(RegistryError, match="its shuffle release must be 'window'"):
        _parse({**ENTRY, "shuffle": {"release": "max_batch"}})


def test_the_aggregator_refuses_at_start_a_target_no_round_can_meet() -> None:
    from crowdmix.aggregator.daemon.ingest import Ingestor
    from crowdmix.aggregator.errors import ConfigError
    from crowdmix.aggregator.store import open_store

    registry = parse_registry({"metrics": {"words": {**ENTRY, "epsilon": 1e-3}}})
    with pytest.raises(ConfigError, match=r"metric 'words': the target \(ε=0.001"):
        Ingestor(registry, open_store(None))


def test_a_min_batch_above_the_smallest_group_is_refused() -> None:
    """Each round's ε0 is planned over min_batch reports: a min_batch above the smallest
    expected group (devices x min weight) would hold its rounds back for ever."""
    assert _parse({**ENTRY, "shuffle": {"min_batch": 30_000}})["words"].shuffle.min_batch == 30_000
    with pytest.raises(
        RegistryError,
        match=r"^metric 'words': shuffle.min_batch \(30001\) exceeds the smallest expected "
        r"round group \(devices x min weights = 30000\): its rounds would never be released$",
    ):
        _parse({**ENTRY, "shuffle": {"min_batch": 30_001}})
