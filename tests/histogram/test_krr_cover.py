"""The k-RR blanket bound of a shuffled histogram (other devices' k-RR noise counted as
cover): exact against enumeration of the real shuffled mechanism at tiny n, never below a
lower bound at larger n, monotone in the crowd, and never above the older figure."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import numpy as np
import pytest
from scipy import signal, stats

from crowdmix.aggregator.accounting.histogram import central_epsilon, fake_delta, histogram_delta
from crowdmix.aggregator.accounting.histogram_blanket import blanket_delta, uniform_cover_delta
from crowdmix.client.histogram import HistogramParams

Vec = tuple[int, ...]


# --- the real mechanism, enumerated -------------------------------------------------


class _Histograms:
    """Every histogram of d buckets holding at most ``total`` reports, one index each (a
    dense array with one axis per bucket would be mostly cells no view reaches), and
    for each bucket where one more report in it moves each histogram."""

    def __init__(self, d: int, total: int) -> None:
        vecs = np.zeros((1, 0), dtype=np.int64)
        for _ in range(d):  # one more bucket: every count that keeps the sum ≤ total
            room = total - vecs.sum(axis=1)
            rows = np.repeat(np.arange(len(vecs)), room + 1)
            first = np.repeat(np.cumsum(room + 1) - (room + 1), room + 1)
            vecs = np.column_stack([vecs[rows], np.arange(len(rows)) - first])
        self.vecs = vecs
        radix = (total + 1) ** np.arange(d, dtype=np.int64)
        codes = vecs @ radix
        order = np.argsort(codes)
        self._full = vecs.sum(axis=1) == total
        src = np.flatnonzero(~self._full)
        self._moves = [
            (src, order[np.searchsorted(codes, codes[src] + radix[j], sorter=order)])
            for j in range(d)
        ]

    def empty(self) -> np.ndarray:
        """The law of the histogram holding no report."""
        law = np.zeros(len(self.vecs))
        law[0] = 1.0  # vecs[0] is all zeros
        return law

    def add(self, law: np.ndarray, stay: float, bucket: list[float]) -> np.ndarray:
        """law ⊛ (no report w.p. ``stay``, one report in bucket j w.p. bucket[j])."""
        assert not law[self._full].any()  # no mass leaves the enumerated histograms
        out = stay * law
        for w, (src, dst) in zip(bucket, self._moves, strict=True):
            out[dst] += w * law[src]
        return out


def _fakes(params: HistogramParams, grid: _Histograms, n: int) -> np.ndarray:
    """The law of n devices' fake reports: n·m slots, each filled w.p. q with a uniform
    value (client.HistogramEncoder), whatever the devices hold."""
    law, q = grid.empty(), params.fake_probability
    for _ in range(n * params.fake_slots):
        law = grid.add(law, 1.0 - q, [q / params.domain_size] * params.domain_size)
    return law


def _views(
    params: HistogramParams, grid: _Histograms, fakes: np.ndarray, others: tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """The law of the whole histogram of every device's reports, the target holding 0
    (P) or 1 (Q): ``fakes`` (every device's fakes, the target's too) convolved with
    each device's k-RR'd real report."""
    d, p, r = params.domain_size, params.keep_probability, params.other_probability
    law = fakes
    for value in others:
        law = grid.add(law, 0.0, [p if y == value else r for y in range(d)])
    return (
        grid.add(law, 0.0, [p if y == 0 else r for y in range(d)]),
        grid.add(law, 0.0, [p if y == 1 else r for y in range(d)]),
    )


def _datasets(d: int, others: int) -> Iterator[tuple[int, ...]]:
    """The other devices' values up to symmetry: value counts (c0 ≥ c1 for the target's
    pair 0/1, both directions being checked) and the other buckets' counts sorted."""
    for c0 in range(others + 1):
        for c1 in range(min(c0, others - c0) + 1):
            rest = others - c0 - c1
            for parts in itertools.combinations_with_replacement(range(rest + 1), d - 2):
                if sum(parts) == rest and list(parts) == sorted(parts, reverse=True):
                    values = [0] * c0 + [1] * c1
                    for k, c in enumerate(parts):
                        values += [2 + k] * c
                    yield tuple(values)


