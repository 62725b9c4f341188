"""The device's privacy ceiling: served params less private than it allows make no report."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from crowdmix.client.ceiling import MAX_EPSILON, MAX_EPSILON_INF, Ceiling
from crowdmix.client.errors import ParamsError
from crowdmix.client.reporter import Reporter
from crowdmix.core.basic import BasicParams
from crowdmix.core.histogram import HistogramParams
from crowdmix.core.params import RapporParams
from crowdmix.core.privacy import epsilon_inf, epsilon_one
from crowdmix.core.registry import MetricConfig, parse_registry

ROOT = Path(__file__).resolve().parents[2]


def _check(mc: MetricConfig, **kw: object) -> None:
    """ParamsError with the ceiling's refusal, as the reporter reports it."""
    refusal = Ceiling(**kw).refusal(mc.name, mc)  # type: ignore[arg-type]
    if refusal is not None:
        raise ParamsError(refusal)


def _rappor(**kw: float) -> MetricConfig:
    p: dict[str, float] = {"f": 0.5, "p": 0.5, "q": 0.75}
    p.update(kw)
    return MetricConfig(name="page", rappor=RapporParams(k=16, h=2, m=8, **p))  # type: ignore[arg-type]


def test_the_defaults_are_ten_per_report_and_twenty_for_rappor_epsilon_inf() -> None:
    import inspect

    params = inspect.signature(Reporter).parameters
    assert params["max_epsilon"].default == MAX_EPSILON == 10.0
    assert params["max_epsilon_inf"].default == MAX_EPSILON_INF == 20.0
    assert params["allow_unrandomized_histograms"].default is False


def test_the_shipped_example_registry_is_within_the_default_ceiling() -> None:
    text = (ROOT / "deploy" / "metrics.example.toml").read_text()
    registry = parse_registry(tomllib.loads(text))
    for name, mc in registry.metrics.items():
        _check(mc)  # raises for a metric above the ceiling
        assert name


def test_rappor_is_held_to_epsilon_one_and_epsilon_inf() -> None:
    _check(_rappor())  # google/rappor's defaults: ε_1 ≈ 1.07, ε_∞ ≈ 4.39
    with pytest.raises(ParamsError, match=r"'page'.*ε_1 = inf.*max_epsilon = 10"):
        _check(_rappor(f=0.0, p=0.0, q=1.0))  # the Bloom filter in the clear
    # f = 0.01: each report is private (small ε_1), the PRR is nearly the Bloom filter
    nearly = _rappor(f=0.01, p=0.45, q=0.55)
    assert epsilon_one(nearly.rappor) <= MAX_EPSILON  # type: ignore[arg-type]
    assert epsilon_inf(nearly.rappor) > MAX_EPSILON_INF  # type: ignore[arg-type]
    with pytest.raises(ParamsError, match=r"'page'.*ε_∞ = 21\.\d+.*max_epsilon_inf = 20"):
        _check(nearly)
    _check(nearly, max_epsilon_inf=math.inf)  # the app's explicit choice


def test_a_basic_mechanism_is_held_to_its_epsilon() -> None:
    mc = MetricConfig(
        name="theme",
        basic=BasicParams(mechanism="krr", epsilon=12.0, domain_size=3),
        domain=("light", "dark", "auto"),
    )
    with pytest.raises(ParamsError, match=r"'theme'.*ε = 12.*max_epsilon = 10"):
        _check(mc)
    _check(mc, max_epsilon=12.0)  # the ceiling itself is allowed


def test_a_histogram_is_held_to_its_local_epsilon_and_unrandomized_needs_an_opt_in() -> None:
    def hist(eps: float | None) -> MetricConfig:
        params = HistogramParams(
            domain_size=4, fake_slots=2, fake_probability=0.5, local_epsilon=eps
        )
        return MetricConfig(name="lang", histogram=params)

    _check(hist(4.0))
    with pytest.raises(ParamsError, match=r"'lang'.*ε_L = 12.*max_epsilon = 10"):
        _check(hist(12.0))
    # the real value leaves the device, hidden only by the seal and the shuffle
    with pytest.raises(ParamsError, match=r"'lang'.*ε_L = inf.*allow_unrandomized_histograms"):
        _check(hist(None))
    _check(hist(None), allow_unrandomized_histograms=True)


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, True, "10"])
def test_a_ceiling_must_be_a_positive_number(tmp_path: Path, bad: object) -> None:
    for knob in ("max_epsilon", "max_epsilon_inf"):
        with pytest.raises(ValueError, match=knob):
            Reporter(tmp_path / "app", "127.0.0.1:1", **{knob: bad})  # type: ignore[arg-type]
