"""Fixtures of the end-to-end tests that more than one file uses."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.e2e.config_server import TOKEN
from tests.shuffler.helpers import make_registry, write_keys


@pytest.fixture
def sealed_shuffler(tmp_path: Path) -> Iterator[ShufflerHandle]:
    """A shuffler on loopback that publishes a new aggregator key (so it takes sealed
    reports only), releases each report at once (min_batch 1), and takes ``TOKEN``."""
    _, _, public = write_keys(tmp_path)
    settings = ShufflerSettings(public_keys=str(public))
    with start_shuffler(
        make_registry(min_batch=1), settings=settings, tokens=frozenset({TOKEN})
    ) as s:
        yield s
