"""Counting throughput: reports/s added to a CohortCounts accumulator on one core.

    .venv/bin/python bench/counts.py                 # k=128, m=128
    .venv/bin/python bench/counts.py --k 32 --m 64

Shapes measured (target: >= 20 M reports/s at k=128, m=128):
- one big batch of 4 M reports, cohorts random (unsorted);
- the same batch grouped by cohort (as a shuffler never sends, but a merge might);
- 1000-report batches arriving one by one (the realistic ingest shape);
- 100-report batches (a worst case: per-call overhead dominates).
Each figure includes extracting ``ones``/``totals`` at the end (the lazy fold).
Also: the previous implementation (one bincount histogram per add) for reference,
and accumulator_for() on basic-mechanism payloads (krr, oue, olh).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core, as the target says

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crowdmix.aggregator.counting import accumulator_for
from crowdmix.aggregator.counting.counts import CohortCounts
from crowdmix.core.basic import OLH_PRIME, BasicParams
from crowdmix.core.registry import MetricConfig

_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1, bitorder="little")


def old_add(totals: np.ndarray, ones: np.ndarray, cohorts: np.ndarray, bits: np.ndarray) -> None:
    """The first version (commit 520743d): a full (m, nb, 256) histogram per add."""
    m, k = ones.shape
    n, nb = bits.shape
    totals += np.bincount(cohorts, minlength=m)
    stride = nb * 256
    col = (np.arange(nb, dtype=np.int64) * 256)[None, :]
    hist = np.zeros(m * stride, dtype=np.int64)
    for s in range(0, n, 1 << 16):
        idx = (cohorts[s : s + (1 << 16)] * stride)[:, None] + col + bits[s : s + (1 << 16)]
        hist += np.bincount(idx.ravel(), minlength=hist.size)
    ones += (hist.reshape(m, nb, 256) @ _BYTE_BITS.astype(np.int64)).reshape(m, nb * 8)[:, :k]


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds / 1e6:7.2f} M reports/s"


def bench_batches(cohorts: np.ndarray, bits: np.ndarray, m: int, k: int, batch: int) -> float:
    counts = CohortCounts.create(m, k)
    n = cohorts.size
    t0 = time.perf_counter()
    for s in range(0, n, batch):
        counts.add(cohorts[s : s + batch], bits[s : s + batch])
    _ = counts.ones, counts.totals
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--k", type=int, default=128)
    ap.add_argument("--m", type=int, default=128)
    ap.add_argument("--n", type=int, default=1 << 22, help="reports (default 4 M)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs")
    args = ap.parse_args()
    k, m, n = args.k, args.m, args.n
    rng = np.random.default_rng(1)
    nb = (k + 7) // 8
    cohorts = rng.integers(0, m, n)
    bits = rng.integers(0, 256, (n, nb), dtype=np.uint8)
    if k % 8:
        bits[:, -1] &= (1 << (k % 8)) - 1
    order = np.argsort(cohorts, kind="stable")
    grouped_c, grouped_b = cohorts[order], bits[order]
    print(f"k={k}, m={m}, {n:,} reports, best of {args.repeat}; target >= 20 M reports/s")

    def best(fn: object) -> float:
        return min(fn() for _ in range(args.repeat))  # type: ignore[operator]

    t = best(lambda: bench_batches(cohorts, bits, m, k, n))
    print(f"  one batch, unsorted         {rate(n, t)}")
    t = best(lambda: bench_batches(grouped_c, grouped_b, m, k, n))
    print(f"  one batch, grouped          {rate(n, t)}")
    small = min(n, 1 << 20)
    t = best(lambda: bench_batches(cohorts[:small], bits[:small], m, k, 1000))
    print(f"  1000-report batches         {rate(small, t)}")
    tiny = min(n, 1 << 17)
    t = best(lambda: bench_batches(cohorts[:tiny], bits[:tiny], m, k, 100))
    print(f"  100-report batches          {rate(tiny, t)}")

    def old(batch: int, count: int) -> float:
        totals = np.zeros(m, np.int64)
        ones = np.zeros((m, k), np.int64)
        t0 = time.perf_counter()
        for s in range(0, count, batch):
            old_add(totals, ones, cohorts[s : s + batch], bits[s : s + batch])
        return time.perf_counter() - t0

    print(f"  previous code, one batch    {rate(1 << 20, best(lambda: old(1 << 20, 1 << 20)))}")
    print(f"  previous code, 1000-batches {rate(20_000, best(lambda: old(1000, 20_000)))}")

    print("basic mechanisms via accumulator_for (1000-report batches):")
    for mech, d in (("krr", 64), ("oue", 64), ("olh", 64)):
        params = BasicParams(mechanism=mech, epsilon=2.0, domain_size=d)  # type: ignore[arg-type]
        metric = MetricConfig(name="b", basic=params)
        count = 200_000 if mech != "olh" else 50_000
        if mech == "krr":
            payload = rng.integers(0, d, (count, 1), dtype=np.uint8)
        elif mech == "oue":
            payload = rng.integers(0, 256, (count, d // 8), dtype=np.uint8)
        else:
            payload = np.zeros((count, params.report_bytes), dtype=np.uint8)
            payload[:, :4] = (
                rng.integers(1, OLH_PRIME, count).astype("<u4").view(np.uint8).reshape(count, 4)
            )
            payload[:, 4:8] = (
                rng.integers(0, OLH_PRIME, count).astype("<u4").view(np.uint8).reshape(count, 4)
            )
            payload[:, 8] = rng.integers(0, params.olh_buckets, count)
        zeros = np.zeros(count, dtype=np.int64)

        def run(payload: np.ndarray = payload, zeros: np.ndarray = zeros) -> float:
            acc = accumulator_for(metric)  # noqa: B023
            t0 = time.perf_counter()
            for s in range(0, count, 1000):  # noqa: B023
                acc.add(zeros[s : s + 1000], payload[s : s + 1000])
            _ = acc.ones
            return time.perf_counter() - t0

        print(f"  {mech:4} d={d:<4}                {rate(count, best(run))}")


if __name__ == "__main__":
    main()
