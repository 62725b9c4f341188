"""``crowdmix demo``: the whole pipeline in one process, on real gRPC over loopback.

A simulated population (``--clients`` clients holding v1..vN from ``--distribution``,
each with a fresh 32-byte CSPRNG secret and its cohort) encodes with
``crowdmix.client.batch.BatchEncoder.encode_clients`` (the device's memoised PRR bit for
bit, a fresh IRR per report) and submits through ``ShufflerClient`` to a shuffler, which
authenticates, validates, stores (memory, or Redis with ``--redis``), thresholds,
shuffles and forwards to an aggregator that counts each batch exactly once. Reports are
sealed to a key set the demo makes (``--plaintext`` sends them clear). The report job
decodes against the true values plus decoys nobody holds and states the privacy
guarantee. Outputs in ``--out``: results.csv, summary.json (with ``truth`` and ``total
variation``), plot.png (estimate with 95% interval against the truth).
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from crowdmix.demo_support import demo_keys as _demo_keys
from crowdmix.demo_support import demo_summary as _demo_summary
from crowdmix.demo_support import print_privacy_and_paths as _print_privacy_and_paths
from crowdmix.demo_support import say as _say
from crowdmix.demo_support import total_variation as _total_variation
from crowdmix.demo_support import wait_for_counts as _wait_for_counts
from crowdmix.options import add_rappor_options, rappor_params

if TYPE_CHECKING:
    from collections.abc import Callable

    from crowdmix.aggregator.report.job import ReportOutcome
    from crowdmix.client.batch import ByteSource
    from crowdmix.core.registry import MetricConfig, Registry
    from crowdmix.population import Population

__all__ = ["DemoResult", "demo_redis_urls", "register", "run_demo"]

METRIC = "demo_values"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="the whole pipeline in one process: clients -> shuffler -> aggregator -> report",
        description="Simulated clients encode with the SDK and submit over gRPC to a shuffler, "
        "which thresholds, shuffles and forwards to an aggregator; then the report job decodes "
        "and states the privacy guarantee. Nothing to install: in-memory stores by default.",
    )
    p.add_argument(
        "--encoding",
        choices=("rappor", "shuffled-histogram"),
        default="rappor",
        help="rappor (default), or shuffled-histogram: each device sends its value plus fake "
        "reports, sealed, one call per device",
    )
    p.add_argument(
        "--clients",
        type=int,
        default=None,
        help="clients (default 300000; 20000 for shuffled-histogram, one call each)",
    )
    p.add_argument("--values", type=int, default=100, help="distinct values v1..vN (default 100)")
    p.add_argument(
        "--distribution",
        default="zipf1.5",
        help="zipf1 | zipf1.5 | exp | gauss | unif (default zipf1.5)",
    )
    p.add_argument("--decoys", type=int, default=20, help="candidates nobody holds (default 20)")
    p.add_argument("--seed", type=int, help="fix the population (secrets stay random)")
    p.add_argument("--out", default="crowdmix-out/demo", metavar="DIR", help="output directory")
    p.add_argument(
        "--redis",
        metavar="URL",
        help="use Redis instead of memory: the shuffler in the URL's database N, the "
        "aggregator in database N+1 (both must be empty)",
    )
    p.add_argument("--top", type=int, default=15, help="rows in the terminal table (default 15)")
    g = p.add_argument_group("RAPPOR parameters (see `crowdmix plan`)")
    add_rappor_options(g, k=64, m=16, f=0.25, p=0.25, q=0.75)
    g.add_argument(
        "--min-batch", type=int, help="shuffler threshold (default: clients/10, at most 10000)"
    )
    p.add_argument(
        "--plaintext",
        action="store_true",
        help="send reports clear (default: sealed to the aggregator's key; costs ~0.15 ms "
        "of CPU per report to seal and open); refused for shuffled-histogram",
    )
    from crowdmix.demo_histogram import add_histogram_options

    add_histogram_options(p)
    p.set_defaults(func=run)


@dataclass(frozen=True, slots=True)
class DemoResult:
    outcome: ReportOutcome
    truth: dict[str, float]
    total_variation: float
    acknowledged: int
    counted: int
    held_back: int
    paths: dict[str, Path]


def _registry(args: argparse.Namespace) -> Registry:
    from crowdmix.core.registry import MetricConfig, Registry, ShufflePolicy

    params = rappor_params(args)
    min_batch = args.min_batch if args.min_batch else max(1, min(10_000, args.clients // 10))
    policy = ShufflePolicy(
        min_batch=min_batch, max_batch=max(min_batch, 100_000), max_delay_seconds=0.5
    )
    return Registry(metrics={METRIC: MetricConfig(name=METRIC, rappor=params, shuffle=policy)})


def _encode(
    metric: MetricConfig,
    population: Population,
    byte_source: ByteSource | None,
    new_secret: Callable[[], bytes],
) -> Any:
    from crowdmix.client.batch import BatchEncoder

    assert metric.rappor is not None
    encoder = BatchEncoder(
        metric.rappor, metric=metric.name, hashing=metric.hashing, source=byte_source
    )
    client_secrets = [new_secret() for _ in range(population.size)]
    values = [population.values[i] for i in population.choice]
    return encoder.encode_clients(client_secrets, values)


def _new_secret() -> bytes:
    return os.urandom(32)


def demo_redis_urls(url: str) -> tuple[str, str]:
    """(shuffler URL, aggregator URL): database N of ``url`` and database N+1.

    The statement the demo prints assumes the shuffler and the aggregator do not
    share their data; two databases keep their keys apart (a real deployment uses
    two Redis servers, as ``crowdmix cluster`` does).
    """
    from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(f"--redis must be a redis://, rediss:// or unix:// URL, got {url!r}")
    query = parse_qs(parts.query)
    path_db = parts.path.strip("/") if parts.scheme != "unix" else ""
    raw = query.get("db", [path_db or "0"])[0]
    if not raw.isdigit():
        raise ValueError(f"--redis {url}: the database must be a number, got {raw!r}")
    db = int(raw)
    if parts.scheme == "unix" or "db" in query:
        query["db"] = [str(db + 1)]
        other = urlunsplit(parts._replace(query=urlencode(query, doseq=True)))
    else:
        other = urlunsplit(parts._replace(path=f"/{db + 1}"))
    return url, other


def _require_empty_redis(url: str) -> None:
    """Refuse a database that already holds keys: counts of an earlier run would mix in."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=5, socket_timeout=10)
    try:
        keys = int(client.dbsize())
    except redis.RedisError as exc:
        raise RuntimeError(f"cannot reach Redis at {url}: {exc}") from None
    finally:
        client.close()
    if keys:
        raise RuntimeError(
            f"Redis {url} already holds {keys:,} keys (an earlier demo run?): the demo "
            "counts from an empty store. Give another database number in --redis (the "
            "aggregator takes the next one) or empty it: redis-cli -u URL FLUSHDB"
        )


