"""``crowdmix simulate``: play N clients against a running shuffler.

Each simulated client is what a real device would be: its own secret (fresh
from the OS CSPRNG — ``--seed`` fixes only which value each client holds), the
cohort that secret implies, the real SDK encoder, and the real transport.
``--mode unary`` sends one report per call from ``--concurrency`` threads
(device-style); ``--mode batched`` sends ``--batch-size`` reports per request.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

if TYPE_CHECKING:
    from crowdmix.client.report import Report
    from crowdmix.core.registry import MetricConfig

__all__ = [
    "SimulationResult",
    "encode_population",
    "progress_bar",
    "register",
    "send_batched",
    "simulate",
]


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="play N simulated clients against a running shuffler",
        description="Each client has its own secret and cohort and reports one value through "
        "the real client SDK and transport.",
    )
    p.add_argument("--target", required=True, metavar="HOST:PORT", help="the shuffler")
    p.add_argument("--config", required=True, metavar="FILE", help="metric registry TOML")
    p.add_argument("--metric", required=True, help="metric name in the registry")
    p.add_argument("--token", help="bearer token (or --token-file)")
    p.add_argument("--token-file", metavar="FILE", help="file whose last token is used")
    p.add_argument("--tls-ca", metavar="FILE", help="CA certificate: speak TLS to the shuffler")
    p.add_argument(
        "--plaintext",
        action="store_true",
        help="send clear reports, to a shuffler without keys (default: sealed to the "
        "aggregator's key, as every sender; a shuffler without keys then gets nothing)",
    )
    p.add_argument("--clients", type=int, default=10_000, help="simulated clients (default 10000)")
    p.add_argument("--values", type=int, default=100, help="distinct values v1..vN (default 100)")
    p.add_argument(
        "--distribution",
        default="zipf1.5",
        help="zipf1 | zipf1.5 | exp | gauss | unif (default zipf1.5)",
    )
    p.add_argument("--seed", type=int, help="fix which value each client holds (not secrets)")
    p.add_argument("--mode", choices=["batched", "unary"], default="batched")
    p.add_argument("--batch-size", type=int, default=1000, help="reports per request (batched)")
    p.add_argument("--concurrency", type=int, default=16, help="sender threads (unary)")
    p.add_argument("--truth-out", metavar="FILE", help="write true value counts as CSV")
    p.set_defaults(func=run)


@dataclass(frozen=True, slots=True)
class SimulationResult:
    clients: int
    acknowledged: int
    failed: int
    dropped: int
    seconds: float
    true_counts: dict[str, int]
    reports: int = 0  # encoded (clients, or more: a shuffled histogram's fakes)

    @property
    def rate(self) -> float:
        return self.acknowledged / self.seconds if self.seconds > 0 else 0.0


def encode_population(metric: MetricConfig, values: list[str]) -> list[Report]:
    """One report per client holding ``values[i]``, each client with a fresh secret
    (a shuffled histogram: each client's real and fake reports, one after the other;
    the SDK's transport sends at most one client's worth, 1 + m, per call)."""
    from crowdmix.client.basic import BasicEncoder
    from crowdmix.client.histogram import HistogramEncoder
    from crowdmix.client.rappor import RapporEncoder

    if metric.rappor is not None:
        params, hashing = metric.rappor, metric.hashing
        return [
            RapporEncoder(
                params, secret=os.urandom(32), metric=metric.name, hashing=hashing
            ).encode(v)
            for v in values
        ]
    if metric.histogram is not None:
        henc = HistogramEncoder(metric.histogram, metric=metric.name, domain=metric.domain)
        named = metric.domain is not None
        return [r for v in values for r in henc.encode(v if named else int(v))]
    if metric.basic is None:  # heavy hitters: encoded per window against a served round
        raise ValueError(
            f"metric {metric.name!r} is a heavy-hitters metric: use `crowdmix discover "
            "simulate` or `crowdmix discover demo`"
        )
    enc = BasicEncoder(metric.basic, metric=metric.name, domain=metric.domain)
    if metric.domain is not None:
        return [enc.encode(v) for v in values]
    return [enc.encode(int(v)) for v in values]


def _population_values(
    metric: MetricConfig, clients: int, num_values: int, dist: str, seed: int | None
) -> list[str]:
    from crowdmix.population import draw_population

    if metric.domain_size is not None:
        num_values = metric.domain_size
    pop = draw_population(clients, num_values=num_values, distribution=dist, seed=seed)
    if metric.domain_size is not None:
        names = metric.domain if metric.domain is not None else [str(i) for i in range(num_values)]
        return [names[i] for i in pop.choice]
    return [pop.values[i] for i in pop.choice]


def simulate(
    target: str,
    metric: MetricConfig,
    *,
    clients: int,
    num_values: int = 100,
    distribution: str = "zipf1.5",
    seed: int | None = None,
    mode: str = "batched",
    batch_size: int = 1000,
    concurrency: int = 16,
    token: str | None = None,
    root_certificates: bytes | None = None,
    progress: bool = False,
    sealing: Literal["required", "off"] = "required",
) -> SimulationResult:
    """Encode ``clients`` clients' values and deliver them; returns what was acknowledged."""
    from collections import Counter

    from crowdmix.client.errors import TransportError
    from crowdmix.client.transport import ShufflerClient

    if clients < 1:
        raise ValueError(f"clients must be positive, got {clients}")
    if metric.histogram is not None and mode == "unary":
        # one report per call from many threads scatters a device's real and fake reports
        # among other devices' in the store: the release statement's crowd bound (whole
        # devices in a batch, aggregator.accounting.histogram_release) assumes one call each
        raise ValueError(
            f"metric {metric.name!r} is a shuffled histogram: a device sends its reports in "
            "one call, so --mode unary (one report per call) is refused; use --mode batched"
        )
    values = _population_values(metric, clients, num_values, distribution, seed)
    reports = encode_population(metric, values)
    start = time.perf_counter()
    tls = root_certificates is not None
    acked = failed = dropped = 0
    if mode == "batched":
        acked, failed, dropped = send_batched(
            target,
            reports,
            token=token,
            batch_size=batch_size,
            root_certificates=root_certificates,
            progress=("sending", sys.stderr) if progress else None,
            sealing=sealing,
        )
    elif mode == "unary":
        lock = threading.Lock()
        totals = [0, 0, 0]
        chunks = [reports[i::concurrency] for i in range(max(1, concurrency))]
        stop = threading.Event()  # Ctrl-C: the senders finish their call and stop
        sent = [0]

        refused: list[TransportError] = []  # the first ends the run as batched mode's does

        def worker(mine: list[Report]) -> None:
            try:
                with ShufflerClient(
                    target,
                    token,
                    tls=tls,
                    root_certificates=root_certificates,
                    batch_size=1,
                    columnar_threshold=2,
                    sealing=sealing,
                ) as sender:
                    try:
                        for r in mine:
                            if stop.is_set():
                                break
                            sender.submit(r)
                            sender.flush()
                            with lock:
                                sent[0] += 1
                    finally:
                        with lock:
                            totals[0] += sender.sent
                            totals[1] += sender.failed
                            totals[2] += sender.dropped
            except TransportError as exc:
                with lock:
                    refused.append(exc)
                stop.set()

        threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in chunks if c]
        try:
            for t in threads:
                t.start()
            # join in short steps: the main thread must stay free to take Ctrl-C
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(0.2)
                if progress:
                    progress_bar("sending", min(sent[0], clients), clients, sys.stderr, final=False)
        except KeyboardInterrupt:
            # The senders stop before their next report. One inside a call is not waited
            # for beyond a short grace shared by all of them: a call and its retries last
            # up to a minute against a slow shuffler, the threads are daemons, and nothing
            # they would count is printed after an interrupt. (A grace per thread made
            # Ctrl-C take 5 s times --concurrency.)
            stop.set()
            grace_ends = time.monotonic() + 1.0
            for t in threads:
                if t.is_alive():
                    t.join(max(0.0, grace_ends - time.monotonic()))
            raise
        if refused:
            raise refused[0]
        if progress:
            progress_bar("sending", sent[0], clients, sys.stderr)
        acked, failed, dropped = totals
    else:
        raise ValueError(f"mode must be batched or unary, got {mode!r}")
    seconds = time.perf_counter() - start
    return SimulationResult(
        clients=clients,
        acknowledged=acked,
        failed=failed,
        dropped=dropped,
        seconds=seconds,
        true_counts=dict(Counter(values)),
        reports=len(reports),
    )


