"""``crowdmix demo --encoding shuffled-histogram``: shuffled histograms with fake
reports through the real daemons, in one process.

A simulated population (``--clients`` devices, ``--values`` values plus ``--decoys``
nobody holds) reports under parameters given (``--fake-slots``, ``--fake-probability``,
``--local-epsilon``) or planned for ``--target-epsilon`` within ``--max-messages``
(``histogram_release.plan_release``: the stated ε meets the target in all but one run in
10⁹). Each device sends its sealed 1 + Binomial(m, q) reports in one call through
``ShufflerClient`` (``--plaintext`` is refused). The shuffler releases the window in one
batch (``release = "window"``); the demo moves the shuffler's clock past the window's
end and grace period instead of waiting. The aggregator counts each batch once and the
report job decodes and states both figures. The result records what the devices sent
(real and fake), so tests compare the aggregator's counts with it exactly.
"""

from __future__ import annotations

import argparse
import secrets
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable

    from crowdmix.aggregator.report.job import ReportOutcome
    from crowdmix.client.randomness import BitSource
    from crowdmix.core.registry import MetricConfig

__all__ = ["HistogramDemoResult", "add_histogram_options", "run_histogram_demo"]

#: the window's grace period for late writes (the demo's clock jumps over it)
GRACE_SECONDS = 60.0
METRIC = "demo_histogram"
DELTA = 1e-6


def add_histogram_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "shuffled-histogram parameters (--encoding shuffled-histogram; see "
        "`crowdmix privacy histogram`)"
    )
    g.add_argument("--fake-slots", type=int, help="m: fake slots per device (default: planned)")
    g.add_argument(
        "--fake-probability", type=float, help="q: each slot filled w.p. q (default: planned)"
    )
    g.add_argument(
        "--local-epsilon",
        type=float,
        help="k-RR on the real report (default: planned, at most doubling the variance)",
    )
    g.add_argument(
        "--target-epsilon",
        type=float,
        default=1.0,
        help="central ε the planner aims at, δ = 1e-6 (default 1)",
    )
    g.add_argument(
        "--max-messages", type=int, default=8, help="cap on reports per device (default 8)"
    )
    g.add_argument(
        "--senders", type=int, default=4, help="concurrent simulated devices (default 4)"
    )


@dataclass(frozen=True, slots=True)
class HistogramDemoResult:
    outcome: ReportOutcome
    metric: MetricConfig
    truth: dict[str, float]
    total_variation: float
    sent_counts: list[int]  # reports sent per domain value, real and fake alike
    counted_counts: list[int]  # the aggregator's counts per domain value
    acknowledged: int
    paths: dict[str, Path]


