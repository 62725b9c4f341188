"""An app's own privacy ceiling, against a real shuffler serving ordinary params."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from crowdmix import client
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import start_shuffler
from tests.e2e.config_server import TOKEN, serve_config
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
        assert r.flush(timeout=5) == 0  # the config
        for metric, figure in ((OUE, "ε = 1"), (RAPPOR, "ε_1 = 1.07")):
            result = r.report(metric, "a")
            assert result.status is client.ReportStatus.REFUSED_BY_CEILING
            assert re.search(f"'{metric}'.*{figure}.*= 0.5", result.detail), result.detail
        assert r.queued == 0 and r.flush(timeout=5) == 0
        assert r.counters() == {"refused_by_ceiling": 2}
    assert not store.pending(OUE)


def test_a_histogram_sent_without_local_randomization_needs_the_apps_opt_in(
    tmp_path: Path,
) -> None:
    """A served shuffled histogram without k-RR (ε_L = ∞) sends the value itself,
    hidden only by the seal and the shuffle: the app must have said it accepts that."""
    from crowdmix.core.device_config import DeviceConfig, to_proto
    from crowdmix.core.histogram import HistogramParams
    from crowdmix.core.registry import MetricConfig
    from crowdmix.core.sealed import PublicKeySet

    hist = MetricConfig(
        name="screen",
        histogram=HistogramParams(domain_size=4, fake_slots=1, fake_probability=0.5),
    )
    answer = to_proto(DeviceConfig(metrics={"screen": hist}, keys=PublicKeySet(())))
    with (
        serve_config(answer) as target,
        client.Reporter(tmp_path / "app", target, tls=False, background=False) as r,
    ):
        assert r.flush(timeout=5) == 0  # the config
        result = r.report("screen", 1)
        assert result.status is client.ReportStatus.REFUSED_BY_CEILING
        assert re.search(r"'screen'.*ε_L = inf.*allow_unrandomized_histograms", result.detail)
        assert r.queued == 0
