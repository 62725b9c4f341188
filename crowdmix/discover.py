"""``crowdmix discover``: heavy hitters without a candidate list.

    crowdmix discover simulate [--words N | --values FILE] --devices N
                               [--epsilon 1] [--delta 1e-6] [--spans 3,6,...] [--keep K]
                               [--candidates C] [--top T] [--seed S] [--json]

Simulates the devices (numpy), runs every prefix round and the value round
through the real decoders and prints the discovered values with their shares,
95% intervals and the privacy statement. ``--words N``: the N most frequent
English words with their frequencies (``pip install 'crowdmix[words]'``);
``--values FILE``: one value per line, optionally ``value<TAB>weight``.
"""

from __future__ import annotations

import argparse
import json
import string
from typing import Any

from crowdmix.options import positive_count

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("discover", help="heavy hitters without a candidate list")
    dsub = p.add_subparsers(dest="discover_command", required=True)
    sim = dsub.add_parser("simulate", help="a whole discovery over simulated devices")
    src = sim.add_mutually_exclusive_group(required=True)
    src.add_argument("--words", type=positive_count, help="the N most frequent English words")
    src.add_argument("--values", help="a file: one value per line (value<TAB>weight)")
    sim.add_argument("--devices", type=positive_count, required=True, help="devices in all")
    sim.add_argument("--epsilon", type=float, default=1.0, help="central ε (default 1)")
    sim.add_argument("--delta", type=float, default=1e-6, help="δ (default 1e-6)")
    sim.add_argument("--max-length", type=positive_count, default=16)
    sim.add_argument("--alphabet", default=string.ascii_lowercase + "'")
    sim.add_argument("--spans", default="3,6,9,12,15,17", help="prefix length after each round")
    sim.add_argument("--keep", type=positive_count, default=300, help="prefixes kept per round")
    sim.add_argument("--candidates", type=positive_count, default=300)
    sim.add_argument("--seeds", type=positive_count, default=1024, help="hash seeds per round")
    sim.add_argument("--top", type=positive_count, default=20, help="rows to print")
    sim.add_argument("--seed", type=int, default=0, help="simulation seed")
    sim.add_argument("--json", action="store_true")
    sim.set_defaults(func=_simulate)


def _population(args: argparse.Namespace) -> tuple[list[str], list[float]]:
    from crowdmix.cli import CliError
    from crowdmix.options import read_input

    if args.words is not None:
        try:
            import wordfreq
        except ImportError:
            raise CliError(
                "--words needs the wordfreq package: pip install 'crowdmix[words]'"
            ) from None

        values = list(wordfreq.top_n_list("en", args.words))
        return values, [wordfreq.word_frequency(v, "en") for v in values]
    text = read_input(args.values, "values file").decode("utf-8", errors="replace")
    values, weights = [], []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        value, _, weight = line.partition("\t")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise CliError(f"{args.values}:{i}: weight {weight!r} is not a number") from None
        if not w > 0:
            raise CliError(f"{args.values}:{i}: weight must be positive, got {weight!r}")
        values.append(value)
        weights.append(w)
    if not values:
        raise CliError(f"{args.values}: no values")
    return values, weights


def _simulate(args: argparse.Namespace) -> int:
    import numpy as np

    from crowdmix.aggregator.discovery.job import DiscoverySettings, simulate
    from crowdmix.aggregator.discovery.plan import DiscoveryPlan
    from crowdmix.cli import CliError
    from crowdmix.client.errors import ParamsError
    from crowdmix.core.discovery import SymbolMap

    try:
        sm = SymbolMap(alphabet=args.alphabet, max_length=args.max_length)
        spans = tuple(int(x) for x in args.spans.split(","))
        plan = DiscoveryPlan(
            symbols=sm,
            spans=spans,
            keep=args.keep,
            candidates=args.candidates,
            seeds=args.seeds,
            weights=(1.0 / (len(spans) + 1),) * (len(spans) + 1),
        )
        settings = DiscoverySettings(
            plan=plan, epsilon=args.epsilon, delta=args.delta, devices=args.devices
        )
    except (ValueError, ParamsError) as exc:
        raise CliError(str(exc)) from None
    values, weights = _population(args)
    rng = np.random.default_rng(args.seed)
    w = np.asarray(weights, dtype=np.float64)
    holders = rng.choice(len(values), size=args.devices, p=w / w.sum())
    symbols = [sm.symbols(v) for v in values]
    try:
        outcome = simulate(settings, symbols, holders, rng)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    table, guarantee = outcome.table, outcome.guarantee
    if table is None or guarantee is None:  # simulate always ends with the value round
        raise CliError("the discovery did not finish")
    rows = [
        {
            "value": v,
            "share": float(table.share[i]),
            "ci_low": float(table.ci_low[i]),
            "ci_high": float(table.ci_high[i]),
            "significant": bool(table.significant[i]),
        }
        for i, v in enumerate(table.values)
        if table.significant[i]
    ][: args.top]
    rounds = [
        {"round": r, "group": g, "reports": n, "epsilon0": e} for r, g, n, e in outcome.state.costs
    ]
    if args.json:
        print(json.dumps({"values": rows, "rounds": rounds, "privacy": guarantee.to_dict()}))
        return 0
    print(f"{'value':<18} {'share':>9}   95% interval")
    for row in rows:
        print(
            f"{row['value']:<18} {row['share']:>9.5f}   [{row['ci_low']:.5f}, {row['ci_high']:.5f}]"
        )
    print(
        f"\nprivacy: central (ε={guarantee.epsilon:.4f}, δ={guarantee.delta:.1e}) over "
        f"{len(rounds)} rounds ({guarantee.argument}); each device reports once, "
        f"local ε0 ≤ {guarantee.local_epsilon:.3f}"
    )
    for r in rounds:
        print(f"  round {r['round']}: {r['reports']} reports, ε0 = {r['epsilon0']:.3f}")
    return 0
