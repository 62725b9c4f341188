"""The histogram figures' memory does not grow with the crowd: every pmf/sf array is
evaluated in blocks, and ``shift_delta`` sums terms only out to the binomial's width.

Blocks change no figure (checked to the last bit); memory is checked with tracemalloc,
which counts numpy's buffers (no timing: the peak is a count of bytes).
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable, Iterator

import numpy as np
import pytest
from scipy import stats

from crowdmix.aggregator.accounting import histogram, histogram_blanket
from crowdmix.aggregator.accounting.histogram import histogram_delta, shift_delta
from crowdmix.aggregator.accounting.histogram_blanket import blanket_delta, cover_grid
from crowdmix.core.histogram import HistogramParams

# d = 4, m = 4 at n_h = 10^4: the unblocked code held ~13M-cell arrays here at ε = 0
# (~1 GB); at 10^5 it needed ~30 GB.
PARAMS = HistogramParams(domain_size=4, fake_slots=4, fake_probability=0.5, local_epsilon=1.0)
N_HONEST = 10_000
PEAK_LIMIT = 64 * 2**20


@pytest.fixture
def fresh_grid() -> Iterator[None]:
    cover_grid.cache_clear()
    yield
    cover_grid.cache_clear()


def _peak(fn: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("eps", [0.0, 0.2, 0.9])
def test_histogram_delta_peak_memory_is_bounded(eps: float, fresh_grid: None) -> None:
    peak = _peak(lambda: histogram_delta(eps, PARAMS, n_honest=N_HONEST))
    assert peak < PEAK_LIMIT, f"peak {peak / 2**20:.0f} MiB at ε = {eps}"


def test_shift_delta_blocks_change_no_figure(monkeypatch: pytest.MonkeyPatch) -> None:
    t = np.arange(0, 3000, 7)
    for eps in (0.0, 0.05, 0.7):
        whole = shift_delta(eps, t)
        monkeypatch.setattr(histogram, "_BLOCK_CELLS", 97)
        blocked = shift_delta(eps, t)
        monkeypatch.undo()
        assert np.array_equal(whole, blocked)


def test_blanket_blocks_change_no_figure(monkeypatch: pytest.MonkeyPatch, fresh_grid: None) -> None:
    kwargs = dict(n_honest=5_000, domain_size=10, fake_slots=2, fake_probability=0.4)
    for eps in (0.0, 0.1, 0.5):
        whole = blanket_delta(eps, local_epsilon=2.0, **kwargs)  # type: ignore[arg-type]
        cover_grid.cache_clear()
        monkeypatch.setattr(histogram_blanket, "_BLOCK_CELLS", 113)
        blocked = blanket_delta(eps, local_epsilon=2.0, **kwargs)  # type: ignore[arg-type]
        monkeypatch.undo()
        cover_grid.cache_clear()
        assert whole == blocked


@pytest.mark.parametrize("t", [10**4, 10**6, 10**8 + 1])
def test_width_cap_on_terms_loses_nothing_at_epsilon_zero(t: int) -> None:
    # δ_t(0) is the total variation of 1 + Bin(t, ½) and Bin(t, ½): the sum telescopes to
    # B_t(⌊(t + 1)/2⌋). About 6√t terms are summed, not the ~t/2 past a0.
    assert histogram._terms(0.0, t) <= 6 * math.sqrt(t) + 41
    exact = float(stats.binom.pmf((t + 1) // 2, t, 0.5))
    got = float(shift_delta(0.0, [t])[0])
    assert exact * (1 - 1e-12) <= got <= exact * (1 + 1e-9)
