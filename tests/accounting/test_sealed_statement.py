"""Sealing changes who can learn what, never a privacy figure."""

from __future__ import annotations

import dataclasses

import numpy as np

from crowdmix.aggregator.accounting import privacy_statement
from crowdmix.aggregator.report.job import privacy_figures
from crowdmix.core.params import RapporParams
from crowdmix.core.registry import MetricConfig, ShufflePolicy

METRIC = MetricConfig(
    name="m",
    rappor=RapporParams(k=64, h=2, m=8, f=0.25, p=0.25, q=0.75),
    shuffle=ShufflePolicy(min_batch=1000),
)


def _numbers(d: dict[str, object]) -> dict[str, object]:
    return {k: v for k, v in d.items() if k not in ("sealed", "who_learns_what")}


def test_the_figures_are_equal_sealed_and_plaintext() -> None:
    totals = np.full(8, 5000, dtype=np.int64)
    figures = {
        s: privacy_figures(METRIC, totals, batch_sizes=[20_000, 20_000], sealed=s)
        for s in (True, False, None)
    }
    dicts = {s: f["statement"] for s, f in figures.items()}
    assert _numbers(dicts[True]) == _numbers(dicts[False]) == _numbers(dicts[None])
    assert dicts[True]["central"]["amplified"]  # a real amplified figure was compared
    assert [dicts[s]["sealed"] for s in (True, False, None)] == [True, False, None]


def test_the_statement_says_who_can_learn_what() -> None:
    base = privacy_statement(METRIC, 40_000, batch_sizes=[40_000])
    e1 = f"ε_1 = {base.epsilon_local:.4g}"
    sealed = dataclasses.replace(base, sealed=True)
    plain = dataclasses.replace(base, sealed=False)
    assert sealed.who_learns_what["shuffler"].startswith("only metadata")
    assert e1 not in sealed.who_learns_what["shuffler"]
    assert f"already {e1}" in plain.who_learns_what["shuffler"]
    for s in (sealed, plain):
        assert f"(ε = {base.central.epsilon:.4g}" in s.who_learns_what["aggregator"]
        assert s.who_learns_what["together"].startswith(e1)
    assert "the shuffler alone learns only metadata" in sealed.render()
    assert "the shuffler alone learns each report beside" in plain.render()
    unknown = base.who_learns_what["shuffler"]
    assert "if the reports were sealed" in unknown and f"already {e1}" in unknown


def test_reports_that_were_never_shuffled_name_no_shuffler() -> None:
    """google/rappor's files: no shuffler in the path, so none is said to learn anything."""
    e1 = privacy_statement(METRIC, 40_000, shuffled=False)
    who = e1.who_learns_what
    assert who["shuffler"].startswith("nothing: the reports did not pass through a shuffler")
    assert "not shuffled" in who["aggregator"] and "if the reports were sealed" not in str(who)
