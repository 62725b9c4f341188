"""The honest crowd a shuffled-histogram statement counts, against simulated windows: the
statement never counts more honest cover than the worst batch holds, whether the honest
devices fall at random or dishonest devices time their reports to fill batches."""

from __future__ import annotations

import math

import numpy as np
import pytest

from crowdmix.aggregator.accounting.histogram_release import histogram_release
from crowdmix.core.histogram import HistogramParams

# the worked example: d = 4, m = 4, q = 0.5, batches of 1,000 reports
PARAMS = HistogramParams(domain_size=4, fake_slots=4, fake_probability=0.5)
BATCH = 1000


def _window(honest: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Reports per device in store order: honest devices follow the protocol (1 + Bin(m, q)),
    dishonest ones send the shuffler's cap 1 + m (the most they can to crowd a batch)."""
    fakes = rng.binomial(PARAMS.fake_slots, PARAMS.fake_probability, size=len(honest))
    return np.where(honest, 1 + fakes, PARAMS.max_messages)


def _cut(reports: np.ndarray, honest: np.ndarray) -> tuple[tuple[int, ...], int]:
    """Batches of BATCH reports cut from the stream (a device's reports contiguous, the
    remainder held back as under the threshold), and the fewest honest others a device
    of any batch has: honest devices whose whole report set lies in the batch, less it."""
    ends = np.cumsum(reports)
    starts = ends - reports
    batches = int(ends[-1] // BATCH)
    first, last = starts // BATCH, (ends - 1) // BATCH
    whole = (first == last) & (first < batches)
    per_batch = np.bincount(first[whole & honest], minlength=batches)
    return (BATCH,) * batches, max(0, int(per_batch.min()) - 1)


def _random_window(n: int, honest_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    honest = np.ones(n, dtype=bool)
    honest[rng.choice(n, size=math.floor((1.0 - honest_fraction) * n), replace=False)] = False
    return _window(honest, rng), honest


@pytest.mark.parametrize(("honest_fraction", "devices"), [(0.5, 33_000), (0.9, 6_600_000)])
def test_statement_never_counts_more_honest_cover_than_a_batch_holds_at_random(
    honest_fraction: float, devices: int
) -> None:
    """A share 1 − h of the devices dishonest at random places: 131 batches at h = 0.5,
    21,118 at h = 0.9 (where a batch short of the share is rarer: ~0.05 % of them).
    The statement fails only if a confidence bound does (β = 1e-7, charged to δ): the
    false-failure probability of this test is at most 1e-7."""
    reports, honest = _random_window(devices, honest_fraction, seed=25)
    sizes, fewest = _cut(reports, honest)
    stated = histogram_release(
        "h", PARAMS, sum(sizes), batch_sizes=sizes, honest_fraction=honest_fraction
    )
    assert stated.n_honest <= fewest, (stated.n_honest, fewest)


def test_statement_survives_devices_that_time_their_reports_to_fill_batches() -> None:
    """10 % of 33,000 devices send the cap back to back (16 batches hold no honest device
    but the one they surround): the statement counts no honest cover at all."""
    rng = np.random.default_rng(7)
    n, bad = 33_000, 3_300
    honest = np.ones(n, dtype=bool)
    start = 10_000
    honest[start : start + bad] = False
    honest[start + bad // 2] = True  # the target, alone among them
    reports = _window(honest, rng)
    sizes, fewest = _cut(reports, honest)
    assert fewest == 0
    stated = histogram_release("h", PARAMS, sum(sizes), batch_sizes=sizes, honest_fraction=0.9)
    assert stated.n_honest == 0
    assert stated.epsilon == math.inf  # no k-RR: nothing hides the real report
    # the same with the count of dishonest devices given instead of a share
    given = histogram_release("h", PARAMS, sum(sizes), batch_sizes=sizes, dishonest_devices=bad)
    assert given.n_honest == 0


def test_all_honest_batches_are_counted_close_to_what_they_hold() -> None:
    """h = 1: each batch's honest devices are bounded from its report count, and the
    statement is close to the truth (the bound costs a few devices, not a share).
    False-failure probability ≤ β = 1e-7."""
    reports, honest = _random_window(33_000, 1.0, seed=3)
    sizes, fewest = _cut(reports, honest)
    stated = histogram_release("h", PARAMS, sum(sizes), batch_sizes=sizes)
    assert 0.8 * fewest <= stated.n_honest <= fewest


@pytest.mark.slow  # PLD accounting: seconds, left to the full check
@pytest.mark.parametrize("honest_fraction", [0.5, 0.9])
def test_a_window_released_whole_counts_its_honest_devices_from_the_share(
    honest_fraction: float,
) -> None:
    """One batch per window: at most a share 1 − h of its devices is dishonest, so the
    dishonest are at most (1 − h)/h of the honest; the statement's count stays below the
    honest devices there are, less the target, and not far below.
    False-failure probability ≤ β = 1e-7."""
    reports, honest = _random_window(5_000, honest_fraction, seed=11)
    truth = int(honest.sum()) - 1
    stated = histogram_release("h", PARAMS, int(reports.sum()), honest_fraction=honest_fraction)
    assert 0.9 * truth <= stated.n_honest <= truth, (stated.n_honest, truth)
    assert stated.crowd.batches == 1 and stated.crowd.dishonest is None
