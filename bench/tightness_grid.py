"""Tightness of the shuffle bounds over a grid: ours ÷ the best lower bound, and before ÷ after.

"ours" is what every statement now prints (``amplification.best_amplification``:
the generic stronger clone or the mechanism's blanket bound, the smaller);
"before" is the generic bound alone (what statements printed before the blanket
bounds); "lower" the largest of ``lower_bounds`` for the mechanism (the exact
privacy of the real shuffled mechanism on a concrete data set, rounded down).
Every row asserts lower ≤ ours ≤ before.

    .venv/bin/python bench/tightness_grid.py [--quick] [--family krr|oue|olh|rappor] [--rows]

--quick: n ∈ {1e4, 1e6}, δ ∈ {1e-6, 1e-10}. Prints one line per cell with --rows and
a summary per family (min–max of each ratio).
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections import defaultdict

from crowdmix.aggregator.accounting.amplification import amplify, best_amplification
from crowdmix.aggregator.accounting.lower_bounds import bit_vector_lower, krr_lower
from crowdmix.aggregator.accounting.randomizers import BitVector, KaryRR, LocalHashing

EPS0 = (0.25, 0.5, 1.0, 2.0, 4.0)
DOMAINS = (2, 3, 5, 32, 1024)


def cell(randomizer, n: int, delta: float) -> tuple[float, float, float | None]:  # type: ignore[no-untyped-def]
    eps0 = randomizer.epsilon0
    ours = best_amplification(eps0, n, delta, randomizer).result.epsilon
    before = amplify(eps0, n, delta).epsilon
    lower: float | None = None
    if isinstance(randomizer, KaryRR):
        lower = krr_lower(eps0, randomizer.domain, n, delta)
    elif isinstance(randomizer, BitVector):
        lower = max(
            bit_vector_lower(randomizer.p, randomizer.q, randomizer.bits, n, delta).values()
        )
    assert ours <= before * (1 + 1e-12), (randomizer, n, delta, ours, before)
    assert lower is None or lower <= ours, (randomizer, n, delta, ours, lower)
    return ours, before, lower


def grid(family: str, quick: bool) -> list[tuple[str, object, int, float]]:
    ns = (10**4, 10**6) if quick else (10**4, 10**5, 10**6, 10**7)
    deltas = (1e-6, 1e-10) if quick else (1e-6, 1e-8, 1e-10)
    out: list[tuple[str, object, int, float]] = []
    for eps0 in EPS0:
        if family == "krr":
            for d in DOMAINS:
                rand: object = KaryRR(epsilon0=eps0, domain=d)
                out += [(f"{d}-RR ε0={eps0:g}", rand, n, dl) for n in ns for dl in deltas]
        elif family == "oue":
            rand = BitVector(p=1 / (math.exp(eps0) + 1), q=0.5, bits=1, label="OUE")
            out += [(f"OUE ε0={eps0:g}", rand, n, dl) for n in ns for dl in deltas]
        elif family == "olh":
            g = max(2, round(math.exp(eps0)) + 1)
            rand = LocalHashing(epsilon0=eps0, buckets=g)
            out += [(f"OLH ε0={eps0:g}", rand, n, dl) for n in ns for dl in deltas]
    if family == "rappor":
        # the demo's params (k=64 h=2 f=0.25 p=0.25 q=0.75), ε_1 = 3.154, at its crowds
        rand = BitVector(p=0.3125, q=0.6875, bits=2, label="RAPPOR report")
        out = [(f"RAPPOR demo, crowd {n}", rand, n, 1e-6) for n in (105, 140, 464)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--family", choices=("krr", "oue", "olh", "rappor"), action="append")
    parser.add_argument("--rows", action="store_true", help="print every cell")
    args = parser.parse_args()
    families = args.family or ["krr", "oue", "olh", "rappor"]
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min); machine: 2 cores")
    for family in families:
        started = time.perf_counter()
        summary: dict[str, list[tuple[float, float | None]]] = defaultdict(list)
        if args.rows:
            print(f"\n{'cell':<28} {'n':>9} {'δ':>7} {'ours':>11} {'before':>11} "
                  f"{'lower':>11} {'ours/lower':>10} {'before/ours':>11}")  # fmt: skip
        for name, rand, n, delta in grid(family, args.quick):
            ours, before, lower = cell(rand, n, delta)
            ratio = None if lower is None or lower <= 0 else ours / lower
            summary[name].append((before / ours, ratio))
            if args.rows:
                low = "—" if lower is None else f"{lower:.5g}"
                rat = "—" if ratio is None else f"{ratio:.4f}"
                print(f"{name:<28} {n:>9.0e} {delta:>7.0e} {ours:>11.5g} {before:>11.5g} "
                      f"{low:>11} {rat:>10} {before / ours:>11.3f}", flush=True)  # fmt: skip
        print(f"\n{family}: {time.perf_counter() - started:.0f} s")
        print(f"{'cells':<28} {'ours ÷ lower':>16} {'before ÷ ours':>16}")
        for name, rows in summary.items():
            gains = [g for g, _ in rows]
            ratios = [r for _, r in rows if r is not None]
            rr = f"{min(ratios):.3f}–{max(ratios):.3f}" if ratios else "—"
            print(f"{name:<28} {rr:>16} {min(gains):.2f}–{max(gains):.2f}".rstrip(), flush=True)


if __name__ == "__main__":
    main()
