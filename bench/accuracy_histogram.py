"""RAPPOR vs shuffled k-RR vs shuffled histograms with
fake reports, side by side at the same n, d and central (ε, δ).

    .venv/bin/python bench/accuracy_histogram.py                 # n = 1e6, ε = 1, δ = 1e-6
    .venv/bin/python bench/accuracy_histogram.py --domains 100,1000 --reps 5 --json

For each domain size d: a Zipf(1.1) population of n devices over d values.

- RAPPOR: ``crowdmix.aggregator.accounting.planner.plan`` for the target (generic
  stronger-clone amplification within the smallest cohort), counts simulated
  exactly (``crowdmix.aggregator.decode.simulate``), decoded by ``decode_rappor`` with
  every value as a candidate; scored on its distribution answer (the
  consistent per-candidate estimate). Skipped above ``--rappor-max-d``.
- Shuffled k-RR: the largest ε0 (bisection, 1e-4) whose generic amplification
  (``crowdmix.aggregator.accounting.amplification.amplify``) over n reports is ≤ ε;
  k-RR counts simulated exactly (kept ~ Bin(c_v, 1 − τ), the rest uniform);
  the unbiased ``decode_basic`` estimate.
- Shuffled OUE and OLH at the same ε0 (the generic bound holds for every
  ε0-LDP randomizer, so their central figure is as proved as k-RR's): each
  value's support count simulated from its exact marginal, Bin(c_v, p*) +
  Bin(n − c_v, q*) (OUE: p* = ½, q* = 1/(e^ε0 + 1); OLH: p* = e^ε0/(e^ε0 + g − 1),
  q* = 1/g), decoded by ``decode_basic``. Per-bucket RMSE and E[TV] depend on
  the marginals only, so they are exact; the joint law is not simulated.
- Fake reports: ``plan_release`` (``plan_histogram``, cap ``--max-messages``) for the
  honest crowd the release statement will count (``honest_lower_bound`` of the report
  total's 1e-9 quantile, one batch), then checked with ``histogram_release``
  (the printed "stated ε" is what the report job would print); counts simulated
  exactly (fakes: Bin(n·m, q) reports, multinomial over d), decoded by
  ``decode_histogram`` with n estimated from the total, as the report job does.

Scores over ``--reps`` seeds: per-bucket RMSE in counts (sqrt of the mean over
buckets and reps of (ĉ_j − c_j)²), TV = ½·Σ|p̂_j − p_j| (estimates as decoded,
not projected, except RAPPOR's distribution answer), and for the fake-report
encoding the ratio of its RMSE to the best single-message RMSE (target ≤ 0.1).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crowdmix.aggregator.accounting.amplification import amplify
from crowdmix.aggregator.accounting.histogram_release import plan_release
from crowdmix.aggregator.accounting.planner import plan as plan_rappor
from crowdmix.aggregator.decode import decode_basic, decode_rappor, design_matrix
from crowdmix.aggregator.decode.histogram import decode_histogram
from crowdmix.aggregator.decode.rappor import DecodeOptions
from crowdmix.aggregator.decode.simulate import simulate_rappor_counts
from crowdmix.core.basic import BasicParams
from crowdmix.core.histogram import HistogramParams


def zipf_counts(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    w = 1.0 / np.arange(1, d + 1) ** 1.1
    return rng.multinomial(n, w / w.sum())


def krr_epsilon0(epsilon: float, n: int, delta: float) -> float:
    """Largest ε0 (to 1e-4, rounded down) whose generic amplification is ≤ ε."""
    lo, hi = epsilon, 30.0
    while hi - lo > 1e-4:
        mid = 0.5 * (lo + hi)
        if amplify(mid, n, delta).epsilon <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def simulate_krr(c: np.ndarray, params: BasicParams, rng: np.random.Generator) -> np.ndarray:
    d = c.size
    tau = d / (math.exp(params.epsilon) + d - 1)  # P(report uniform over the domain)
    kept = rng.binomial(c, 1.0 - tau)
    return kept + rng.multinomial(int(c.sum() - kept.sum()), np.full(d, 1.0 / d))


def simulate_fake(c: np.ndarray, params: HistogramParams, rng: np.random.Generator) -> np.ndarray:
    d, n = c.size, int(c.sum())
    real = (
        c
        if params.local_epsilon is None
        else simulate_krr(
            c, BasicParams(mechanism="krr", epsilon=params.local_epsilon, domain_size=d), rng
        )
    )
    fakes = rng.binomial(n * params.fake_slots, params.fake_probability)
    return real + rng.multinomial(fakes, np.full(d, 1.0 / d))


def simulate_support(
    c: np.ndarray, p_star: float, q_star: float, rng: np.random.Generator
) -> np.ndarray:
    """Each value's support count from its exact marginal (see the module docstring)."""
    n = int(c.sum())
    return rng.binomial(c, p_star) + rng.binomial(n - c, q_star)


