"""Heavy-hitter discovery at n = 10^6 under central (ε = 1, δ = 1e-6): recall, F1, decode time.

    python bench/heavy_hitters.py                       # both data sets, 10 seeds
    python bench/heavy_hitters.py --data zipf --seeds 1 --keep 300
    python bench/heavy_hitters.py --baselines           # pure-ldp PEM/TreeHist/SFP (a /tmp venv)

Data: "zipf" — 100,000 distinct random strings of 1–16 letters, Zipf(1.1) over a
random ranking; "words" — English words with their wordfreq frequencies (top
50,000, the package ships its data; `pip install wordfreq`). Each of n devices
draws one value. The truth is the top 100 of the devices' values (as the
symbol map reads them: characters outside the alphabet are one OTHER symbol).

Each round's group is a disjoint share of the devices; its local ε0 is the
largest whose generic shuffle bound meets (ε, δ) over that group's size
(``plan_epsilon0``; with ``--shufflers S`` over its size ÷ S, the min_batch of S
shufflers), so the whole discovery is (ε, δ)-DP (parallel composition).
Reports are simulated per group in numpy (``aggregator.discovery.simulate``) and
decoded by the real decoders; "decode s" is the slowest round's decode.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import string
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from crowdmix.aggregator.accounting.discovery import RoundCost, discovery_guarantee, plan_epsilon0
from crowdmix.aggregator.discovery import (
    DiscoveryPlan,
    DiscoveryState,
    advance,
    decode_prefix_round,
    decode_value_round,
    discovered,
)
from crowdmix.aggregator.discovery.simulate import simulate_prefix_counts, simulate_value_counts
from crowdmix.core.discovery import SymbolMap

ALPHABETS = {"zipf": string.ascii_lowercase, "words": string.ascii_lowercase + "'"}


@dataclass
class Data:
    name: str
    values: list[str]
    prob: np.ndarray


def zipf_data(seed: int, distinct: int = 100_000, exponent: float = 1.1) -> Data:
    rng = np.random.default_rng(10_000 + seed)
    letters = np.array(list(string.ascii_lowercase))
    seen: dict[str, None] = {}
    while len(seen) < distinct:
        for length in rng.integers(1, 17, size=distinct):
            seen.setdefault("".join(rng.choice(letters, size=int(length))), None)
            if len(seen) == distinct:
                break
    values = list(seen)
    rng.shuffle(values)
    w = np.arange(1, distinct + 1, dtype=np.float64) ** -exponent
    return Data("zipf", values, w / w.sum())


def words_data(top: int = 50_000) -> Data:
    try:
        import wordfreq
    except ImportError:
        sys.exit("the words data set needs wordfreq: pip install wordfreq")
    values = wordfreq.top_n_list("en", top)
    w = np.array([wordfreq.word_frequency(v, "en") for v in values], dtype=np.float64)
    return Data("words", values, w / w.sum())


def sample(data: Data, n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.choice(len(data.values), size=n, p=data.prob)


@functools.lru_cache(maxsize=64)
def epsilon0_for(n: int, epsilon: float, delta: float) -> float:
    return plan_epsilon0(n, epsilon, delta)


def run_once(data: Data, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    sm = SymbolMap(alphabet=ALPHABETS[data.name], max_length=16)
    holders = sample(data, args.n, rng)
    # the truth, as symbols: values that map to the same symbols are one value
    sym_of = [sm.symbols(v) for v in data.values]
    ids: dict[bytes, int] = {}
    canon = np.array([ids.setdefault(s, len(ids)) for s in sym_of], dtype=np.int64)
    counts = np.bincount(canon[holders], minlength=len(ids))
    by_id = list(ids)
    truth = {by_id[i] for i in np.argsort(-counts, kind="stable")[: args.top]}

    spans = tuple(int(x) for x in args.spans.split(","))
    weights = (
        [float(x) for x in args.weights.split(",")] if args.weights else [1.0] * (len(spans) + 1)
    )
    total = sum(weights)
    plan = DiscoveryPlan(
        symbols=sm,
        spans=spans,
        keep=args.keep,
        candidates=args.candidates,
        seeds=args.seeds_per_round,
        weights=tuple(w / total for w in weights),
    )
    # disjoint groups: a random split of the devices by the plan's shares
    order = rng.permutation(args.n)
    cuts = np.floor(np.cumsum((0.0, *plan.weights)) * args.n).astype(np.int64)
    groups = [holders[order[cuts[i] : cuts[i + 1]]] for i in range(plan.rounds)]
    state = DiscoveryState()
    costs, decode_s, decode_cpu = [], [], []
    for r in range(len(spans)):
        n_r = groups[r].size // args.shufflers  # the smallest batch: ε0 is planned over it
        eps0 = epsilon0_for(n_r, args.epsilon, args.delta)
        rnd = plan.prefix_round(r, eps0)
        c = simulate_prefix_counts(rnd, sym_of, groups[r], rng)
        t0, c0 = time.perf_counter(), time.process_time()
        est = decode_prefix_round(rnd, state.parent_array(), c, correct_heaviest=args.correct)
        state = advance(plan, state, est)
        decode_s.append(time.perf_counter() - t0)
        decode_cpu.append(time.process_time() - c0)
        costs.append(RoundCost(round=r, group=r, n_reports=n_r, epsilon0=eps0))
    n_f = groups[-1].size // args.shufflers
    eps0 = epsilon0_for(n_f, args.epsilon, args.delta)
    vr = plan.value_round(eps0, state.final_candidates(plan))
    c = simulate_value_counts(vr, sym_of, groups[-1], rng)
    t0 = time.perf_counter()
    table = discovered(plan, state, decode_value_round(vr, c))
    decode_s.append(time.perf_counter() - t0)
    costs.append(RoundCost(round=len(spans), group=len(spans), n_reports=n_f, epsilon0=eps0))
    guarantee = discovery_guarantee(costs, args.delta)
    found = {sm.symbols(v) for v in table.top(args.top)}
    hit = len(found & truth)
    recall = hit / len(truth)
    precision = hit / len(found) if found else 0.0
    f1 = 2 * precision * recall / (precision + recall) if hit else 0.0
    harvested = {v for v in state.harvest}
    return {
        "seed": seed,
        "recall": recall,
        "precision": precision,
        "f1": f1,
        "candidates_recall": len({sm.symbols(v) for v in vr.candidates} & truth) / len(truth),
        "harvest_recall": len(harvested & truth) / len(truth),
        "central_epsilon": guarantee.epsilon,
        "epsilon0": [round(c.epsilon0, 3) for c in costs],
        "decode_s": max(decode_s),
        "decode_each_s": [round(x, 2) for x in decode_s],
        "decode_cpu_s": max(decode_cpu),
        "load_average": os.getloadavg()[0],
        "report_bytes": max(plan.prefix_round(0, costs[0].epsilon0).report_bytes, vr.report_bytes),
    }


def baselines(args: argparse.Namespace) -> None:
    """pure-ldp's baselines (``--baseline-methods``) at local ε = 1 and at this system's
    ε0, on ``--baseline-n`` devices for each seed, beside this system on the same devices;
    then the median and min recall per method and ε. One process at a time."""
    import subprocess
    import tempfile

    from heavy_hitters_baselines import VENV_PINS

    venv = Path(os.environ.get("CROWDMIX_PURELDP_VENV", "/tmp/crowdmix-pureldp"))
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *VENV_PINS], check=True)
    harness = Path(__file__).with_name("heavy_hitters_baselines.py")
    names = ("zipf", "words") if args.data == "both" else (args.data,)
    methods = [m for m in args.baseline_methods.split(",") if m]
    for name in names:
        runs: dict[tuple[str, str], list[tuple[float, float]]] = {}
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            data = zipf_data(seed) if name == "zipf" else words_data()
            ours = run_once(data, argparse.Namespace(**{**vars(args), "n": args.baseline_n}), seed)
            eps0 = round(min(ours["epsilon0"]), 3)
            row = {"data": name, "method": "crowdmix", "n": args.baseline_n, **ours}
            print(json.dumps(row), flush=True)
            runs.setdefault(("crowdmix", f"central {args.epsilon}; eps0 {eps0}"), []).append(
                (ours["recall"], ours["precision"])
            )
            alphabet = ALPHABETS[name]
            clean = ["".join(c if c in alphabet else "'" for c in v)[:16] for v in data.values]
            holders = sample(data, args.baseline_n, np.random.default_rng(seed))  # as run_once
            counts = np.bincount(holders, minlength=len(clean))
            truth = [clean[i] for i in np.argsort(-counts, kind="stable")[: args.top]]
            with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
                json.dump(
                    {"values": [clean[i] for i in holders], "truth": truth, "alphabet": alphabet}, f
                )
            for eps in (1.0, eps0):
                for method in methods:
                    try:
                        out = subprocess.run(
                            [str(py), str(harness), f.name, method, str(eps)],
                            capture_output=True,
                            text=True,
                            timeout=args.baseline_timeout,
                        )
                        line = out.stdout.strip().splitlines()[-1] if out.stdout.strip() else ""
                        res = (
                            json.loads(line)
                            if line.startswith("{")
                            else {"method": method, "epsilon": eps, "error": out.stderr[-300:]}
                        )
                    except subprocess.TimeoutExpired:
                        res = {"method": method, "epsilon": eps, "error": "timeout"}
                    print(json.dumps({"data": name, "seed": seed, **res}), flush=True)
                    if "recall" in res:
                        key = (method, f"local {1.0 if eps == 1.0 else 'eps0'}")
                        runs.setdefault(key, []).append((res["recall"], res["precision"]))
            os.unlink(f.name)
        for (method, privacy), got in runs.items():
            rec, prec = [r for r, _ in got], [p for _, p in got]
            print(
                f"{name} n={args.baseline_n} {method} ({privacy}): recall@{args.top} median "
                f"{statistics.median(rec):.2f}, min {min(rec):.2f}; precision median "
                f"{statistics.median(prec):.2f}, min {min(prec):.2f}; {len(rec)} seeds",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", choices=("zipf", "words", "both"), default="both")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first..first+seeds-1")
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument(
        "--shufflers",
        type=int,
        default=1,
        help="plan each round's ε0 over its group ÷ this (the min_batch of that many shufflers)",
    )
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--top", type=int, default=100)
    ap.add_argument("--spans", default="3,6,9,12,15,17")
    ap.add_argument("--weights", default="")
    ap.add_argument("--keep", type=int, default=300)
    ap.add_argument("--candidates", type=int, default=300)
    ap.add_argument("--seeds-per-round", type=int, default=1024)
    ap.add_argument("--correct", type=int, default=16)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--baselines", action="store_true")
    ap.add_argument("--baseline-n", type=int, default=100_000)
    ap.add_argument("--baseline-timeout", type=float, default=3600.0)
    ap.add_argument("--baseline-methods", default="PEM,TreeHist,SFP")
    args = ap.parse_args()
    if args.baselines:
        sys.path.insert(0, str(Path(__file__).parent))
        baselines(args)
        return
    names = ("zipf", "words") if args.data == "both" else (args.data,)
    summary = {}
    for name in names:
        runs = []
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            data = zipf_data(seed) if name == "zipf" else words_data()
            res = run_once(data, args, seed)
            runs.append(res)
            print(json.dumps({"data": name, **res}), flush=True)
        keys = ("recall", "f1", "decode_s", "decode_cpu_s")
        med = {k: statistics.median(r[k] for r in runs) for k in keys}
        summary[name] = med
        print(
            f"{name}: median of {len(runs)} seeds: recall {med['recall']:.3f}, "
            f"F1 {med['f1']:.3f}, slowest round decode {med['decode_s']:.1f} s "
            f"({med['decode_cpu_s']:.1f} CPU s over its threads)",
            flush=True,
        )
    if args.json:
        print(json.dumps(summary))


if __name__ == "__main__":
    main()
