"""Tightness of the privacy figures: ours vs the best lower bound we can compute.

"Ours" is a statement's central ε for one shuffled batch of n reports
(``best_amplification``: the generic stronger clone or the mechanism's own bound).
"Lower" is the largest ε the real shuffled mechanism provably needs on a concrete pair
of neighbouring data sets (``lower_bounds``, rounded down); ours ÷ lower is the room
left. OUE's "GDP" column is that ratio for Gaussian privacy losses of the blanket and
of the lower bound's data set, where both figures land to ~1e-4: no grid, bin or search
refinement beats it. Target: ≤ 1.1 for k-RR (k = 2…1024) and OUE over n = 1e4…1e7,
ε0 = 0.25…4, δ = 1e-6…1e-10. Then RAPPOR at the demo's parameters (k=64 h=2 m=16
f=¼ p=¼ q=¾) and its smallest same-cohort crowds; its "GDP" column is ours over the
labelled data set's ε, both as Gaussian privacy losses (``rappor_gaussian_limit``).

    .venv/bin/python bench/tightness.py [--jobs 2] [--full] [--only OUE|RAPPOR] [--only-k K]
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

from crowdmix.aggregator.accounting.amplification import best_amplification
from crowdmix.aggregator.accounting.lower_bounds import bit_vector_lower, krr_lower
from crowdmix.aggregator.accounting.randomizers import BitVector, KaryRR, randomizer_of
from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams

TARGET = 1.1
DEMO = RapporParams(k=64, h=2, m=16, f=0.25, p=0.25, q=0.75)
# Smallest same-cohort crowds of the demo: 30 000 clients (105–140 across runs), 300 000 (464).
DEMO_CROWDS = ((30_000, 105), (30_000, 140), (300_000, 464))


def grid(full: bool, only_k: int | None = None) -> list[tuple[str, int, float, int, float]]:
    """(mechanism, k, ε0, n, δ) cells: every corner of the target's range and its middle
    (``only_k``: the k-RR cells of that k alone)."""
    ks: tuple[int, ...] = (2, 3, 8, 32, 128, 1024) if full else (2, 5, 32, 1024)
    ks = ks if only_k is None else (only_k,)
    eps = (0.25, 0.5, 1.0, 2.0, 4.0) if full else (0.25, 1.0, 4.0)
    ns = (10**4, 10**5, 10**6, 10**7)
    deltas = (1e-6, 1e-8, 1e-10) if full else (1e-6, 1e-10)
    cells = [("k-RR", k, e, n, d) for k, e, n, d in itertools.product(ks, eps, ns, deltas)]
    if only_k is None:
        cells += [("OUE", 0, e, n, d) for e, n, d in itertools.product(eps, ns, deltas)]
    return cells


def gaussian_limit(p: float, q: float, n: int, delta: float) -> float:
    """OUE's blanket figure ÷ its lower bound's data set, both as μ-GDP: μ² = 2A/(γn)
    and 2A(1 + χ²)/n, A = (q − p)²/(p(1 − p)) the χ² of one bit, γ = (1 − q)/(1 − p),
    χ² = (q − p)²/(q(1 − q)) the labels' (every other user one value)."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def eps(mu: float) -> float:
        def gap(e: float) -> float:
            return float(norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2))

        return float(brentq(lambda e: gap(e) - delta, 1e-12, 50.0))

    a = (q - p) ** 2 / (p * (1 - p))
    gamma, chi2 = (1 - q) / (1 - p), (q - p) ** 2 / (q * (1 - q))
    return eps(math.sqrt(2 * a / (gamma * n))) / eps(math.sqrt(2 * a * (1 + chi2) / n))


def rappor_gaussian_limit(p: float, q: float, bits: int, n: int, delta: float) -> float:
    """A bit vector's blanket figure ÷ its labelled lower bound's data set (every other
    user one value whose ``bits`` Bloom bits avoid the victim's), both as μ-GDP:
    μ² = 2((1 + A)^h − 1)/(γ(n − 1)) and 2((1 + A)^h − 1)(1 + χ²)^h/(n − 1), with
    2((1 + A)^h − 1) = E_W[(g0 − g1)²] for disjoint sets, A as in ``gaussian_limit``,
    γ = ((1 − q)/(1 − p))^h and (1 + χ²)^h = E[(victim's label law / the others')²]
    over the others' h labels. The ratio tends to (γ(1 + χ²)^h)^(−1/2) for small μ
    (1.356 at the demo's p*, q*): what a proof reaching that data set would gain."""
    from scipy.optimize import brentq
    from scipy.stats import norm

    def eps(mu: float) -> float:
        def gap(e: float) -> float:
            return float(norm.cdf(-e / mu + mu / 2) - math.exp(e) * norm.cdf(-e / mu - mu / 2))

        return float(brentq(lambda e: gap(e) - delta, 1e-12, 50.0))

    a = (q - p) ** 2 / (p * (1 - p))
    gamma = ((1 - q) / (1 - p)) ** bits
    label = (1 + (q - p) ** 2 / (q * (1 - q))) ** bits
    spread = 2 * ((1 + a) ** bits - 1) / (n - 1)
    return eps(math.sqrt(spread / gamma)) / eps(math.sqrt(spread * label))


