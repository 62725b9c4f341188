"""Central ε of a shuffled histogram with local k-RR: the k-RR blanket bound against the
older figure and against lower bounds.

Old: (1 − γ)·fake_delta, which reveals whether the target's report is its value and counts
only the honest fakes. New: ``histogram_delta`` (the k-RR blanket of the other devices and
the target's own report, ``histogram_blanket``). Lower bounds: at tiny n the exact ε of the
enumerated mechanism (worst dataset, tests/histogram/test_krr_cover.py); at larger n the
exact ε of (H_x, H_x'), a post-processing of the view, for a dataset whose other devices
hold a third value. Every figure is for n_h honest devices besides the target.

    nice .venv/bin/python bench/histogram_bounds.py [--quick]

Each row's CPU time is printed as a comment (shared box: run it niced).
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import numpy as np
from scipy import signal, stats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.histogram (tiny rows)

from crowdmix.aggregator.accounting.histogram import (
    _smallest_root,
    central_epsilon,
    fake_delta,
)
from crowdmix.client.histogram import HistogramParams


def old_delta(eps: float, p: HistogramParams, n_honest: int) -> float:
    """The figure before the blanket bound: (1 − γ)·fake_delta, 0 from ε_L on."""
    assert p.local_epsilon is not None
    if eps >= p.local_epsilon:
        return 0.0
    d = p.domain_size
    em1 = math.expm1(p.local_epsilon)
    fakes = fake_delta(
        eps, n_honest=n_honest, fake_slots=p.fake_slots, bucket_probability=p.fake_probability / d
    )
    return min(1.0, fakes * em1 / (em1 + d) * (1 + 1e-9))


def smallest_epsilon(delta_fn: object, delta: float, cap: float) -> float:
    """The smallest ε (safe side) with delta_fn(ε) ≤ delta, ``cap`` if none below it."""

    def excess(eps: float) -> float:
        got = delta_fn(eps)  # type: ignore[operator]
        return -math.inf if got <= 0.0 else math.log(got) - math.log(delta)

    f_hi = excess(cap)
    if f_hi > 0.0:
        return cap
    if excess(0.0) <= 0.0:
        return 0.0
    return float(_smallest_root(excess, 0.0, cap, f_hi))


def _window(trials: int, s: float) -> tuple[int, int]:
    mu, sd = trials * s, math.sqrt(trials * s * (1 - s))
    return max(0, math.floor(mu - 10 * sd - 30)), min(trials, math.ceil(mu + 10 * sd + 30))


def cover_cells(p: HistogramParams, n_honest: int) -> int:
    """Cells of the (H_x, H_x') array ``projection_cover`` would build."""
    a = _window((n_honest + 1) * p.fake_slots, p.fake_probability / p.domain_size)
    b = _window(n_honest, p.other_probability)
    return (a[1] - a[0] + b[1] - b[0] + 2) ** 2


def _trinomial(trials: int, s: float) -> tuple[np.ndarray, int]:
    """Law of (C_x, C_x') for ``trials`` items each in x and in x' w.p. s, on a window
    (±10 sd: mass left out ~1e-23, far below every δ here), and the window's start."""
    lo, hi = _window(trials, s)
    i = np.arange(lo, hi + 1)
    out = stats.binom.pmf(i[:, None], trials, s) * stats.binom.pmf(
        i[None, :], np.maximum(trials - i[:, None], 0), s / (1 - s)
    )
    return out, lo


def projection_lower_delta(eps: float, p: HistogramParams, n_honest: int, cover: object) -> float:
    """δ(ε) of (H_x, H_x'): every device's fakes (the target's too) and the others' k-RR
    reports landing in x or x', the others holding a third value."""
    c = cover  # precomputed by ``projection_cover``
    assert isinstance(c, np.ndarray)
    d = p.domain_size
    keep, other = p.keep_probability, p.other_probability
    big_p = np.zeros((c.shape[0] + 1, c.shape[1] + 1))
    big_q = np.zeros_like(big_p)
    for arr, a, b in ((big_p, keep, other), (big_q, other, keep)):
        arr[1:, :-1] += a * c
        arr[:-1, 1:] += b * c
        arr[:-1, :-1] += (d - 2) * other * c
    return float(np.maximum(big_p - math.exp(eps) * big_q, 0.0).sum())


def projection_cover(p: HistogramParams, n_honest: int) -> np.ndarray:
    fakes, _ = _trinomial((n_honest + 1) * p.fake_slots, p.fake_probability / p.domain_size)
    reals, _ = _trinomial(n_honest, p.other_probability)
    # both windows start at their own offsets: (H_x, H_x') is only shifted, which changes
    # no likelihood ratio (the target's report is placed relative to the same cell)
    out: np.ndarray = np.maximum(signal.fftconvolve(fakes, reals), 0.0)
    return out


CONFIGS = [  # label, d, m, q, ε_L
    ("d=10, m=1, q=0.5, ε_L=2", 10, 1, 0.5, 2.0),
    ("d=120, m=1, q=0.258, ε_L=6.68 (demo plan)", 120, 1, 0.25848388671875, 6.68),
    ("d=1000, m=1, q=0.0431, ε_L=10.18 (README plan)", 1000, 1, 0.043089866638183594, 10.18),
    ("d=4, m=4, q=0.5, ε_L=1", 4, 4, 0.5, 1.0),
]


def large_rows(quick: bool) -> None:
    crowds = [1_000, 10_000, 100_000] if quick else [1_000, 10_000, 100_000, 1_000_000]
    deltas = [1e-6] if quick else [1e-6, 1e-9]
    print("| config | n_h | δ | before | after | before ÷ after | lower bound | after ÷ lower |")
    print("|---|---|---|---|---|---|---|---|")
    for label, d, m, q, eps_l in CONFIGS:
        p = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q, local_epsilon=eps_l)
        for n_h in crowds:
            # the lower bound's array is kept under ~5M cells (memory on a shared box)
            cover = projection_cover(p, n_h) if cover_cells(p, n_h) <= 5_000_000 else None
            for delta in deltas:
                t0 = time.process_time()
                new = central_epsilon(p, delta, n_honest=n_h)
                old = smallest_epsilon(lambda e, p=p, n_h=n_h: old_delta(e, p, n_h), delta, eps_l)
                low_text, ratio_text = "—", "—"
                if cover is not None:
                    low = smallest_epsilon(
                        lambda e, p=p, n_h=n_h, c=cover: projection_lower_delta(e, p, n_h, c),
                        delta,
                        eps_l,
                    )
                    low_text, ratio_text = f"{low:.4g}", f"{new / low:.4f}"
                took = time.process_time() - t0
                print(
                    f"| {label} | {n_h:,} | {delta:g} | {old:.4g} | {new:.4g} | "
                    f"{old / new:.3f} | {low_text} | {ratio_text} |  <!-- {took:.0f} s CPU -->",
                    flush=True,
                )