def plan_fake(
    eps: float, delta: float, n: int, d: int, max_messages: int
) -> tuple[Any, float, int]:
    """The plan whose stated figure (``plan_release``) meets the target, and that figure."""
    plan, stated = plan_release(eps, delta, n, d, max_messages=max_messages)
    return plan, stated.epsilon, stated.honest_lower


def olh_std(n: int, epsilon0: float) -> float:
    e = math.exp(epsilon0)
    g = max(2, round(e) + 1)
    ps, qs = e / (e + g - 1), 1.0 / g
    return math.sqrt(n * qs * (1 - qs) / (ps - qs) ** 2)


def score(est_counts: np.ndarray, c: np.ndarray) -> tuple[float, float]:
    n = c.sum()
    sq = float(np.mean((est_counts - c) ** 2))
    tv = 0.5 * float(np.abs(est_counts / n - c / n).sum())
    return sq, tv


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    n, eps, delta = args.n, args.epsilon, args.delta
    eps0 = krr_epsilon0(eps, n, delta)
    rows: list[dict[str, Any]] = []
    for d in args.domains:
        row: dict[str, Any] = {"d": d, "n": n, "epsilon": eps, "delta": delta}
        hplan, stated_eps, n_low = plan_fake(eps, delta, n, d, args.max_messages)
        hp = hplan.params
        kp = BasicParams(mechanism="krr", epsilon=eps0, domain_size=d)
        up = BasicParams(mechanism="oue", epsilon=eps0, domain_size=d)
        lp = BasicParams(mechanism="olh", epsilon=eps0, domain_size=d)
        e0 = math.exp(eps0)
        g = lp.olh_buckets
        marginals = {
            "oue": (up, 0.5, 1.0 / (e0 + 1.0)),
            "olh": (lp, e0 / (e0 + g - 1.0), 1.0 / g),
        }
        rp = None
        if d <= args.rappor_max_d:
            rplan = plan_rappor(eps, delta, n, d)
            rp = rplan.params
            names = [f"v{i}" for i in range(d)]
            design = design_matrix(names, rp)
        acc: dict[str, list[tuple[float, float]]] = {
            "rappor": [],
            "krr": [],
            "oue": [],
            "olh": [],
            "fake": [],
        }
        t0 = time.perf_counter()
        for rep in range(args.reps):
            rng = np.random.default_rng(args.seed + 1000 * rep + d)
            c = zipf_counts(n, d, rng)
            y = simulate_krr(c, kp, rng)
            res = decode_basic([n], y[None, :], kp)
            acc["krr"].append(score(res.proportion * n, c))
            for name, (bp, p_star, q_star) in marginals.items():
                y = simulate_support(c, p_star, q_star, rng)
                res = decode_basic([n], y[None, :], bp)
                acc[name].append(score(res.proportion * n, c))
            y = simulate_fake(c, hp, rng)
            res = decode_histogram(y, hp)  # n estimated from the total, as the report job
            acc["fake"].append(score(res.proportion * res.num_reports, c))
            if rp is not None:
                totals, ones = simulate_rappor_counts(c, design, rp, rng)
                res = decode_rappor(totals, ones, rp, design, names, DecodeOptions())
                est = res.distribution if res.distribution is not None else res.proportion
                acc["rappor"].append(score(est * n, c))
        for name, vals in acc.items():
            if vals:
                row[f"{name}_rmse"] = math.sqrt(float(np.mean([v[0] for v in vals])))
                row[f"{name}_tv"] = float(np.mean([v[1] for v in vals]))
            else:
                row[f"{name}_rmse"] = None
                row[f"{name}_tv"] = None
        row["krr_epsilon0"] = eps0
        row["olh_rmse_analytic"] = olh_std(n, eps0)
        row["fake_rmse_analytic"] = hplan.std_error_count
        row["fake_m"] = hp.fake_slots
        row["fake_q"] = hp.fake_probability
        row["fake_central_epsilon"] = hplan.central_epsilon
        row["fake_stated_epsilon"] = stated_eps
        row["fake_honest_lower"] = n_low
        row["fake_expected_messages"] = hplan.expected_messages
        row["fake_max_messages"] = hplan.max_messages
        if rp is not None:
            row["rappor_params"] = f"k={rp.k} h={rp.h} m={rp.m} f={rp.f} p={rp.p:.4f} q={rp.q:.4f}"
        singles = {k: row[f"{k}_rmse"] for k in ("rappor", "krr", "oue", "olh")}
        singles = {k: v for k, v in singles.items() if v is not None}
        row["best_single_scheme"] = min(singles, key=lambda k: singles[k])
        row["best_single"] = singles[row["best_single_scheme"]]
        row["ratio"] = row["fake_rmse"] / row["best_single"]
        row["ratio_krr"] = row["fake_rmse"] / row["krr_rmse"]
        # An ideal central mechanism for reference: Laplace(2/ε) per value (a replaced
        # value moves two counts by 1: L1 sensitivity 2), RMSE 2·√2/ε — pure ε-DP, no δ.
        row["laplace_rmse"] = 2.0 * math.sqrt(2.0) / eps
        row["laplace_ratio"] = row["laplace_rmse"] / row["best_single"]
        row["seconds"] = time.perf_counter() - t0
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--domains", default="100,1000,10000,100000")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--max-messages", type=int, default=64)
    ap.add_argument("--rappor-max-d", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.domains = [int(x) for x in args.domains.split(",")]
    rows = run(args)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"n = {args.n:,}, central ε = {args.epsilon}, δ = {args.delta}, Zipf(1.1), "
        f"{args.reps} reps; shuffled k-RR/OLH at ε0 = {rows[0]['krr_epsilon0']:.4f} (generic bound)"
    )
    head = (
        f"{'d':>7} | {'RAPPOR rmse':>11} {'tv':>6} | {'k-RR rmse':>9} {'tv':>6} | "
        f"{'OUE rmse':>8} {'tv':>6} | {'OLH rmse':>8} {'tv':>6} | "
        f"{'fake rmse':>9} {'tv':>6} {'(analytic)':>10} | "
        f"{'msgs avg':>8} {'max':>4} {'stated ε':>8} | {'ratio':>5} {'vs k-RR':>7} "
        f"{'Laplace':>7} | {'s':>4}"
    )
    print(head)
    for r in rows:
        rr = (
            f"{r['rappor_rmse']:11.2f} {r['rappor_tv']:6.4f}"
            if r["rappor_rmse"]
            else f"{'-':>11} {'-':>6}"
        )
        print(
            f"{r['d']:>7} | {rr} | {r['krr_rmse']:9.2f} {r['krr_tv']:6.4f} | "
            f"{r['oue_rmse']:8.2f} {r['oue_tv']:6.4f} | {r['olh_rmse']:8.2f} {r['olh_tv']:6.4f} | "
            f"{r['fake_rmse']:9.2f} {r['fake_tv']:6.4f} "
            f"{r['fake_rmse_analytic']:10.2f} | {r['fake_expected_messages']:8.3f} "
            f"{r['fake_max_messages']:>4} {r['fake_stated_epsilon']:8.4f} | {r['ratio']:5.2f} "
            f"{r['ratio_krr']:7.2f} {r['laplace_ratio']:7.2f} | {r['seconds']:4.0f}"
        )
    print(
        "ratio = fake-report RMSE / best single-message RMSE (target ≤ 0.10); "
        "vs k-RR = against shuffled k-RR alone; Laplace = the ratio an ideal central "
        f"Laplace mechanism (RMSE 2√2/ε = {rows[0]['laplace_rmse']:.2f}) would reach"
    )


if __name__ == "__main__":
    main()
