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