def run_demo(
    args: argparse.Namespace,
    *,
    quiet: bool = False,
    byte_source: ByteSource | None = None,
    new_secret: Callable[[], bytes] = _new_secret,
) -> DemoResult:
    """Run the pipeline end to end; raises ValueError/RuntimeError with a message on failure.

    ``byte_source`` (the IRR's randomness) and ``new_secret`` exist so tests can
    seed a run; left unset, both are the OS CSPRNG as on a device.
    """
    from crowdmix.aggregator.daemon.server import start_aggregator
    from crowdmix.aggregator.report.job import ReportJob, run_report, write_outputs
    from crowdmix.aggregator.store import load_batch_sizes, load_counts, open_store
    from crowdmix.population import draw_population
    from crowdmix.shuffler.config import ShufflerSettings
    from crowdmix.shuffler.memory_store import MemoryStore
    from crowdmix.shuffler.server import start_shuffler
    from crowdmix.simulate import send_batched

    started = time.perf_counter()
    if args.clients is None:
        args.clients = 300_000
    for name in ("clients", "values", "top"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be positive")
    if args.decoys < 0:
        raise ValueError("--decoys must not be negative")
    if args.min_batch is not None and not 1 <= args.min_batch <= args.clients:
        raise ValueError(
            f"--min-batch {args.min_batch} must be between 1 and --clients {args.clients}: "
            "the shuffler never releases fewer than min-batch reports, so nothing would "
            "reach the aggregator"
        )
    registry = _registry(args)
    metric = registry[METRIC]
    assert metric.rappor is not None
    population = draw_population(args.clients, args.values, args.distribution, seed=args.seed)

    _say(
        f"crowdmix demo: {population.size:,} clients, {args.values} values ({args.distribution}), "
        f"RAPPOR k={metric.rappor.k} h={metric.rappor.h} m={metric.rappor.m} "
        f"f={metric.rappor.f} p={metric.rappor.p} q={metric.rappor.q}",
        quiet,
    )
    t0 = time.perf_counter()
    batch = _encode(metric, population, byte_source, new_secret)
    _say(f"  encoded on the clients in {time.perf_counter() - t0:.1f}s", quiet)

    token = secrets.token_hex(24)  # hex: never starts with "-", so it is safe as a CLI argument
    if args.redis:
        from crowdmix.shuffler.redis_store import RedisStore

        shuffler_url, aggregator_url = demo_redis_urls(args.redis)
        for url in (shuffler_url, aggregator_url):
            _require_empty_redis(url)
        shuffler_store: Any = RedisStore(shuffler_url)
        aggregator_store = open_store(aggregator_url)
    else:
        shuffler_store = MemoryStore()
        aggregator_store = open_store(None)
    sealed = not getattr(args, "plaintext", False)
    key_dir = _demo_keys() if sealed else None
    aggregator = start_aggregator(
        registry,
        aggregator_store,
        listen="127.0.0.1:0",
        keys_file=None if key_dir is None else str(Path(key_dir.name) / "keys.json"),
    )
    shuffler = start_shuffler(
        registry,
        shuffler_store,
        f"127.0.0.1:{aggregator.port}",
        listen="127.0.0.1:0",
        settings=ShufflerSettings(
            public_keys=None if key_dir is None else str(Path(key_dir.name) / "public.json")
        ),
        tokens=frozenset({token}),
    )
    store_name = (
        f"Redis: shuffler {shuffler_url}, aggregator {aggregator_url}" if args.redis else "memory"
    )
    _say(
        f"  shuffler on 127.0.0.1:{shuffler.port} -> aggregator on 127.0.0.1:{aggregator.port} "
        f"({store_name} stores, threshold {metric.shuffle.min_batch:,} reports, "
        + ("reports sealed to the aggregator)" if sealed else "plaintext reports)"),
        quiet,
    )
    try:
        t0 = time.perf_counter()
        acknowledged, _, _ = send_batched(
            f"127.0.0.1:{shuffler.port}",
            batch.reports(),
            token=token,
            batch_size=1000,
            sealing="required" if sealed else "off",
            # a bar redrawn with \r only on a terminal; in a log it would be noise
            progress=None if quiet or not sys.stdout.isatty() else ("submitting", sys.stdout),
        )
        _say(f"  {acknowledged:,} reports acknowledged in {time.perf_counter() - t0:.1f}s", quiet)

        # Stopping the shuffler gracefully releases every batch that meets the
        # threshold; a remainder below min_batch is held back, never released.
        shuffler.stop()
        pending = sum(shuffler_store.pending(METRIC).values())
        expected = acknowledged - pending
        counted = _wait_for_counts(aggregator_store, METRIC, expected, timeout=60.0)
        if counted != expected:
            raise RuntimeError(f"the aggregator counted {counted:,} reports, expected {expected:,}")
        _say(
            f"  shuffled batches counted by the aggregator: {counted:,} reports"
            + (f" ({pending:,} held back below the threshold)" if pending else ""),
            quiet,
        )

        counts = load_counts(aggregator_store, metric)
        batch_sizes = tuple(load_batch_sizes(aggregator_store, METRIC))
        candidates = population.values + tuple(f"decoy-{i}" for i in range(1, args.decoys + 1))
        outcome = run_report(
            ReportJob(
                metric=metric,
                totals=counts.totals,
                ones=counts.ones,
                candidates=candidates,
                source=f"demo ({store_name} store)",
                batch_sizes=batch_sizes,
                smallest_crowd=aggregator_store.smallest_crowd(METRIC),
                sealed=sealed,
                duplicate_reports=aggregator_store.duplicate_reports(METRIC),
            )
        )
    finally:
        shuffler.stop()
        aggregator.stop()
        if key_dir is not None:
            key_dir.cleanup()
        if args.redis:
            shuffler_store.close()
            aggregator_store.close()

    truth = population.true_frequencies()
    result = outcome.result
    estimate = {
        v: float(result.proportion[i]) for i, v in enumerate(result.values) if result.significant[i]
    }
    tv = _total_variation(estimate, truth)
    outcome.summary["demo"] = {
        **_demo_summary(
            args,
            population,
            acknowledged=acknowledged,
            counted=counted,
            held_back=pending,
            sealed=sealed,
            total_variation=tv,
            truth=truth,
        ),
        "elapsed_seconds": time.perf_counter() - started,
    }
    out = Path(args.out)
    paths = write_outputs(outcome, out, plot=False)
    paths["plot"] = out / "plot.png"
    _plot_against_truth(outcome, truth, paths["plot"], top=args.top)
    return DemoResult(outcome, truth, tv, acknowledged, counted, pending, paths)


def _plot_against_truth(
    outcome: ReportOutcome, truth: dict[str, float], path: Path, *, top: int
) -> None:
    """Horizontal bars: estimate with its 95% interval, the true share as a marker."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    result = outcome.result
    order = [i for i in result.order() if result.significant[i]][:top] or result.order()[:top]
    labels = [result.values[i] for i in order]
    est = np.array([result.proportion[i] for i in order]) * 100
    lo = np.array([result.ci_low[i] for i in order]) * 100
    hi = np.array([result.ci_high[i] for i in order]) * 100
    tru = np.array([truth.get(v, 0.0) for v in labels]) * 100
    y = np.arange(len(order))[::-1]
    fig, ax = plt.subplots(figsize=(8.5, max(2.5, 0.38 * len(order) + 1.6)), dpi=110)
    ax.barh(y, est, color="#4C78A8", label="estimate")
    # Drawn as segments, not as error bars around the estimate: a selection-adjusted
    # interval need not contain its estimate (near the detection cutoff it lies below).
    ax.hlines(y, lo, hi, color="black", lw=1, label="95% interval")
    ax.scatter(np.concatenate([lo, hi]), np.concatenate([y, y]), marker="|", color="black", s=40)
    ax.scatter(tru, y, marker="D", color="#E45756", zorder=3, label="true share")
    ax.set_yticks(y, labels)
    ax.set_xlabel("share of reports (%)")
    n = result.num_reports
    tv = outcome.summary.get("demo", {}).get("total_variation")
    title = f"crowdmix demo: top {len(order)} values from {n:,} shuffled reports"
    if tv is not None:
        title += f" (TV {tv:.3f})"
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _table(demo: DemoResult, top: int) -> str:
    result = demo.outcome.result
    n = result.num_reports
    order = result.order()[:top]
    width = max(5, *(len(result.values[i]) for i in order))
    head = (
        f"{'value':<{width}}  {'estimate':>9}  {'95% interval':>17}  {'true':>7}  "
        f"{'in CI':>5}  {'signif.':>7}"
    )
    lines = [head, "-" * len(head)]
    for i in order:
        v = result.values[i]
        t = demo.truth.get(v, 0.0)
        inside = result.ci_low[i] <= t <= result.ci_high[i]
        lines.append(
            f"{v:<{width}}  {result.proportion[i]:>9.2%}  "
            f"{f'[{result.ci_low[i]:.2%}, {result.ci_high[i]:.2%}]':>17}  {t:>7.2%}  "
            f"{'yes' if inside else 'no':>5}  {'yes' if result.significant[i] else 'no':>7}"
        )
    del n
    return "\n".join(lines)


def _run_histogram(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.decode.errors import DecodeError
    from crowdmix.aggregator.errors import AggregatorError
    from crowdmix.aggregator.report.job import format_table
    from crowdmix.cli import CliError
    from crowdmix.client.errors import CrowdmixClientError, TransportError
    from crowdmix.demo_histogram import run_histogram_demo
    from crowdmix.shuffler.errors import ShufflerError

    if args.clients is None:
        args.clients = 20_000
    try:
        demo = run_histogram_demo(args)
    except TransportError as exc:
        raise CliError(f"the shuffler refused the reports: {exc}") from None
    except (
        ValueError,
        RuntimeError,
        DecodeError,
        AggregatorError,
        ShufflerError,
        CrowdmixClientError,
    ) as exc:
        raise CliError(str(exc)) from None
    result = demo.outcome.result
    print()
    print(format_table(result, top=args.top))
    print()
    diag = demo.outcome.summary["diagnostics"]
    print(
        f"{demo.acknowledged:,} reports from an estimated {diag['devices']:,.0f} devices "
        f"({diag['expected_fakes_per_value']:.1f} fakes per value expected); "
        f"{result.detected} of {len(result.values)} values detected; total variation "
        f"distance to the truth {demo.total_variation:.4f}"
    )
    _print_privacy_and_paths(demo.outcome.summary, demo.paths)
    return 0


def run(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.decode.errors import DecodeError
    from crowdmix.aggregator.errors import StoreError
    from crowdmix.cli import CliError
    from crowdmix.client.errors import TransportError
    from crowdmix.options import out_dir
    from crowdmix.shuffler.errors import ShufflerError

    out_dir(args.out)  # before the work, not after it
    if args.encoding == "shuffled-histogram":
        return _run_histogram(args)
    try:
        demo = run_demo(args)
    except (ValueError, RuntimeError, DecodeError, StoreError, ShufflerError) as exc:
        raise CliError(str(exc)) from None
    except TransportError as exc:
        raise CliError(f"the shuffler refused the reports: {exc}") from None
    result = demo.outcome.result
    print()
    print(_table(demo, args.top))
    print()
    print(
        f"detected {result.detected} of {len(result.values)} candidates "
        f"({args.decoys} of them decoys nobody holds); allocated mass {result.allocated_mass:.3f}; "
        f"total variation distance to the truth {demo.total_variation:.3f}"
    )
    _print_privacy_and_paths(demo.outcome.summary, demo.paths)
    return 0
