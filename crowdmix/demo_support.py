"""Helpers the RAPPOR and the shuffled-histogram demos share (no demo imports the other)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from crowdmix.population import Population

__all__ = [
    "demo_keys",
    "demo_summary",
    "print_privacy_and_paths",
    "say",
    "total_variation",
    "wait_for_counts",
]


def total_variation(estimate: dict[str, float], truth: dict[str, float]) -> float:
    """The total variation distance between the estimated and the true shares,
    ½ Σ_v |estimate(v) − truth(v)| (a value missing on one side counts as 0 there)."""
    return 0.5 * sum(
        abs(estimate.get(v, 0.0) - truth.get(v, 0.0)) for v in set(estimate) | set(truth)
    )


def demo_summary(
    args: argparse.Namespace,
    population: Population,
    *,
    acknowledged: int,
    counted: int,
    held_back: int,
    sealed: bool,
    total_variation: float,
    truth: dict[str, float],
) -> dict[str, Any]:
    """The start of summary.json's "demo" section, the same in every demo: the
    population asked for and drawn, what the shuffler took and the aggregator counted,
    and the distance to the truth."""
    return {
        "clients": population.size,
        "distribution": args.distribution,
        "values": args.values,
        "decoys": args.decoys,
        "acknowledged": acknowledged,
        "counted": counted,
        "held_back": held_back,
        "sealed": sealed,
        "total_variation": total_variation,
        "truth": truth,
    }


def print_privacy_and_paths(summary: dict[str, Any], paths: dict[str, Path]) -> None:
    """The end of a demo's output: the privacy statement, if any, and the files written."""
    text = summary.get("privacy", {}).get("text")
    if text:
        print()
        print("Privacy:")
        for line in str(text).splitlines():
            print(f"  {line}")
    print()
    print("wrote " + ", ".join(str(p) for p in paths.values()))


def say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, flush=True)


def wait_for_counts(aggregator_store: Any, metric: str, expected: int, timeout: float) -> int:
    """Poll the aggregator's store until ``expected`` reports are counted (or time runs out)."""
    from crowdmix.aggregator.store import load_counts

    deadline = time.monotonic() + timeout
    counted = 0
    while time.monotonic() < deadline:
        try:
            counted = int(load_counts(aggregator_store, metric).totals.sum())
        except LookupError:
            counted = 0
        if counted >= expected:
            break
        time.sleep(0.1)
    return counted


def demo_keys() -> Any:
    """A temporary directory with a fresh key set (keys.json, 0600: the aggregator's)
    and its public config (public.json: all the shuffler gets)."""
    import tempfile

    from crowdmix.aggregator.sealing.keys import KeySet, save_keyset, write_public_config

    tmp = tempfile.TemporaryDirectory(prefix="crowdmix-demo-keys-")
    now = int(time.time())
    keys, _ = KeySet().with_new_key(now)
    save_keyset(Path(tmp.name) / "keys.json", keys, now=now, create=True)
    write_public_config(Path(tmp.name) / "public.json", keys, now=now)
    return tmp
