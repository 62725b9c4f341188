"""``crowdmix discover demo``: a discovery of popular words through the real daemons.

A shuffler and an aggregator on real gRPC (in this process, memory stores, clear
reports) and the round job between windows: each round the devices of its group fetch
``GetConfig``, encode their word against the round served for the window
(``client.discovery.WindowEncoder``) and submit; the demo moves the daemons' clock past
the window, the shuffler releases it whole, and ``step_discovery`` decodes it, records it
in a ledger and serves the next round. Words: ``--words N`` (wordfreq), else
``--values FILE`` or the list shipped in examples/discover/words.tsv.
"""

from __future__ import annotations

import argparse
import string
import tempfile
import time
from pathlib import Path
from typing import Any

from crowdmix.options import positive_count

__all__ = ["add_demo_parser", "run_discovery_demo"]

METRIC = "words"
GRACE_SECONDS = 60.0
SHIPPED = Path(__file__).resolve().parent.parent / "examples" / "discover" / "words.tsv"


def add_demo_parser(dsub: Any) -> None:
    p = dsub.add_parser("demo", help="a discovery of popular words through the real daemons")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--words", type=positive_count, help="the N most frequent English words")
    src.add_argument("--values", help="value<TAB>weight per line (default: the shipped list)")
    p.add_argument("--devices", type=positive_count, default=40_000, help="devices (40000)")
    p.add_argument("--epsilon", type=float, default=1.0, help="central ε (default 1)")
    p.add_argument("--delta", type=float, default=1e-6, help="δ (default 1e-6)")
    p.add_argument("--max-length", type=positive_count, default=8, help="longer is cut (8)")
    p.add_argument("--spans", default="3,6,9", help="prefix length after each round (3,6,9)")
    p.add_argument("--keep", type=positive_count, default=60, help="prefixes kept (60)")
    p.add_argument("--candidates", type=positive_count, default=60, help="values estimated")
    p.add_argument("--seeds", type=positive_count, default=64, help="hash seeds per round")
    p.add_argument("--top", type=positive_count, default=20, help="rows to print")
    p.add_argument("--seed", type=int, help="fix the population (the coins stay random)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.discovery.pipeline import DiscoveryError
    from crowdmix.cli import CliError
    from crowdmix.core.errors import ParamsError
    from crowdmix.discover_support import print_result

    if args.words is None and args.values is None:
        if not SHIPPED.exists():
            raise CliError(f"no word list at {SHIPPED}: give --values FILE or --words N")
        args.values = str(SHIPPED)
    try:
        demo = run_discovery_demo(args, quiet=args.json)
    except (DiscoveryError, ParamsError, RuntimeError) as exc:
        raise CliError(str(exc)) from None
    result = demo["result"]
    print_result(
        result.table, result.guarantee, result.costs, top=args.top, as_json=args.json,
        ledger=result.ledger,
    )  # fmt: skip
    if not args.json:
        found = demo["found"]
        print(
            f"\ntrue top {len(demo['true_top'])} found: {len(found)} "
            f"({', '.join(found) or 'none'}); {demo['seconds']:.1f}s"
        )
    return 0


def run_discovery_demo(
    args: argparse.Namespace, *, quiet: bool = False, work: Path | None = None
) -> dict[str, Any]:
    """Run the demo; returns the last step's result, the true top values found and the
    time taken. ``work`` holds the round, state and ledger files (default: a temporary
    directory)."""
    import numpy as np

    from crowdmix.aggregator.accounting import JsonFileLedgerStore, PrivacyLedger
    from crowdmix.aggregator.daemon.server import start_aggregator
    from crowdmix.aggregator.discovery.pipeline import open_discovery, step_discovery
    from crowdmix.aggregator.store import load_batch_sizes, open_store
    from crowdmix.client.discovery import WindowEncoder
    from crowdmix.client.transport import ShufflerClient
    from crowdmix.core.discovery import HeavyHittersParams
    from crowdmix.core.errors import ParamsError
    from crowdmix.core.registry import MetricConfig, Registry, ShufflePolicy
    from crowdmix.demo_support import say
    from crowdmix.discover_support import population
    from crowdmix.shuffler.config import ShufflerSettings
    from crowdmix.shuffler.memory_store import MemoryStore
    from crowdmix.shuffler.server import start_shuffler

    started = time.perf_counter()
    values, weights = population(args)
    try:
        spans = tuple(int(x) for x in args.spans.split(","))
    except ValueError:
        raise ParamsError(
            f"--spans must be integers separated by commas, got {args.spans!r}"
        ) from None
    hh = HeavyHittersParams(
        alphabet=string.ascii_lowercase + "'",
        max_length=args.max_length,
        spans=spans,
        keep=args.keep,
        candidates=args.candidates,
        seeds=args.seeds,
        weights=(1.0 / (len(spans) + 1),) * (len(spans) + 1),
        epsilon=args.epsilon,
        delta=args.delta,
        devices=args.devices,
    )
    # one shuffler: every round's batch is its whole group; min_batch (the crowd each
    # round's ε0 is planned over) leaves a margin for the groups' random sizes
    group = max(1, int(args.devices * min(hh.weights)))
    policy = ShufflePolicy(
        min_batch=max(1, int(0.9 * group)), release="window", release_grace_seconds=GRACE_SECONDS
    )
    metric = MetricConfig(name=METRIC, heavy_hitters=hh, shuffle=policy)
    registry = Registry(metrics={METRIC: metric}, window_seconds=3600)
    ws = registry.window_seconds
    rng = np.random.default_rng(args.seed)
    w = np.asarray(weights, dtype=np.float64)
    holders = rng.choice(len(values), size=args.devices, p=w / w.sum())
    cuts = np.floor(np.cumsum((0.0, *hh.weights)) * args.devices).astype(np.int64)
    truth = np.bincount(holders, minlength=len(values)) / args.devices
    say(
        f"crowdmix discover demo: {args.devices:,} devices holding {len(values):,} distinct "
        f"values, {hh.rounds} rounds (central ε={hh.epsilon}, δ={hh.delta:g})",
        quiet,
    )

    tmp = None
    if work is None:
        tmp = tempfile.TemporaryDirectory(prefix="crowdmix-discover-")
        work = Path(tmp.name)
    rounds_file, state_file = work / "rounds.json", work / "discovery-state.json"
    ledger_store = JsonFileLedgerStore(work / "ledger.json", create=True)
    ledger = PrivacyLedger(ledger_store)
    now = [time.time()]  # the daemons' clock: moved past each window instead of waiting
    store = open_store(None)
    aggregator = start_aggregator(
        registry,
        store,
        listen="127.0.0.1:0",
        clock=lambda: now[0],
        rounds_file=str(rounds_file),
    )
    settings = ShufflerSettings(rounds_file=str(rounds_file))
    try:
        shuffler = start_shuffler(
            registry,
            MemoryStore(),
            f"127.0.0.1:{aggregator.port}",
            settings=settings,
            clock=lambda: now[0],
        )
    except BaseException:
        aggregator.stop()
        raise
    target = f"127.0.0.1:{shuffler.port}"
    result: Any = None
    try:
        served = open_discovery(
            registry, metric, rounds_file=rounds_file, state_file=state_file, now=now[0]
        )
        for r in range(hh.rounds):
            window = served.window
            now[0] = window * ws + ws / 2
            group = holders[cuts[r] : cuts[r + 1]]
            with ShufflerClient(target, sealing="off") as sender:
                # GetConfig: the round of this window (the shuffler re-reads the round
                # file at most once a second: a device without it waits and asks again)
                deadline = time.monotonic() + 10.0
                while (mine := sender.config(refresh=True).round_of(METRIC, window)) is None:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the shuffler serves no round in window {window}")
                    time.sleep(0.2)
                encoder = WindowEncoder(
                    mine.params(hh),
                    metric=METRIC,
                    fingerprint=mine.fingerprint(metric.fingerprint),  # bound to its round
                    window=window,
                )
                reports = [encoder.encode(values[i]) for i in group.tolist()]
                for i in range(0, len(reports), 5000):
                    sender.submit_many(reports[i : i + 5000], window=window)
                    sender.flush()
                if sender.sent != len(reports):
                    raise RuntimeError(f"the shuffler took {sender.sent} of {len(reports)}")
            # the window closes (the shuffler takes it one window late) and its grace ends
            now[0] = (window + 2) * ws + GRACE_SECONDS + 1.0
            deadline = time.monotonic() + 60.0
            while not load_batch_sizes(store, METRIC, [window]):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"window {window} was not released in 60 s")
                time.sleep(0.05)
            result = step_discovery(
                registry,
                metric,
                store,
                rounds_file=rounds_file,
                state_file=state_file,
                now=now[0],
                ledger=ledger,
            )
            say(
                f"  round {r} (window {window}): {result.reports:,} reports, "
                f"ε0 = {result.cost.epsilon0:.3f}"
                + (
                    f"; next: round {result.served.round} in window {result.served.window}"
                    if result.served is not None
                    else ""
                ),
                quiet,
            )
            if result.served is not None:
                served = result.served
    finally:
        shuffler.stop()
        aggregator.stop()
        if tmp is not None:
            tmp.cleanup()
    table = result.table
    k = min(10, len(values))
    true_top = [values[i] for i in np.argsort(-truth, kind="stable")[:k]]
    found = [v for v in true_top if v in set(table.top(len(table.values)))]
    return {
        "result": result,
        "true_top": true_top,
        "found": found,
        "truth": {values[i]: float(truth[i]) for i in range(len(values))},
        "seconds": time.perf_counter() - started,
    }