def send_batched(
    target: str,
    reports: list[Report],
    *,
    token: str | None = None,
    batch_size: int = 1000,
    root_certificates: bytes | None = None,
    progress: tuple[str, TextIO] | None = None,
    sealing: Literal["required", "off"] = "required",
) -> tuple[int, int, int]:
    """Deliver ``reports`` in requests of ``batch_size`` through the SDK transport.

    Returns (acknowledged, failed, dropped); raises TransportError on a refusal.
    ``progress`` is a (label, stream) for a progress bar.
    """
    from crowdmix.client.transport import ShufflerClient

    total = len(reports)
    with ShufflerClient(
        target,
        token,
        tls=root_certificates is not None,
        root_certificates=root_certificates,
        max_queue=max(1, total),
        batch_size=batch_size,
        sealing=sealing,
    ) as sender:
        for i in range(0, total, batch_size):
            sender.submit_many(reports[i : i + batch_size])
            sender.flush()
            step = i // batch_size
            if progress is not None and (step % 20 == 0 or i + batch_size >= total):
                progress_bar(progress[0], min(i + batch_size, total), total, progress[1])
        return sender.sent, sender.failed, sender.dropped


def progress_bar(
    label: str, done: int, total: int, stream: TextIO, *, final: bool | None = None
) -> None:
    """Redraw one ``label [####....] done/total`` line on ``stream``; a newline when done
    (or when ``final``). Draw it only on a terminal: in a log, ``\\r`` is noise."""
    width = 30
    filled = width * done // max(1, total)
    end = "\n" if (done >= total if final is None else final) else ""
    stream.write(f"\r  {label} [{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,}{end}")
    stream.flush()