def _hockey(p: np.ndarray, q: np.ndarray, eps: float) -> float:
    return float(np.maximum(p - math.exp(eps) * q, 0.0).sum())


def _exact(
    params: HistogramParams, n: int, epsilons: list[float], delta: float
) -> tuple[list[float], float]:
    """The exact δ(ε) at ``epsilons`` and the exact ε at ``delta``: the worst over the
    other devices' datasets and both directions of D_{e^ε}(P ‖ Q)."""
    cap = params.local_epsilon if params.local_epsilon is not None else 60.0
    worst, eps_worst = [0.0] * len(epsilons), 0.0
    grid = _Histograms(params.domain_size, n * params.max_messages)
    fakes = _fakes(params, grid, n)
    for others in _datasets(params.domain_size, n - 1):
        p, q = _views(params, grid, fakes, others)

        def dlt(eps: float, p: np.ndarray = p, q: np.ndarray = q) -> float:
            return max(_hockey(p, q, eps), _hockey(q, p, eps))

        for i, eps in enumerate(epsilons):
            worst[i] = max(worst[i], dlt(eps))
        if dlt(eps_worst) > delta:  # this dataset needs more: bisect above the worst so far
            lo, hi = eps_worst, cap
            while hi - lo > 1e-9:
                mid = 0.5 * (lo + hi)
                lo, hi = (lo, mid) if dlt(mid) <= delta else (mid, hi)
            eps_worst = hi
    return worst, eps_worst


EPSILONS = [0.0, 0.05, 0.15, 0.3, 0.5, 0.8, 1.2, 1.8, 2.5]
DELTA = 0.01

_CONFIGS = [(1, 0.5, 1.0), (2, 0.3, 2.5), (1, 1.0, 0.5), (3, 0.8, 4.0)]  # (m, q, ε_L)
_GRID = [(d, n, m, q, eps_l) for d in (3, 4, 5) for n in range(3, 8) for m, q, eps_l in _CONFIGS]


def _cells(c: tuple[int, int, int, float, float]) -> int:
    return int((c[1] * (1 + c[2]) + 1) ** c[0])  # the dense histogram's size


# (d, n, m, q, ε_L), every d = 3–5 and n = 3–7; the larger histograms in the slow run only
CELLS = [c for c in _GRID if _cells(c) <= 100_000]
SLOW_CELLS = [c for c in _GRID if _cells(c) > 100_000]


def _check_cell(d: int, n: int, m: int, q: float, eps_l: float) -> None:
    params = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q, local_epsilon=eps_l)
    exact, exact_eps = _exact(params, n, EPSILONS, DELTA)
    for eps, truth in zip(EPSILONS, exact, strict=True):
        ours = histogram_delta(eps, params, n_honest=n - 1)
        assert truth <= ours + 1e-12, (eps, truth, ours)
        # and the bound is not vacuous: within a factor 3 of the truth where it matters
        if truth > 1e-3:
            assert ours <= 3.0 * truth, (eps, truth, ours)
    # the figure: never below the exact ε at δ (the best lower bound there is)
    assert central_epsilon(params, DELTA, n_honest=n - 1) >= exact_eps


@pytest.mark.parametrize(("d", "n", "m", "q", "eps_l"), CELLS)
def test_no_cell_where_the_bound_is_below_the_enumerated_mechanism(
    d: int, n: int, m: int, q: float, eps_l: float
) -> None:
    """Exhaustive: every dataset of the other devices (up to symmetry), the target's own
    fakes and every device's k-RR included, both directions, nine ε."""
    _check_cell(d, n, m, q, eps_l)


