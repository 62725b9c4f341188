"""``crowdmix discover``: heavy hitters without a candidate list.

    crowdmix discover simulate [--words N | --values FILE] --devices N [...]
    crowdmix discover open --config FILE --metric NAME --rounds FILE --state FILE [--window W]
    crowdmix discover step --config FILE --metric NAME --rounds FILE --state FILE --redis URL
                           [--window W] [--ledger FILE [--new-ledger]] [--accept-over-target]
                           [--top T] [--json]
    crowdmix discover demo [--words N | --values FILE] [--devices N] [--seed S]

``simulate``: devices simulated in numpy, every round through the real decoders.
``open``/``step``: the round job of a registry's heavy-hitters metric (served to devices
by the shuffler from the round file); ``step`` decodes the round whose window is over and
serves the next, or prints the result (and each round's central ε against the target).
``demo``: all of it through real daemons.
``--words N``: English words (``crowdmix[words]``); ``--values FILE``: ``value[<TAB>weight]``.
"""

from __future__ import annotations

import argparse
import string
import sys
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
    sim.add_argument(
        "--min-batch",
        type=positive_count,
        help="fewest reports per shuffled batch, ε0 is planned over it (default: a group)",
    )
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

    op = dsub.add_parser("open", help="start a registry metric's discovery: serve round 0")
    _job_arguments(op)
    op.add_argument("--window", type=int, help="round 0's window (default: the next one)")
    op.set_defaults(func=_open)
    st = dsub.add_parser(
        "step", help="decode the round whose window is over; serve the next or print the result"
    )
    _job_arguments(st)
    st.add_argument("--redis", metavar="URL", required=True, help="the aggregator's Redis")
    st.add_argument("--window", type=int, help="the next round's window (default: the next one)")
    led = st.add_argument_group("privacy ledger (each round is recorded; over budget: refused)")
    led.add_argument("--ledger", metavar="FILE", help="JSON ledger of the metric's releases")
    led.add_argument("--new-ledger", action="store_true", help="start --ledger FILE empty")
    led.add_argument("--budget-epsilon", type=float, metavar="E", help="total ε allowed")
    led.add_argument("--budget-delta", type=float, default=1e-5, metavar="D", help="(1e-5)")
    st.add_argument(
        "--accept-over-target",
        action="store_true",
        help="record a round above the target (a batch under min_batch) instead of refusing",
    )
    st.add_argument("--top", type=positive_count, default=20, help="rows to print")
    st.add_argument("--json", action="store_true")
    st.set_defaults(func=_step)

    from crowdmix.discover_demo import add_demo_parser

    add_demo_parser(dsub)  # the demo's module imports nothing of this one


def _job_arguments(p: Any) -> None:
    p.add_argument("--config", metavar="FILE", required=True, help="metric registry")
    p.add_argument("--metric", metavar="NAME", required=True, help="a heavy-hitters metric")
    p.add_argument(
        "--rounds", metavar="FILE", required=True, help="the round file the shufflers serve"
    )
    p.add_argument("--state", metavar="FILE", required=True, help="this job's state file")


def _job_metric(args: argparse.Namespace) -> tuple[Any, Any]:
    from crowdmix.cli import CliError
    from crowdmix.core.registry import load_registry

    registry = load_registry(args.config)
    metric = registry.get(args.metric)
    if metric is None:
        known = ", ".join(sorted(registry.metrics))
        raise CliError(f"metric {args.metric!r} is not in {args.config} (known: {known})")
    return registry, metric


def _describe(served: Any) -> str:
    if served.candidates:
        return f"the value round over {len(served.candidates)} candidates"
    return f"prefix symbols {served.start}-{served.stop}, {served.seeds} seeds x {served.buckets}"


