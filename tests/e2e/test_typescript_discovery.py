"""Heavy hitters from TypeScript devices, through the real pipeline, over three windows.

As tests/e2e/test_discovery_pipeline.py, with Node processes of the TypeScript SDK as
the devices (tests/e2e/typescript_devices.mjs): redis-servers, the shuffler (its HTTP
port, the Connect protocol, serving the round file) and the aggregator on real sockets,
in this process so the test moves their clock past each window; the devices' wall clock
starts at the daemons'. Each device's secret file and encoder coins (a BLAKE2b byte
stream, ``TsCoins``, the one typescript_devices.mjs reads) come from ``SEED``, so each
round's count and the value round's table equal what the Python encoders compute in
memory with the same secrets and bytes: the two SDKs encode the same reports. The
planted values are found for ``SEED`` (every run: seeded, no flake).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from crowdmix.aggregator.daemon.server import start_aggregator
from crowdmix.aggregator.discovery.pipeline import open_discovery, step_discovery
from crowdmix.aggregator.store import load_batch_sizes, open_store
from crowdmix.core.registry import parse_registry
from crowdmix.demo import demo_redis_urls
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.redis_store import RedisStore
from crowdmix.shuffler.server import start_shuffler
from tests.e2e import test_discovery_pipeline as seeded
from tests.shuffler.helpers import write_keys
from tests.typescript import built_sdk, node
from tests.waiting import eventually

pytestmark = pytest.mark.slow  # real servers and Node processes

HOUR, METRIC, SEED = seeded.HOUR, seeded.METRIC, seeded.SEED
DEVICES_JS = Path(__file__).with_name("typescript_devices.mjs")
COINS = "crowdmix e2e coins"


class TsCoins:
    """Device i's coins as typescript_devices.mjs draws them: the bytes BLAKE2b-512 of
    "<prefix> <i> 0", "<prefix> <i> 1", ..., read as ``SecureBits`` reads the OS stream
    (``random_bits(n)``: the next ceil(n/8) bytes, little-endian, the low n bits)."""

    def __init__(self, seed: int, i: int) -> None:
        self._prefix, self._block, self._buf = f"{COINS} {seed} {i}", 0, b""

    def random_bits(self, nbits: int) -> int:
        n = (nbits + 7) // 8
        while len(self._buf) < n:
            self._buf += hashlib.blake2b(f"{self._prefix} {self._block}".encode()).digest()
            self._block += 1
        chunk, self._buf = self._buf[:n], self._buf[n:]
        return int.from_bytes(chunk, "little") & ((1 << nbits) - 1)


def _run_devices(base: Path, url: str, now: float, values: list[str]) -> dict[str, Any]:
    base.mkdir(exist_ok=True)
    job = base / "job.json"
    job.write_text(
        json.dumps({
            "url": url, "base": str(base), "devices": len(values), "values": values,
            "reports": [[METRIC, "$v"]], "coins": f"{COINS} {SEED}", "now": now,
            "flushMs": 20000,
        })
    )  # fmt: skip
    proc = subprocess.run(
        [node(), str(DEVICES_JS), str(job)], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr
    summary: dict[str, Any] = json.loads(proc.stdout)
    assert summary["queued"] == 0 and not summary["errors"], summary
    return summary


def test_typescript_devices_run_a_discovery_that_equals_the_python_encoders(
    tmp_path: Path, redis_url: str
) -> None:
    built_sdk()
    registry = parse_registry(seeded._registry_dict())
    metric = registry[METRIC]
    shuffler_url, aggregator_url = demo_redis_urls(redis_url)
    values = seeded._values(np.random.default_rng(SEED))
    base = tmp_path / "devices"
    base.mkdir()
    for i in range(len(values)):  # the seeded secrets, which openReporter reads
        d = base / f"device-{i}"
        d.mkdir(mode=0o700)
        (d / "secret").write_bytes(seeded._secret(SEED, i))
    start = seeded.START
    now = [start * HOUR + HOUR / 2]
    _, keys_file, public = write_keys(tmp_path, int(now[0]), valid_from=int(now[0]) - HOUR)
    counts = open_store(aggregator_url)
    rounds_file, state_file = tmp_path / "rounds.json", tmp_path / "state.json"
    aggregator = start_aggregator(
        registry, counts, listen="127.0.0.1:0", clock=lambda: now[0], keys_file=str(keys_file),
        rounds_file=str(rounds_file),
    )  # fmt: skip
    shuffler = start_shuffler(
        registry,
        RedisStore(shuffler_url),
        f"127.0.0.1:{aggregator.port}",
        settings=ShufflerSettings(
            rounds_file=str(rounds_file), public_keys=str(public), http_port=0
        ),
        clock=lambda: now[0],
        owns_store=True,
    )
    url = f"http://127.0.0.1:{shuffler.http_port}"
    made, result = [], None
    try:
        # before any round is served a Node device makes nothing, and says why
        early = _run_devices(tmp_path / "early", url, now[0], ["apple"])
        assert early["statuses"] == {METRIC: {"no_round": 1}}, early
        served = open_discovery(registry, metric, rounds_file=rounds_file,
                                state_file=state_file, now=now[0], window=start)  # fmt: skip
        for r in range(3):
            window = served.window
            assert served.round == r
            now[0] = window * HOUR + HOUR / 2
            time.sleep(1.1)  # the shuffler re-reads the round file at most once a second
            summary = _run_devices(base, url, now[0], values)
            claimed = summary["claimed"].get(METRIC, 0)
            assert summary["statuses"][METRIC] == (
                {"claimed": claimed, "not_this_round": len(values) - claimed}
            ), summary  # every other device is in another round
            made.append(claimed)
            now[0] = (window + 2) * HOUR + seeded.GRACE + 1.0  # closed, and its grace is over
            assert eventually(
                lambda w=window, c=claimed: load_batch_sizes(counts, METRIC, [w]) == [c]
            )
            job_store = open_store(aggregator_url)
            try:
                result = step_discovery(registry, metric, job_store, rounds_file=rounds_file,
                                        state_file=state_file, now=now[0])  # fmt: skip
            finally:
                job_store.close()
            assert (result.round, result.window, result.reports) == (r, window, claimed)
            assert result.outside == 0  # every index within its round's cells
            if r < 2:
                assert result.served is not None
                served = result.served
    finally:
        shuffler.stop()
        aggregator.stop()
        counts.close()
    # the Python encoders, fed the same secrets and coins, make the same reports
    expected_made, expected = seeded._in_memory(metric, SEED, TsCoins)
    assert made == expected_made and sum(made) == len(values)
    assert result is not None and result.table is not None and expected.table is not None
    assert result.table.values == expected.table.values
    np.testing.assert_allclose(result.table.share, expected.table.share, rtol=1e-12)
    assert set(seeded.PLANTED) <= set(result.table.top(10))
