"""A daemon whose store is down says so: ``crowdmix health`` answers NOT_SERVING
(exit 1) while its real Redis is stopped and SERVING again once it is back, and the
log holds one line when the outage starts and one when it ends, not one per attempt.
Also the log format for collectors (``--log-format json``)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from crowdmix.cluster import DaemonProcess, RedisServer, free_port
from crowdmix.health import check_health
from tests.service.helpers import write_registry

pytestmark = pytest.mark.slow  # real processes and a Redis stopped and started

ROOT = Path(__file__).resolve().parents[2]


def _wait_for(target: str, status: str, d: DaemonProcess, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < deadline:
        assert d.alive(), d.tail_log()
        seen = check_health(target, timeout=1.0)
        if seen == status:
            return
        time.sleep(0.1)
    raise AssertionError(f"{d.name} answered {seen}, not {status}:\n{d.tail_log()}")


def _health_cli(target: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "crowdmix", "health", target],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def _daemon(kind: str, tmp_path: Path, redis: RedisServer, *extra: str) -> DaemonProcess:
    config, _ = write_registry(tmp_path)
    port = free_port()
    args = [kind, "serve", "--config", str(config), "--redis", redis.url]
    args += ["--listen", f"127.0.0.1:{port}", *extra]
    if kind == "shuffler":  # forwarding to nobody: its release loop reaches Redis 20 times a second
        args += ["--allow-unauthenticated", "--aggregator", f"127.0.0.1:{free_port()}"]
    return DaemonProcess(kind, args, port, tmp_path / f"{kind}.log")


@pytest.mark.parametrize("kind", ["shuffler", "aggregator"])
def test_health_is_not_serving_while_the_store_is_down_and_serving_after(
    kind: str, tmp_path: Path, private_redis: RedisServer
) -> None:
    d = _daemon(kind, tmp_path, private_redis)
    d.start()
    try:
        d.wait_healthy(60)
        private_redis.stop()  # a clean SHUTDOWN: connections refused from now on
        _wait_for(d.target, "NOT_SERVING", d)
        down = _health_cli(d.target)
        assert down.returncode == 1 and "NOT_SERVING" in down.stdout, down
        time.sleep(3)  # the outage lasts: some 60 release passes and 3 health pings fail
        private_redis.start()  # the same port
        _wait_for(d.target, "SERVING", d)
        assert _health_cli(d.target).returncode == 0
        assert d.stop() == 0
        log = d.log_path.read_text()
        failing = [line for line in log.splitlines() if " failing" in line]
        recovered = [line for line in log.splitlines() if "recovered after" in line]
        # one line per kind of failure (health, and the shuffler's release loop) when it
        # starts, one when it ends; none per attempt
        assert 1 <= len(failing) <= 3 and len(recovered) == len(failing), log
        assert all("WARNING" in line for line in failing)
        if kind == "shuffler":  # started without public keys: it says so, loudly
            assert any("WARNING" in ln and "no --public-keys" in ln for ln in log.splitlines())
    finally:
        d.kill()


def test_json_logs_are_one_object_a_line(tmp_path: Path, private_redis: RedisServer) -> None:
    d = _daemon("aggregator", tmp_path, private_redis, "--log-format", "json")
    d.start()
    try:
        d.wait_healthy(60)
        assert d.stop() == 0
    finally:
        d.kill()
    records = [json.loads(line) for line in d.log_path.read_text().splitlines() if line]
    assert records and {"time", "component", "level", "logger", "message"} <= set(records[0])
    assert any(r["message"] == "aggregator stopped" for r in records)
    assert {r["component"] for r in records} == {"aggregator"}