def run(args: argparse.Namespace) -> int:
    from crowdmix.cli import CliError
    from crowdmix.client.errors import TransportError
    from crowdmix.core.registry import RegistryError, load_registry
    from crowdmix.options import plural, read_input, read_token_file

    try:
        registry = load_registry(args.config)
    except RegistryError as exc:
        raise CliError(str(exc)) from None
    metric = registry.get(args.metric)
    if metric is None:
        raise CliError(f"metric {args.metric!r} is not in {args.config}")
    token = read_token_file(args.token_file) if args.token_file else args.token
    ca = read_input(args.tls_ca, "--tls-ca") if args.tls_ca else None
    for name in ("clients", "values", "batch_size", "concurrency"):
        if getattr(args, name) < 1:
            raise CliError(f"--{name.replace('_', '-')} must be positive")
    if args.truth_out and not Path(args.truth_out).resolve().parent.is_dir():
        raise CliError(f"--truth-out {args.truth_out}: its directory does not exist")
    try:
        result = simulate(
            args.target,
            metric,
            clients=args.clients,
            num_values=args.values,
            distribution=args.distribution,
            seed=args.seed,
            mode=args.mode,
            batch_size=args.batch_size,
            concurrency=args.concurrency,
            token=token,
            root_certificates=ca,
            progress=sys.stderr.isatty(),
            sealing="off" if args.plaintext else "required",
        )
    except (ValueError, TransportError) as exc:
        raise CliError(str(exc)) from None
    except KeyboardInterrupt:
        print("crowdmix: interrupted", file=sys.stderr)
        return 130
    print(
        f"simulated {plural(result.clients, 'client')} of {metric.name!r} "
        f"({plural(result.reports, 'report')}): "
        f"{result.acknowledged} acknowledged, {result.failed} failed, {result.dropped} dropped "
        f"in {result.seconds:.2f}s ({result.rate:,.0f} reports/s)"
    )
    if args.truth_out:
        with open(args.truth_out, "w") as fh:
            fh.write("value,count\n")
            for v, c in sorted(result.true_counts.items(), key=lambda kv: -kv[1]):
                fh.write(f"{v},{c}\n")
    return 0 if result.failed == 0 and result.acknowledged == result.reports else 1