def _metric(args: argparse.Namespace, domain: tuple[str, ...]) -> MetricConfig:
    from crowdmix.aggregator.accounting.histogram_release import plan_release
    from crowdmix.core.histogram import HistogramParams
    from crowdmix.core.registry import MetricConfig, ShufflePolicy

    given = (args.fake_slots, args.fake_probability)
    if (given[0] is None) != (given[1] is None):
        raise ValueError("give --fake-slots and --fake-probability together (or neither: planned)")
    if args.fake_slots is not None:
        params = HistogramParams(
            domain_size=len(domain),
            fake_slots=args.fake_slots,
            fake_probability=args.fake_probability,
            local_epsilon=args.local_epsilon,
        )
    else:
        plan, _ = plan_release(  # stated ε ≤ target unless the total is below its 1e-9 quantile
            args.target_epsilon,
            DELTA,
            args.clients,
            len(domain),
            max_messages=args.max_messages,
            local_epsilon="auto" if args.local_epsilon is None else args.local_epsilon,
        )
        params = plan.params
    min_batch = args.min_batch if args.min_batch else max(1, args.clients // 10)
    policy = ShufflePolicy(
        min_batch=min_batch,
        # one batch per window: a real report hides among its batch's fakes
        max_batch=max(min_batch, args.clients * params.max_messages),
        release="window",
        release_grace_seconds=GRACE_SECONDS,
    )
    return MetricConfig(name=METRIC, histogram=params, domain=domain, shuffle=policy)


def _send(
    target: str, token: str, device_reports: list[list[Any]], senders: int, per_call: int
) -> int:
    """Each device's reports in one sealed call; ``senders`` devices at a time."""
    from crowdmix.client.transport import ShufflerClient

    acknowledged = [0] * senders
    errors: list[BaseException] = []

    def run(k: int) -> None:
        try:
            with ShufflerClient(target, token, batch_size=per_call, sealing="required") as sender:
                for reports in device_reports[k::senders]:
                    sender.submit_many(reports)
                    acknowledged[k] += sender.flush()
        except BaseException as exc:  # re-raised in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(k,)) for k in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return sum(acknowledged)


def run_histogram_demo(
    args: argparse.Namespace,
    *,
    quiet: bool = False,
    rand: BitSource | None = None,
    random_bytes: Callable[[int], bytes] | None = None,
) -> HistogramDemoResult:
    """Run the pipeline end to end; ValueError/RuntimeError with a message on failure.

    ``rand`` (the encoder's coins) and ``random_bytes`` (report ids) exist so
    tests can seed a run; unset, both are the OS CSPRNG as on a device.
    """
    import numpy as np

    from crowdmix.aggregator.daemon.server import start_aggregator
    from crowdmix.aggregator.report.job import ReportJob, run_report, write_outputs
    from crowdmix.aggregator.store import load_batch_sizes, load_counts, open_store
    from crowdmix.client.histogram import HistogramEncoder
    from crowdmix.core.registry import Registry
    from crowdmix.demo_support import demo_keys as _demo_keys
    from crowdmix.demo_support import demo_summary as _demo_summary
    from crowdmix.demo_support import say as _say
    from crowdmix.demo_support import total_variation as _total_variation
    from crowdmix.demo_support import wait_for_counts as _wait_for_counts
    from crowdmix.population import draw_population
    from crowdmix.shuffler.config import ShufflerSettings
    from crowdmix.shuffler.memory_store import MemoryStore
    from crowdmix.shuffler.server import start_shuffler

    started = time.perf_counter()
    if getattr(args, "plaintext", False):
        raise ValueError(
            "--plaintext cannot carry a shuffled histogram: in the clear the shuffler would "
            "see each device's true value beside its sender (reports must be sealed)"
        )
    if getattr(args, "redis", None):
        raise ValueError("--redis is not supported with --encoding shuffled-histogram yet")
    for name in ("clients", "values", "top", "senders"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be positive")
    if args.decoys < 0:
        raise ValueError("--decoys must not be negative")
    population = draw_population(args.clients, args.values, args.distribution, seed=args.seed)
    domain = population.values + tuple(f"decoy-{i}" for i in range(1, args.decoys + 1))
    metric = _metric(args, domain)
    params = metric.histogram
    assert params is not None
    _say(
        f"crowdmix demo: {population.size:,} devices, {len(domain)} values "
        f"({args.values} held, {args.decoys} decoys; {args.distribution}), shuffled histogram: "
        f"m={params.fake_slots} fake slots filled w.p. q={params.fake_probability:.4g}, local "
        f"ε={params.local_epsilon if params.local_epsilon is not None else '∞ (none)'}; "
        f"{params.expected_messages:.3f} reports per device on average, "
        f"{params.max_messages} at most",
        quiet,
    )
    encoder = HistogramEncoder(
        params, metric=METRIC, domain=domain, rand=rand, random_bytes=random_bytes
    )
    t0 = time.perf_counter()
    device_reports = [encoder.encode(population.values[i]) for i in population.choice.tolist()]
    sent = np.zeros(len(domain), dtype=np.int64)
    for reports in device_reports:
        for r in reports:
            sent[int.from_bytes(r.bits, "little")] += 1
    _say(f"  encoded on the devices in {time.perf_counter() - t0:.1f}s", quiet)

    registry = Registry(metrics={METRIC: metric})
    token = secrets.token_hex(24)
    shuffler_store = MemoryStore()
    aggregator_store = open_store(None)
    key_dir = _demo_keys()
    aggregator = start_aggregator(
        registry,
        aggregator_store,
        listen="127.0.0.1:0",
        keys_file=str(Path(key_dir.name) / "keys.json"),
    )
    # the shuffler's clock: real time until every device has sent, then moved past
    # the window's end and its grace period, so the window is released now
    shift = [0.0]
    settings = ShufflerSettings(public_keys=str(Path(key_dir.name) / "public.json"))
    # the window can receive no more reports once the shuffler's tolerance for late
    # reports has passed too (a report names its window; the shuffler takes the
    # current window and window_tolerance before it)
    closed = (
        registry.window_of(time.time()) + 1 + settings.window_tolerance
    ) * registry.window_seconds
    try:
        shuffler = start_shuffler(
            registry,
            shuffler_store,
            f"127.0.0.1:{aggregator.port}",
            listen="127.0.0.1:0",
            settings=settings,
            tokens=frozenset({token}),
            clock=lambda: time.time() + shift[0],
        )
    except BaseException:
        aggregator.stop()
        key_dir.cleanup()
        raise
    _say(
        f"  shuffler on 127.0.0.1:{shuffler.port} -> aggregator on 127.0.0.1:{aggregator.port} "
        f"(memory stores, reports sealed to the aggregator, threshold "
        f"{metric.shuffle.min_batch:,}, released when the window closes)",
        quiet,
    )
    try:
        t0 = time.perf_counter()
        acknowledged = _send(
            f"127.0.0.1:{shuffler.port}", token, device_reports, args.senders, params.max_messages
        )
        _say(
            f"  {acknowledged:,} sealed reports acknowledged ({population.size:,} calls, one "
            f"per device) in {time.perf_counter() - t0:.1f}s",
            quiet,
        )
        # the window closes (the demo's clock jumps past the tolerance and the grace): it
        # is released whole, in one batch, if it holds at least the threshold
        shift[0] = closed + GRACE_SECONDS - time.time()
        shuffler.stop()
        pending = sum(shuffler_store.pending(METRIC).values())
        if pending:
            raise RuntimeError(f"{pending:,} reports were held back below the threshold")
        counted = _wait_for_counts(aggregator_store, METRIC, acknowledged, timeout=120.0)
        if counted != acknowledged:
            raise RuntimeError(
                f"the aggregator counted {counted:,} reports, expected {acknowledged:,}"
            )
        counts = load_counts(aggregator_store, metric)
        batch_sizes = tuple(load_batch_sizes(aggregator_store, METRIC))
        from crowdmix.options import plural

        batches = plural(len(batch_sizes), "batch", "batches")
        _say(f"  the aggregator counted {plural(counted, 'report')} in {batches}", quiet)
        outcome = run_report(
            ReportJob(
                metric=metric,
                totals=counts.totals,
                ones=counts.ones,
                source="demo (memory store)",
                batch_sizes=batch_sizes,
                sealed=True,
                duplicate_reports=aggregator_store.duplicate_reports(METRIC),
            )
        )
    finally:
        shuffler.stop()
        aggregator.stop()
        key_dir.cleanup()

    truth = population.true_frequencies()
    result = outcome.result
    dist = result.distribution if result.distribution is not None else result.proportion
    share = {v: float(dist[i]) for i, v in enumerate(result.values)}
    tv = _total_variation(share, truth)
    outcome.summary["demo"] = {
        **_demo_summary(
            args,
            population,
            acknowledged=acknowledged,
            counted=counted,
            held_back=0,
            sealed=True,
            total_variation=tv,
            truth=truth,
        ),
        "sent_per_value": sent.tolist(),
        "elapsed_seconds": time.perf_counter() - started,
    }
    out = Path(args.out)
    paths = write_outputs(outcome, out, plot=True, top=args.top)
    return HistogramDemoResult(
        outcome=outcome,
        metric=metric,
        truth=truth,
        total_variation=tv,
        sent_counts=sent.tolist(),
        counted_counts=[int(x) for x in counts.ones[0]],
        acknowledged=acknowledged,
        paths=paths,
    )
