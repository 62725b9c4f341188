"""Multiple-testing corrections and intervals (exact checks + one seeded simulation)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import aggregator.decode
from aggregator.decode.stats import (
    confidence_interval,
    critical_z,
    one_sided_p_values,
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


def test_selective_interval_has_its_level_given_selection() -> None:
    # 400,000 draws around a mean under the cutoff (~21% are selected, so plain
    # Wald intervals under-cover). The conditional coverage of the ~84,000
    # selected intervals is 95% ± 0.075% sd; accept ±0.5% (6.7 sd, ~2e-11).
    rng = np.random.default_rng(77)
    mu, cutoff = 2.5, 3.3
    x = rng.normal(mu, 1.0, 400_000)
    sel = x[x > cutoff]
    lo, hi = selective_interval(sel, np.ones(sel.size), cutoff)
    coverage = float(np.mean((lo <= mu) & (mu <= hi)))
    assert abs(coverage - 0.95) < 0.005
    wlo, whi = confidence_interval(sel, np.ones(sel.size))
    assert float(np.mean((wlo <= mu) & (mu <= whi))) < 0.93  # the problem it fixes
    far = selective_interval([50.0], [1.0], cutoff)
    assert far[0][0] == pytest.approx(50 - 1.959964, abs=1e-3)  # no correction far away
    with pytest.raises(ValueError):
        selective_interval([1.0], [0.0], 2.0)


def test_public_surface_of_decode() -> None:
    exported = set(aggregator.decode.__all__)
    assert exported == {name for name in dir(aggregator.decode) if not name.startswith("_")} - {
        "basic",
        "errors",
        "rappor",
        "rappor_model",
        "wls",
        "result",
        "stats",
        "simulate",
        "annotations",
    }
    for a, b in itertools.combinations(sorted(exported), 2):
        assert a != b