TINY = [  # d, n, m, q, ε_L
    (3, 5, 1, 0.5, 1.0),
    (3, 7, 2, 0.3, 2.5),
    (4, 6, 1, 1.0, 0.5),
    (4, 7, 2, 0.3, 2.5),
    (5, 5, 1, 0.5, 1.0),
    (5, 6, 1, 0.3, 2.0),
]


def tiny_rows() -> None:
    from tests.histogram.test_krr_cover import _exact

    delta = 0.01
    print("| d, n, m, q, ε_L | δ | before | after | exact | before ÷ after | after ÷ exact |")
    print("|---|---|---|---|---|---|---|")
    for d, n, m, q, eps_l in TINY:
        p = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q, local_epsilon=eps_l)
        _, exact = _exact(p, n, [], delta)
        new = central_epsilon(p, delta, n_honest=n - 1)
        old = smallest_epsilon(lambda e, p=p, n=n: old_delta(e, p, n - 1), delta, eps_l)
        print(
            f"| {d}, {n}, {m}, {q}, {eps_l} | {delta:g} | {old:.4g} | {new:.4g} | "
            f"{exact:.4g} | {old / new:.3f} | {new / exact:.4f} |",
            flush=True,
        )


def _load() -> str:
    with open("/proc/loadavg") as f:
        return f.read()[:14]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="n_h up to 1e5 and δ = 1e-6 only")
    args = ap.parse_args()
    started = time.time()
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S')}, load {_load()}")
    tiny_rows()
    print()
    large_rows(args.quick)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"# took {time.time() - started:.0f}s, max RSS {rss:.2f} GiB, load {_load()}")


if __name__ == "__main__":
    main()
