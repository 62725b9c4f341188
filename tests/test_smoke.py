"""The package installs, the command answers, and the test Redis starts."""

from __future__ import annotations

import subprocess
import sys

import redis

from crowdmix import __version__


def test_version_and_help() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "crowdmix", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"crowdmix {__version__}"
    out = subprocess.run(
        [sys.executable, "-m", "crowdmix", "--help"], capture_output=True, text=True, check=True
    )
    assert "COMMAND" in out.stdout


def test_private_redis_answers(redis_url: str) -> None:
    r = redis.Redis.from_url(redis_url)
    r.set("k", b"v")
    assert r.get("k") == b"v"
    assert int(r.config_get("port")["port"]) != 6379


def test_a_closed_pipe_is_not_a_traceback(tmp_path: object) -> None:
    out = subprocess.run(
        f"'{sys.executable}' -m crowdmix demo --clients 5000 --out '{tmp_path}' | head -1",
        shell=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.stdout.startswith("crowdmix demo:")
    assert "Traceback" not in out.stderr and "BrokenPipe" not in out.stderr
