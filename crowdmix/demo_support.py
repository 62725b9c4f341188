"""Helpers the RAPPOR and the shuffled-histogram demos share (no demo imports the other)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

__all__ = ["demo_keys", "say", "wait_for_counts"]


def say(msg: str, quiet: bool) -> None:
    if not quiet:
        print(msg, flush=True)


def wait_for_counts(aggregator_store: Any, metric: str, expected: int, timeout: float) -> int:
    """Poll the aggregator's store until ``expected`` reports are counted (or time runs out)."""
    from aggregator.store import load_counts

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

    from aggregator.sealing.keys import KeySet, save_keyset, write_public_config

    tmp = tempfile.TemporaryDirectory(prefix="crowdmix-demo-keys-")
    now = int(time.time())
    keys, _ = KeySet().with_new_key(now)
    save_keyset(Path(tmp.name) / "keys.json", keys, now=now, create=True)
    write_public_config(Path(tmp.name) / "public.json", keys, now=now)
    return tmp