def cell(
    c: tuple[str, int, float, int, float],
) -> tuple[str, int, float, int, float, float, float, str, float, float]:
    """(…cell, ours, lower, bound that gave ours, CPU seconds of ours, GDP limit or nan)."""
    mech, k, eps0, n, delta = c
    rand: KaryRR | BitVector
    limit = math.nan
    if mech == "k-RR":
        rand = KaryRR(epsilon0=eps0, domain=k)
        lower = krr_lower(eps0, k, n, delta)
    else:
        oue = randomizer_of(basic=BasicParams(mechanism="oue", epsilon=eps0, domain_size=8))
        assert isinstance(oue, BitVector)
        rand = oue
        lower = max(bit_vector_lower(oue.p, oue.q, 1, n, delta).values())
        limit = gaussian_limit(oue.p, oue.q, n, delta)
    started = time.process_time()
    best = best_amplification(rand.epsilon0, n, delta, rand)
    secs = time.process_time() - started
    return (*c, best.result.epsilon, lower, best.result.bound, secs, limit)


def rappor_rows() -> list[tuple[int, int, float, float, float, dict[str, float], float]]:
    """(clients, crowd, ε1, ours, lower, every lower bound, GDP ratio) at the demo's
    parameters."""
    rand = randomizer_of(rappor=DEMO)
    assert isinstance(rand, BitVector)
    out = []
    for clients, crowd in DEMO_CROWDS:
        ours = best_amplification(rand.epsilon0, crowd, 1e-6, rand).result.epsilon
        lowers = bit_vector_lower(rand.p, rand.q, rand.bits, crowd, 1e-6)
        limit = rappor_gaussian_limit(rand.p, rand.q, rand.bits, crowd, 1e-6)
        out.append((clients, crowd, rand.epsilon0, ours, max(lowers.values()), lowers, limit))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("--full", action="store_true", help="a denser grid (about 4× the cells)")
    ap.add_argument(
        "--only",
        choices=("k-RR", "OUE", "RAPPOR"),
        help="one mechanism's cells (RAPPOR: its rows alone)",
    )
    ap.add_argument("--only-k", type=int, help="only the k-RR cells of this k (no OUE, RAPPOR)")
    args = ap.parse_args()
    started = time.perf_counter()
    print(f"load average at start: {os.getloadavg()[0]:.2f} (1 min); 2 cores", flush=True)
    if args.only == "RAPPOR":
        rappor(started, args.jobs)
        return
    cells = [c for c in grid(args.full, args.only_k) if args.only in (None, c[0])]
    print(
        f"{'mech':<5} {'k':>5} {'ε0':>5} {'n':>8} {'δ':>6} {'ours':>9} {'lower':>9} "
        f"{'ratio':>6} {'GDP':>6} {'bound':>9} {'cpu s':>6}",
        flush=True,
    )
    by_mech: dict[str, list[tuple[float, tuple[object, ...]]]] = {}
    cpu = 0.0
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for row in pool.map(cell, cells):
            mech, k, eps0, n, delta, ours, lower, bound, secs, limit = row
            cpu += secs
            assert ours >= lower, (mech, k, eps0, n, delta, ours, lower)
            ratio = ours / lower if lower > 0 else math.inf
            by_mech.setdefault(mech, []).append((ratio, (k, eps0, n, delta)))
            flag = "  > target" if ratio > TARGET else ""
            print(
                f"{mech:<5} {k:>5} {eps0:>5} {n:>8.0e} {delta:>6.0e} {ours:>9.5f} {lower:>9.5f} "
                f"{ratio:>6.3f} {limit:>6.3f} {bound:>9} {secs:>6.1f}{flag}",
                flush=True,
            )
    print()
    for mech, rows in by_mech.items():
        ratios = [r for r, _ in rows]
        worst = max(rows, key=lambda rc: rc[0])
        over = [c for r, c in rows if r > TARGET]
        print(
            f"{mech}: {len(rows)} cells, ours/lower max {max(ratios):.3f} at (k, ε0, n, δ) = "
            f"{worst[1]}, median {statistics.median(ratios):.3f}; "
            f"{len(over)} over {TARGET}×" + (f": {over}" if over else "")
        )
    print(f"({cpu:.0f} s CPU computing ours, every cell)")
    if args.only or args.only_k is not None:
        print(f"({time.perf_counter() - started:.0f} s wall, {args.jobs} workers)")
        return
    print()
    rappor(started, args.jobs)


def rappor(started: float, jobs: int) -> None:
    """The RAPPOR rows (one process: three crowds)."""
    print(
        f"{'RAPPOR demo':<12} {'crowd':>6} {'ε1':>7} {'ours':>8} {'lower':>8} {'ratio':>6} "
        f"{'GDP':>6}  lowers"
    )
    for clients, crowd, eps1, ours, lower, lowers, limit in rappor_rows():
        assert ours >= lower
        detail = ", ".join(f"{k} {v:.4f}" for k, v in lowers.items())
        print(
            f"{clients:>12,} {crowd:>6} {eps1:>7.4f} {ours:>8.4f} {lower:>8.4f} "
            f"{ours / lower:>6.2f} {limit:>6.3f}  {detail}",
            flush=True,
        )
    print(f"({time.perf_counter() - started:.0f} s wall, {jobs} workers)")


if __name__ == "__main__":
    main()
