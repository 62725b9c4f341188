"""An app's own privacy ceiling, against a real shuffler serving ordinary params."""

from __future__ import annotations

from pathlib import Path

import pytest

import client
from shuffler.memory_store import MemoryStore
from shuffler.server import start_shuffler
from tests.e2e.test_reporter_review import TOKEN
from tests.shuffler.helpers import OUE, RAPPOR, make_registry

pytestmark = pytest.mark.slow  # a real server


def test_an_app_lowers_the_ceiling_and_a_metric_above_it_claims_nothing(tmp_path: Path) -> None:
    store = MemoryStore()
    with (
        start_shuffler(make_registry(min_batch=1), store, tokens=frozenset({TOKEN})) as s,
        client.Reporter(
            tmp_path / "app",
            f"127.0.0.1:{s.port}",
            token=TOKEN,
            tls=False,
            sealing="off",
            background=False,
            max_epsilon=0.5,  # below the OUE metric's ε = 1 and RAPPOR's ε_1 ≈ 1.07
        ) as r,
    ):
        for metric, figure in ((OUE, "ε = 1"), (RAPPOR, "ε_1 = 1.07")):
            with pytest.raises(client.ParamsError, match=f"'{metric}'.*{figure}.*= 0.5"):
                r.report(metric, "a")
        assert r.queued == 0 and r.flush(timeout=5) == 0
        assert r.counters() == {}
    assert not store.pending(OUE)