def _open(args: argparse.Namespace) -> int:
    import time

    from crowdmix.aggregator.discovery.pipeline import DiscoveryError, open_discovery
    from crowdmix.cli import CliError
    from crowdmix.core.errors import ParamsError

    registry, metric = _job_metric(args)
    try:
        served = open_discovery(
            registry,
            metric,
            rounds_file=args.rounds,
            state_file=args.state,
            now=time.time(),
            window=args.window,
        )
    except (DiscoveryError, ParamsError) as exc:
        raise CliError(str(exc)) from None
    print(
        f"{metric.name}: round 0 ({_describe(served)}, local ε0 = {served.epsilon:.4f}) "
        f"served in window {served.window} (from {_utc(served.window * registry.window_seconds)})"
    )
    return 0


def _utc(t: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _step(args: argparse.Namespace) -> int:
    import time

    from crowdmix.aggregator.accounting import AccountingError
    from crowdmix.aggregator.discovery.pipeline import DiscoveryError, step_discovery
    from crowdmix.aggregator.errors import StoreError
    from crowdmix.aggregator.store import open_store
    from crowdmix.cli import CliError
    from crowdmix.core.errors import ParamsError

    registry, metric = _job_metric(args)
    ledger = None
    if args.ledger:
        from crowdmix.aggregator.accounting import Budget, JsonFileLedgerStore, PrivacyLedger

        budget = (
            Budget(epsilon=args.budget_epsilon, delta=args.budget_delta)
            if args.budget_epsilon is not None
            else None
        )
        lstore = JsonFileLedgerStore(args.ledger, create=False)
        if args.new_ledger:
            lstore.init()
        ledger = PrivacyLedger(lstore, budget)
    elif args.new_ledger:
        raise CliError("--new-ledger needs --ledger FILE")
    try:
        store = open_store(args.redis)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    try:
        result = step_discovery(
            registry,
            metric,
            store,
            rounds_file=args.rounds,
            state_file=args.state,
            now=time.time(),
            window=args.window,
            ledger=ledger,
            accept_over_target=args.accept_over_target,
        )
    except (DiscoveryError, ParamsError, StoreError, LookupError) as exc:
        raise CliError(str(exc).strip("'\"")) from None
    except AccountingError as exc:
        raise CliError(f"round refused by the ledger {args.ledger}: {exc}") from None
    finally:
        store.close()
    print(
        f"{metric.name}: round {result.round} central ε = {result.epsilon:.4f} over its "
        f"smallest batch, {result.stated_epsilon:.4f} stated over {result.cost.n_reports:,} "
        f"reports (min_batch {result.min_batch:,}; target {result.target:g})"
        + (" ABOVE TARGET" if result.stated_epsilon > result.target else "")
        + (
            f"; {result.other_round:,} reports of window {result.window} dropped by the "
            "aggregator as naming another round (a shuffler serves another round file)"
            if result.other_round
            else ""
        ),
        file=sys.stderr if args.json else sys.stdout,
    )
    if result.table is None:
        assert result.served is not None
        print(
            f"{metric.name}: round {result.round} decoded from {result.reports:,} reports of "
            f"window {result.window}"
            + (f" ({result.outside:,} outside its index range, ignored)" if result.outside else "")
            + f"; round {result.served.round} ({_describe(result.served)}, local ε0 = "
            f"{result.served.epsilon:.4f}) served in window {result.served.window} (from "
            f"{_utc(result.served.window * registry.window_seconds)})"
        )
        return 0
    assert result.guarantee is not None
    from crowdmix.discover_support import print_result

    print_result(result.table, result.guarantee, result.costs, top=args.top, as_json=args.json,
                 ledger=result.ledger)  # fmt: skip
    return 0


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
        groups = min(int(args.devices * w) for w in plan.weights)  # one shuffler: whole group
        settings = DiscoverySettings(
            plan=plan,
            epsilon=args.epsilon,
            delta=args.delta,
            devices=args.devices,
            min_batch=args.min_batch or max(1, groups),
        )
    except (ValueError, ParamsError) as exc:
        raise CliError(str(exc)) from None
    from crowdmix.discover_support import population, print_result

    values, weights = population(args)
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
    print_result(table, guarantee, outcome.state.costs, top=args.top, as_json=args.json)
    return 0
