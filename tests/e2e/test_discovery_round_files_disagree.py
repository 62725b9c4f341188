"""Two shufflers serving different round files for one window: no report is counted
against a round it was not encoded for, and the device recovers.

Real components: two shufflers sharing one redis-server (as several shufflers may), the
aggregator with the round file the round job wrote (and another database of that
Redis), devices that are ``client.Reporter`` instances. Shuffler A serves the round job's
file; shuffler B an older file whose round 0 of the same window has other params. A
device that fetched its config from A and submits through B is refused
``round_mismatch``, fetches the config again (from B), finds another round in its
window and drops the report (``round_changed``); devices whose config came from B are
taken by B, and the aggregator refuses their batch (clear) or drops each report (sealed)
under ``round``; the round job (the ``crowdmix discover step`` command) decodes the window
from A's devices alone and says how many sealed reports were dropped as another round's.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Literal

import pytest

from crowdmix import client
from crowdmix.aggregator.daemon.server import start_aggregator
from crowdmix.aggregator.discovery.pipeline import open_discovery
from crowdmix.aggregator.store import open_store
from crowdmix.cli import main
from crowdmix.client.discovery import device_round
from crowdmix.core.registry import parse_registry
from crowdmix.core.rounds import RoundBook, read_rounds, write_rounds
from crowdmix.demo import demo_redis_urls
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.redis_store import RedisStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.e2e.test_discovery_pipeline import GRACE, HOUR, METRIC, START, _registry_dict
from tests.shuffler.helpers import write_keys
from tests.waiting import eventually

pytestmark = pytest.mark.slow  # real servers, seconds

A_DEVICES = 4  # report through A, as they fetched from it: counted
B_DEVICES = 2  # fetched from B (its stale round) and report through it: never counted


def _secrets_in_round_0(fingerprint: int, weights: tuple[float, ...], n: int) -> list[bytes]:
    """``n`` device secrets whose device reports in round 0 of the discovery."""
    out: list[bytes] = []
    i = 0
    while len(out) < n:
        s = hashlib.sha256(f"round-files-disagree/{i}".encode()).digest()
        if device_round(s, METRIC, fingerprint, START, weights) == 0:
            out.append(s)
        i += 1
    return out


def _toml(table: dict[str, object], name: str = "") -> list[str]:
    """``table`` as TOML lines (its values are numbers, strings, bools and lists)."""
    values = [f"{k} = {json.dumps(v)}" for k, v in table.items() if not isinstance(v, dict)]
    lines = ([f"[{name}]"] if name and values else []) + values
    for k, v in table.items():
        if isinstance(v, dict):
            lines += _toml(v, f"{name}.{k}" if name else k)
    return lines


def _counter(counter: object, *labels: str) -> float:
    return float(counter.labels(*labels)._value.get())  # type: ignore[attr-defined]


@pytest.mark.parametrize("sealing", ["required", "off"])
def test_a_report_of_another_shufflers_round_is_never_counted_against_this_one(
    tmp_path: Path,
    redis_url: str,
    sealing: Literal["required", "off"],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    data = _registry_dict()
    data["metrics"][METRIC]["shuffle"]["min_batch"] = 2  # type: ignore[index]
    registry = parse_registry(data)
    metric = registry[METRIC]
    assert metric.heavy_hitters is not None
    shuffler_url, aggregator_url = demo_redis_urls(redis_url)
    now = [START * HOUR + HOUR / 2]
    keys_file = public = None
    if sealing == "required":
        t = int(now[0])
        _, keys_file, public = write_keys(tmp_path, t, valid_from=t - HOUR)
    rounds_a, rounds_b = tmp_path / "rounds.json", tmp_path / "rounds-b.json"
    state_file = tmp_path / "state.json"
    served = open_discovery(registry, metric, rounds_file=rounds_a, state_file=state_file,
                            now=now[0], window=START)  # fmt: skip
    # B's file: round 0 of the same window, planned under other params (another ε0)
    stale = replace(served, epsilon=served.epsilon / 2, buckets=0)
    stale = replace(stale, buckets=stale.params(metric.heavy_hitters).buckets)
    write_rounds(rounds_b, RoundBook().with_round(METRIC, metric.fingerprint, stale))
    fp_a = served.fingerprint(metric.fingerprint)
    assert read_rounds(rounds_b).round_fingerprint(METRIC, metric.fingerprint, START) != fp_a

    counts = open_store(aggregator_url)
    aggregator = start_aggregator(
        registry, counts, listen="127.0.0.1:0", clock=lambda: now[0],
        keys_file=None if keys_file is None else str(keys_file), rounds_file=str(rounds_a),
    )  # fmt: skip

    def shuffler(rounds: Path) -> ShufflerHandle:
        return start_shuffler(
            registry, RedisStore(shuffler_url), f"127.0.0.1:{aggregator.port}",
            settings=ShufflerSettings(rounds_file=str(rounds),
                                      public_keys=None if public is None else str(public)),
            clock=lambda: now[0], owns_store=True,
        )  # fmt: skip

    a, b = shuffler(rounds_a), shuffler(rounds_b)
    secrets = _secrets_in_round_0(metric.fingerprint, metric.heavy_hitters.weights,
                                  A_DEVICES + B_DEVICES + 1)  # fmt: skip

    def device(i: int, via: ShufflerHandle) -> client.Reporter:
        d = tmp_path / f"dev{i}"
        d.mkdir(mode=0o700, exist_ok=True)
        (d / "secret").write_bytes(secrets[i])
        return client.Reporter(d, f"127.0.0.1:{via.port}", tls=False, sealing=sealing,
                               background=False, clock=lambda: now[0])  # fmt: skip

    try:
        # A's devices and B's devices, each through the shuffler it fetched from
        for i in range(A_DEVICES + B_DEVICES):
            with device(i, a if i < A_DEVICES else b) as dev:
                assert dev.flush(timeout=20) == 0  # fetches its shuffler's round
                assert dev.report(METRIC, "apple").status is client.ReportStatus.CLAIMED
                assert dev.flush(timeout=20) == 0, dev.last_error  # each takes its own round
        # a device that fetched from A, then reaches B (behind one name, say)
        i = A_DEVICES + B_DEVICES
        with device(i, a) as dev:
            assert dev.flush(timeout=20) == 0
            assert dev.report(METRIC, "apple").status is client.ReportStatus.CLAIMED
            row = dev._outbox.next_group()[0]
            assert row.report.params_fingerprint == fp_a  # bound to A's round
        with device(i, b) as moved:  # the outbox and A's config stored with it carry over
            assert moved.queued == 1
            assert moved.flush(timeout=20) == 0  # refused, refetched from B, dropped
            assert _counter(b.metrics.rejected_requests, "round_mismatch") == 1
            assert moved.counters().get("round_changed") == 1
            assert moved.counters().get("delivered", 0) == 0
            # recovered: nothing waits, and its config is the one B serves
            assert moved.queued == 0 and moved.flush(timeout=5) == 0
            assert moved.report(METRIC, "apple").status is (
                client.ReportStatus.ALREADY_REPORTED_THIS_WINDOW
            )  # one report per window all the same: it may not make another
        # the window closes; both shufflers release what they hold
        now[0] = (START + 2) * HOUR + GRACE + 1.0
        if sealing == "required":  # one sealed queue: B's reports ride in A's batch
            assert eventually(lambda: _counter(aggregator.metrics.sealed_dropped, METRIC, "round")
                         == B_DEVICES)  # fmt: skip
        else:  # B's reports are their own clear queue: its batch is refused
            assert eventually(lambda: _counter(aggregator.metrics.rejected, "round") >= 1)
        assert eventually(lambda: _counter(aggregator.metrics.reports, METRIC) == A_DEVICES)
    finally:
        b.stop()
        a.stop()
        aggregator.stop()
        counts.close()
    config = tmp_path / "metrics.toml"
    config.write_text("\n".join(_toml(data)) + "\n")
    monkeypatch.setattr(time, "time", lambda: now[0])  # the daemons are stopped: only the job
    capsys.readouterr()
    assert main(["discover", "step", "--config", str(config), "--metric", METRIC,
                 "--rounds", str(rounds_a), "--state", str(state_file),
                 "--redis", aggregator_url]) == 0  # fmt: skip
    out = capsys.readouterr().out
    # decoded from A's devices alone: nothing encoded for B's round counted in it
    assert f"round 0 decoded from {A_DEVICES} reports of window {START};" in out
    assert "outside its index range" not in out
    dropped = (
        f"{B_DEVICES} reports of window {START} dropped by the aggregator as naming another round"
    )
    if sealing == "required":  # B's sealed reports rode in A's batch, each dropped: said
        assert dropped in out
    else:  # B's clear batch was refused whole: the shuffler keeps it, nothing was dropped
        assert "dropped" not in out
