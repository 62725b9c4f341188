"""Heavy hitters without a candidate list, through the real pipeline, over several windows.

Real components: redis-servers (the shuffler's store, and the aggregator's counts in
another database that the round job reads), the shuffler and the aggregator on real
gRPC (in this process, so the test moves their clock past each window instead of
waiting an hour), devices that are ``client.Reporter`` instances. Each window serves
one round of the discovery (GetConfig); each device reports in the one round its secret
draws, encoded against that window's round; the shuffler releases the window whole; the
round job decodes it from the aggregator's Redis, records it in a ledger and serves the
next round; after the value round the planted values are found, with the privacy
statement the ledger also holds. Not seeded (the devices' coins and secrets are the
CSPRNG's): 4 of 2000 simulated runs of this plan and population (``job.simulate``) miss
a planted value, so the false-failure probability is about 0.2%.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from crowdmix import client
from crowdmix.aggregator.accounting import JsonFileLedgerStore, PrivacyLedger
from crowdmix.aggregator.daemon.server import start_aggregator
from crowdmix.aggregator.discovery.pipeline import (
    DiscoveryError,
    open_discovery,
    step_discovery,
)
from crowdmix.aggregator.sealing.keys import KeySet, save_keyset, write_public_config
from crowdmix.aggregator.store import load_batch_sizes, open_store
from crowdmix.core.registry import parse_registry
from crowdmix.demo import demo_redis_urls
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.redis_store import RedisStore
from crowdmix.shuffler.server import start_shuffler

pytestmark = pytest.mark.slow  # real servers, seconds

HOUR = 3600
GRACE = 60.0
METRIC = "words"
ALPHABET = "abcehlnpry"
PLANTED = {"apple": 0.40, "banana": 0.30, "cherry": 0.20}  # the rest: one-off strings
DEVICES = 300
EPSILON = 9.5  # central target over groups of ~100: no amplification, each ε0 is 9.5


def _registry_dict() -> dict[str, object]:
    return {
        "metrics": {
            METRIC: {
                "encoding": "heavy-hitters",
                "alphabet": ALPHABET,
                "max_length": 6,
                "spans": [3, 7],
                "keep": 20,
                "candidates": 10,
                "seeds": 16,
                "weights": [1 / 3, 1 / 3, 1 / 3],
                "epsilon": EPSILON,
                "delta": 1e-6,
                "devices": DEVICES,
                "shuffle": {"min_batch": 50, "release_grace_seconds": GRACE},  # of ~100
            }
        },
        "collection": {"window_seconds": HOUR},
    }


def _values(rng: np.random.Generator) -> list[str]:
    out: list[str] = []
    for value, share in PLANTED.items():
        out += [value] * round(share * DEVICES)
    while len(out) < DEVICES:  # one-off values nobody else holds
        out.append("".join(rng.choice(list(ALPHABET), size=5)))
    return out


def _wait(cond: object, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sealing", ["required", "off"])
def test_a_discovery_over_three_windows_finds_the_planted_values(
    tmp_path: Path, redis_url: str, sealing: Literal["required", "off"]
) -> None:
    registry = parse_registry(_registry_dict())
    metric = registry[METRIC]
    shuffler_url, aggregator_url = demo_redis_urls(redis_url)
    values = _values(np.random.default_rng(5))
    start = registry.window_of(time.time())
    now = [start * HOUR + HOUR / 2]  # the daemons' and the devices' clock
    counts = open_store(aggregator_url)
    keys_file = public = None
    if sealing == "required":  # the SDK's default: reports sealed to the aggregator's key
        t = int(time.time())
        keys, _ = KeySet().with_new_key(t - HOUR)
        keys_file, public = tmp_path / "keys.json", tmp_path / "public.json"
        save_keyset(keys_file, keys, now=t, create=True)
        write_public_config(public, keys, now=t)
    aggregator = start_aggregator(
        registry,
        counts,
        listen="127.0.0.1:0",
        clock=lambda: now[0],
        keys_file=None if keys_file is None else str(keys_file),
    )
    rounds_file, state_file = tmp_path / "rounds.json", tmp_path / "state.json"
    shuffler = start_shuffler(
        registry,
        RedisStore(shuffler_url),
        f"127.0.0.1:{aggregator.port}",
        settings=ShufflerSettings(
            rounds_file=str(rounds_file), public_keys=None if public is None else str(public)
        ),
        clock=lambda: now[0],
        owns_store=True,
    )
    ledger = PrivacyLedger(JsonFileLedgerStore(tmp_path / "ledger.json", create=True))
    target = f"127.0.0.1:{shuffler.port}"
    devices: list[client.Reporter] = []
    try:
        # before any round is served, a device makes nothing and says why
        with client.Reporter(tmp_path / "early", target, tls=False, sealing=sealing,
                             background=False, clock=lambda: now[0]) as early:  # fmt: skip
            assert early.flush(timeout=20) == 0  # the config is fetched
            refused = early.report(METRIC, "apple")
            assert refused.status is client.ReportStatus.NO_ROUND and early.queued == 0
        served = open_discovery(
            registry, metric, rounds_file=rounds_file, state_file=state_file, now=now[0],
            window=start,
        )  # fmt: skip
        devices = [
            client.Reporter(tmp_path / f"dev{i}", target, tls=False, sealing=sealing,
                            background=False, clock=lambda: now[0])
            for i in range(DEVICES)
        ]  # fmt: skip
        made = []
        result = None
        for r in range(3):
            window = served.window
            assert served.round == r
            now[0] = window * HOUR + HOUR / 2
            time.sleep(1.1)  # the shuffler re-reads the round file at most once a second
            claimed = 0
            for dev, value in zip(devices, values, strict=True):
                assert dev.flush(timeout=20) == 0  # fetches this window's config
                got = dev.report(METRIC, value)
                assert got.status in (
                    client.ReportStatus.CLAIMED,
                    client.ReportStatus.NOT_THIS_ROUND,  # its round is another one
                ), got
                if got:
                    claimed += 1
                    rows = dev._outbox.next_group()
                    assert [x.window for x in rows] == [window]
                    assert len(rows[0].report.bits) == metric.report_bytes
                    assert dev.flush(timeout=20) == 0
            made.append(claimed)
            with pytest.raises(DiscoveryError, match="is not over"):
                step_discovery(registry, metric, counts, rounds_file=rounds_file,
                               state_file=state_file, now=now[0])  # fmt: skip
            now[0] = (window + 2) * HOUR + GRACE + 1.0  # closed, and its grace is over
            assert _wait(lambda w=window, c=claimed: load_batch_sizes(counts, METRIC, [w]) == [c])
            job_store = open_store(aggregator_url)  # the round job's own connection
            try:
                result = step_discovery(
                    registry, metric, job_store, rounds_file=rounds_file,
                    state_file=state_file, now=now[0], ledger=ledger,
                )  # fmt: skip
            finally:
                job_store.close()
            assert (result.round, result.window, result.reports) == (r, window, claimed)
            assert result.outside == 0
            if r < 2:
                assert result.served is not None and result.served.window > window
                served = result.served
    finally:
        for dev in devices:
            dev.close()
        shuffler.stop()
        aggregator.stop()
        counts.close()
    # every device reported once, in one round: the groups are disjoint and cover all
    assert sum(made) == DEVICES and min(made) > 60
    assert result is not None and result.table is not None and result.guarantee is not None
    found = set(result.table.top(10))
    assert set(PLANTED) <= found, found
    for value, share in PLANTED.items():
        i = result.table.values.index(value)
        assert abs(result.table.share[i] - share) < 0.2
    # the ledger holds the three rounds, composed in parallel: the discovery's figure
    releases = ledger.releases(METRIC)
    assert [x.release_id.rsplit("/", 1)[1] for x in releases] == ["round-0", "round-1", "round-2"]
    eps, delta = ledger.spent(METRIC)
    assert (eps, delta) == pytest.approx((result.guarantee.epsilon, result.guarantee.delta))
    assert result.guarantee.argument == "parallel over disjoint groups"
    assert eps <= EPSILON + 1e-9