@pytest.mark.slow
@pytest.mark.parametrize(("d", "n", "m", "q", "eps_l"), SLOW_CELLS)
def test_no_cell_where_the_bound_is_below_the_enumerated_mechanism_larger(
    d: int, n: int, m: int, q: float, eps_l: float
) -> None:
    _check_cell(d, n, m, q, eps_l)


@pytest.mark.parametrize(
    ("d", "n", "m", "q", "eps_l"),
    [(d, n, m, q, eps_l) for d, n in ((3, 3), (3, 4), (4, 3)) for m, q, eps_l in _CONFIGS],
)
def test_the_enumeration_is_the_per_device_convolution(
    d: int, n: int, m: int, q: float, eps_l: float
) -> None:
    """_views (every fake slot at once, then the k-RR reports, on reachable histograms
    only) is the law of each device's own report set convolved device by device
    (test_statement_soundness's brute force of the real mechanism), for every dataset
    the check enumerates."""
    from tests.histogram.test_statement_soundness import _mechanism

    params = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q, local_epsilon=eps_l)
    grid = _Histograms(d, n * params.max_messages)
    fakes = _fakes(params, grid, n)
    reached = {tuple(int(c) for c in vec): i for i, vec in enumerate(grid.vecs)}
    for others in _datasets(d, n - 1):
        for ours, target in zip(_views(params, grid, fakes, others), (0, 1), strict=True):
            brute = _mechanism(params, (target, *others))
            assert brute.keys() <= reached.keys()  # no histogram the grid leaves out
            dense = np.zeros(len(grid.vecs))
            dense[[reached[h] for h in brute]] = list(brute.values())
            np.testing.assert_allclose(ours, dense, rtol=1e-12, atol=1e-17)


# --- the per-f figure against brute force --------------------------------------------


def _brute_uniform_cover(eps: float, f: int, d: int, eps_l: float) -> float:
    """D_{e^ε} of (H_x, H_x') for the target's k-RR report among f i.i.d. uniform items,
    summed cell by cell over the trinomial."""
    e = math.exp(eps_l)
    r = 1.0 / (e + d - 1)
    p = e * r
    t = np.zeros((f + 2, f + 2))
    for i in range(f + 1):
        for j in range(f + 1 - i):
            if d > 2:
                t[i, j] = stats.multinomial.pmf([i, j, f - i - j], f, [1 / d, 1 / d, 1 - 2 / d])
            elif i + j == f:
                t[i, j] = stats.binom.pmf(i, f, 0.5)
    big_p = np.zeros((f + 3, f + 3))
    big_q = np.zeros((f + 3, f + 3))
    for arr, a, b in ((big_p, p, r), (big_q, r, p)):
        arr[1:, :-1] += a * t
        arr[:-1, 1:] += b * t
        arr[:-1, :-1] += (d - 2) * r * t
    return _hockey(big_p, big_q, eps)


@pytest.mark.parametrize(
    ("f", "d", "eps_l"), [(0, 3, 1.0), (7, 3, 1.0), (12, 2, 2.0), (20, 4, 3.0), (30, 10, 1.5)]
)
@pytest.mark.parametrize("eps", [0.0, 0.2, 0.5, 1.0])
def test_uniform_cover_figure_is_the_brute_force_sum(
    f: int, d: int, eps_l: float, eps: float
) -> None:
    brute = _brute_uniform_cover(eps, f, d, eps_l) if eps < eps_l else 0.0
    ours = uniform_cover_delta(eps, f, domain_size=d, local_epsilon=eps_l)
    assert brute - 1e-15 <= ours <= brute * (1 + 1e-6) + 1e-14


# --- larger n: a lower bound, the older figure, monotonicity --------------------------


