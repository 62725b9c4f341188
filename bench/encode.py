"""Client encoding throughput: per-report encoder and batch encoder.

    .venv/bin/python bench/encode.py [--reports N] [--repeats R]

k=128, h=2, f=0.5, one thread, default CSPRNG (SecureBits = buffered
os.urandom for the per-report encoder; AES-256-CTR keyed from os.urandom for
the batch encoder). Each figure is the best of R runs, as reports per second
of CPU time of this one-threaded process (what the targets are checked
against) and, in brackets, per wall-clock second; the load average is printed
because other work on the box slows the wall-clock figures (and, through
shared caches, a little the CPU-time ones).
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable

import numpy as np

from crowdmix import client
from crowdmix.client.batch import BatchEncoder


def _best_rate(run: Callable[[], object], n: int, repeats: int) -> tuple[float, float]:
    """(reports per CPU-second, reports per wall-second), best of ``repeats`` runs.

    CPU time (time.process_time) is what one core spends; with other work on
    the box the wall-clock figure also counts time the process waited.
    """
    best_cpu = best_wall = float("inf")
    for _ in range(repeats):
        c0, w0 = time.process_time(), time.perf_counter()
        run()
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return n / best_cpu, n / best_wall


def _line(label: str, rates: tuple[float, float], target: float | None) -> None:
    cpu, wall = rates
    verdict = ""
    if target is not None:
        verdict = f"  target >= {target / 1e3:,.0f} k/s: {'MET' if cpu >= target else 'NOT MET'}"
    print(
        f"{label:<54} {1e6 / cpu:7.3f} µs/report {cpu / 1e3:9,.0f} k reports/s "
        f"(wall {wall / 1e3:,.0f} k/s){verdict}"
    )


def per_report(p: float, q: float, n: int, repeats: int) -> tuple[float, float]:
    params = client.RapporParams(k=128, h=2, m=64, f=0.5, p=p, q=q)
    enc = client.RapporEncoder(params, secret=client.new_secret(), metric="bench")
    values = [f"value-{i}" for i in range(1000)]
    encode = enc.encode

    def run() -> None:
        for i in range(n):
            encode(values[i % 1000])

    return _best_rate(run, n, repeats)


def batch_fresh(p: float, q: float, n: int, repeats: int) -> tuple[float, float]:
    params = client.RapporParams(k=128, h=2, m=64, f=0.5, p=p, q=q)
    enc = BatchEncoder(params, metric="bench")
    table = enc.bloom_table([f"value-{i}" for i in range(1000)])
    # Which value/cohort each simulated client has: setup, not part of encoding.
    rng = np.random.default_rng(0)
    idx = rng.integers(0, 1000, n)
    coh = rng.integers(0, params.m, n)
    return _best_rate(lambda: enc.encode_indices(table, idx, coh), n, repeats)


def batch_memoised(n: int, repeats: int) -> tuple[float, float]:
    params = client.RapporParams(k=128, h=2, m=64, f=0.5, p=0.25, q=0.75)
    enc = BatchEncoder(params, metric="bench")
    secrets = [os.urandom(32) for _ in range(n)]
    values = [f"value-{i % 1000}" for i in range(n)]
    return _best_rate(lambda: enc.encode_clients(secrets, values), n, repeats)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reports", type=int, default=200_000, help="per-report encodes per run")
    ap.add_argument("--batch", type=int, default=2_000_000, help="batch reports per run")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
    print("k=128 h=2 f=0.5, one thread, default CSPRNG; targets checked on CPU-time rates")
    n, r = args.reports, args.repeats
    _line("per-report encode, p=0.25 q=0.75", per_report(0.25, 0.75, n, r), 150e3)
    _line("per-report encode, p=0.5 q=0.75", per_report(0.5, 0.75, n, r), 300e3)
    _line("batch encode (fresh PRR), p=0.25 q=0.75", batch_fresh(0.25, 0.75, args.batch, r), 1e6)
    _line("batch encode (fresh PRR), p=0.5 q=0.75", batch_fresh(0.5, 0.75, args.batch, r), None)
    _line(
        "batch encode (memoised PRR per client), p=0.25 q=0.75",
        batch_memoised(min(args.batch, 100_000), max(1, r // 2)),
        None,
    )


if __name__ == "__main__":
    main()
