"""Multiple-testing corrections and intervals (exact checks + one seeded simulation)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import crowdmix.aggregator.decode
from crowdmix.aggregator.decode.stats import (
    Correction,
    IntervalMethod,
    confidence_interval,
    critical_z,
    one_sided_p_values,
    report_intervals,
    selective_interval,
    significant,
)


def brute_force_bh(p: list[float], alpha: float) -> set[int]:
    """Largest r with p_(r) <= r·α/C; reject the r smallest (definition, by enumeration)."""
    c = len(p)
    order = sorted(range(c), key=lambda i: p[i])
    best = 0
    for r in range(1, c + 1):
        if p[order[r - 1]] <= r * alpha / c:
            best = r
    return set(order[:best])


@pytest.mark.parametrize("seed", range(20))
def test_benjamini_hochberg_matches_its_definition(seed: int) -> None:
    rng = np.random.default_rng(seed)
    p = np.concatenate([rng.uniform(0, 0.02, 5), rng.uniform(0, 1, 15)])
    got = set(np.flatnonzero(significant(p, alpha=0.1, correction="bh")).tolist())
    assert got == brute_force_bh(p.tolist(), 0.1)


def test_bonferroni_counts_untested_candidates() -> None:
    p = np.array([0.001, 0.004, 0.02])
    assert significant(p, correction="bonferroni").tolist() == [True, True, False]
    assert significant(p, correction="bonferroni", num_tests=50).tolist() == [True, False, False]
    assert significant(p, correction="bonferroni", num_tests=100).tolist() == [False] * 3
    assert significant(p, correction="none").tolist() == [True, True, True]
    with pytest.raises(ValueError, match="num_tests"):
        significant(p, num_tests=2)
    with pytest.raises(ValueError, match="correction"):
        significant(p, correction="holm")  # type: ignore[arg-type]


def test_p_values_and_wald_interval() -> None:
    p = one_sided_p_values([2.0, -1.0, 1.0], [1.0, 1.0, 0.0])
    assert p[0] == pytest.approx(0.02275, abs=1e-5) and p[1] == 1.0 and p[2] == 1.0
    lo, hi = confidence_interval([1.0, 0.1], [0.5, 0.5])
    assert hi[0] == pytest.approx(1.0 + 1.959964 * 0.5, rel=1e-6) and lo[1] == 0.0
    assert critical_z(0.025) == pytest.approx(1.959964, rel=1e-6)


@pytest.mark.slow  # heavy: the full check runs it, scripts/check --fast does not
@pytest.mark.parametrize(("mu", "cutoff"), [(2.5, 3.3), (0.3, 2.0), (4.0, 3.3)])
def test_selective_interval_has_its_level_given_selection(mu: float, cutoff: float) -> None:
    # 400,000 draws around a mean near the cutoff (4.5-76% are selected: >= 18,000
    # intervals). The intervals are supersets of the exact conditional ones
    # within β >= 0, so their conditional coverage is >= 95%; its binomial sd is
    # <= 0.16%. Failing needs coverage 6 sd below 95%: false-failure probability
    # <= 1e-9 per case. The upper bound 99% is > 25 sd above what they give.
    rng = np.random.default_rng(77)
    x = rng.normal(mu, 1.0, 400_000)
    sel = x[x > cutoff]
    lo, hi = selective_interval(sel, np.ones(sel.size), cutoff)
    assert np.all(lo <= sel) and np.all(sel <= hi) and np.all(lo >= 0)
    coverage = float(np.mean((lo <= mu) & (mu <= hi)))
    sd = (0.95 * 0.05 / sel.size) ** 0.5
    assert coverage >= 0.95 - 6 * sd
    assert coverage <= 0.99  # not trivially wide


def test_selective_interval_stays_conservative_but_useful() -> None:
    rng = np.random.default_rng(77)
    mu, cutoff = 2.5, 3.3
    x = rng.normal(mu, 1.0, 400_000)
    sel = x[x > cutoff]
    wlo, whi = confidence_interval(sel, np.ones(sel.size))
    assert float(np.mean((wlo <= mu) & (mu <= whi))) < 0.93  # the problem it fixes
    far = selective_interval([50.0], [1.0], cutoff)
    assert far[0][0] == pytest.approx(50 - 1.959964, abs=1e-3)  # no correction far away
    with pytest.raises(ValueError):
        selective_interval([1.0], [0.0], 2.0)


def test_barely_selected_estimate_is_inside_its_interval() -> None:
    # This gave (0, -1117) and the report printed "v7 698 [0, -1,118]".
    lo, hi = selective_interval([698.174], [208.762], critical_z(0.05 / 120))
    assert 0.0 <= lo[0] <= 698.174 <= hi[0]
    # k-RR printed "[0, -60]": a negative unbiased estimate keeps its Wald interval.
    lo, hi = confidence_interval([-100.0], [20.0])
    assert lo[0] == pytest.approx(-139.19928) and hi[0] == pytest.approx(-60.80072)


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
positive = st.floats(1e-9, 1e6, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    est=st.lists(finite, min_size=1, max_size=8),
    se=st.lists(positive, min_size=8, max_size=8),
    sig=st.lists(st.booleans(), min_size=8, max_size=8),
    method=st.sampled_from(["wald", "selective"]),
    correction=st.sampled_from(["bonferroni", "bh", "none"]),
    alpha=st.floats(0.001, 0.5),
)
def test_every_interval_contains_its_estimate(
    est: list[float],
    se: list[float],
    sig: list[bool],
    method: IntervalMethod,
    correction: Correction,
    alpha: float,
) -> None:
    n = len(est)
    x = np.array(est)
    lo, hi = report_intervals(
        x, np.array(se[:n]), np.array(sig[:n]), method=method, alpha=alpha, correction=correction
    )
    assert np.all(lo <= x) and np.all(x <= hi)
    assert np.all(np.where(x >= 0, lo >= 0, True))


@settings(max_examples=300, deadline=None)
@given(z=st.floats(-3.0, 60.0), cutoff=st.floats(0.0, 6.0), se=positive)
def test_selective_interval_contains_estimate(z: float, cutoff: float, se: float) -> None:
    x = (cutoff + abs(z)) * se  # selected: x/se > cutoff
    lo, hi = selective_interval([x], [se], cutoff)
    assert 0.0 <= lo[0] <= x <= hi[0]


def test_public_surface_of_decode() -> None:
    exported = set(crowdmix.aggregator.decode.__all__)
    assert exported == {
        name for name in dir(crowdmix.aggregator.decode) if not name.startswith("_")
    } - {
        "basic",
        "errors",
        "rappor",
        "rappor_model",
        "wls",
        "result",
        "stats",
        "simulate",
        "shrink",
        "histogram",
        "ridge",
        "annotations",
    }
    for a, b in itertools.combinations(sorted(exported), 2):
        assert a != b