def _trinomial(trials: int, s: float) -> np.ndarray:
    """Law of (C_x, C_x') for ``trials`` items each in x and in x' w.p. s."""
    i = np.arange(trials + 1)
    out = np.zeros((trials + 1, trials + 1))
    for a in range(trials + 1):
        out[a, : trials - a + 1] = stats.binom.pmf(a, trials, s) * stats.binom.pmf(
            i[: trials - a + 1], trials - a, s / (1 - s)
        )
    return out


def projection_lower_bound(params: HistogramParams, n_honest: int, eps: float) -> float:
    """δ(ε) of (H_x, H_x') — a post-processing of the analyst's view, so a lower bound on
    its δ — when the target and n_honest others all follow the protocol (every device's
    fakes counted, the target's too) and the others hold a third value."""
    d, q = params.domain_size, params.fake_probability
    p, r = params.keep_probability, params.other_probability
    cover = signal.convolve(
        _trinomial((n_honest + 1) * params.fake_slots, q / d), _trinomial(n_honest, r)
    )
    cover = np.maximum(cover, 0.0)
    big_p = np.zeros((cover.shape[0] + 1, cover.shape[1] + 1))
    big_q = np.zeros_like(big_p)
    for arr, a, b in ((big_p, p, r), (big_q, r, p)):
        arr[1:, :-1] += a * cover
        arr[:-1, 1:] += b * cover
        arr[:-1, :-1] += (d - 2) * r * cover
    return _hockey(big_p, big_q, eps)


@pytest.mark.parametrize(
    ("d", "n_honest", "m", "q", "eps_l"), [(10, 150, 1, 0.5, 2.0), (20, 120, 2, 0.3, 3.0)]
)
def test_figure_is_above_a_lower_bound_and_close_to_it(
    d: int, n_honest: int, m: int, q: float, eps_l: float
) -> None:
    params = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q, local_epsilon=eps_l)
    delta = 1e-6
    stated = central_epsilon(params, delta, n_honest=n_honest)
    low = projection_lower_bound(params, n_honest, stated)
    assert low <= delta  # at the stated ε the lower bound meets δ too: never undercut
    # tight: 5 % below the stated ε the lower bound already exceeds δ
    assert projection_lower_bound(params, n_honest, 0.95 * stated) > delta


@pytest.mark.parametrize(
    ("d", "m", "q", "eps_l"), [(10, 1, 0.5, 2.0), (120, 1, 0.26, 6.7), (1000, 1, 0.04, 9.0)]
)
def test_blanket_figure_is_never_above_the_older_one(
    d: int, m: int, q: float, eps_l: float
) -> None:
    gamma = d / (math.exp(eps_l) + d - 1)
    for n_honest in (0, 5, 300, 20_000):
        for eps in (0.05, 0.3, 1.0):
            older = (1 - gamma) * fake_delta(
                eps, n_honest=n_honest, fake_slots=m, bucket_probability=q / d
            )
            blanket = blanket_delta(
                eps,
                n_honest=n_honest,
                domain_size=d,
                fake_slots=m,
                fake_probability=q,
                local_epsilon=eps_l,
            )
            assert blanket <= older * (1 + 1e-6) + 1e-15, (n_honest, eps, blanket, older)


@pytest.mark.slow  # PLD accounting: seconds, left to the full check
def test_figure_is_monotone_in_the_crowd() -> None:
    """The fixed cover grid keeps the computed figure non-increasing as honest devices
    are added (what the planner and the plan's quantile argument rely on)."""
    params = HistogramParams(domain_size=40, fake_slots=1, fake_probability=0.3, local_epsilon=4.0)
    values = [
        blanket_delta(
            0.4, n_honest=n, domain_size=40, fake_slots=1, fake_probability=0.3, local_epsilon=4.0
        )
        for n in range(2000, 2040)
    ]
    assert all(b <= a * (1 + 1e-12) for a, b in itertools.pairwise(values))
    figures = [central_epsilon(params, 1e-6, n_honest=n) for n in (2000, 2001, 2002, 2010, 2100)]
    assert figures == sorted(figures, reverse=True)
