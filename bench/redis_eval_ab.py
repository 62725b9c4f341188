"""The event loop's script call, an old commit's ``shuffler/redis_async.py`` against this one.

    .venv/bin/python bench/redis_eval_ab.py [--old a6a5ae0] [--evals 3000] [--rounds 3]

A private redis-server (no persistence) on loopback; each round, the old module then the
new one make ``--evals`` calls of an RPUSH script with a 32 kB blob on one connection.
Printed per round: wall time and client CPU time per call.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from crowdmix.cluster import RedisServer
from crowdmix.shuffler.redis_async import AsyncScriptConnection

ROOT = Path(__file__).resolve().parents[1]

SCRIPT = "redis.call('RPUSH', KEYS[1], ARGV[1]) return 1"
BLOB = b"x" * 32_000


def old_class(commit: str) -> Any:
    source = subprocess.run(
        ["git", "show", f"{commit}:shuffler/redis_async.py"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    path = Path(tempfile.mkdtemp()) / "old_redis_async.py"
    path.write_bytes(source)
    spec = importlib.util.spec_from_file_location("old_redis_async", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.AsyncScriptConnection


async def run(cls: Any, url: str, n: int) -> tuple[float, float]:
    connection = cls(url)
    await connection.eval(SCRIPT, [b"k"], [BLOB])
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(n):
        await connection.eval(SCRIPT, [b"k"], [BLOB])
    out = (time.perf_counter() - wall) / n, (time.process_time() - cpu) / n
    await connection.aclose()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", default="a6a5ae0")
    ap.add_argument("--evals", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    server = RedisServer(appendonly=False)
    server.start()
    try:
        for _ in range(args.rounds):
            for name, cls in (("old", old_class(args.old)), ("new", AsyncScriptConnection)):
                wall, cpu = asyncio.run(run(cls, server.url, args.evals))
                print(f"{name}: wall {wall * 1e6:.0f} us, client CPU {cpu * 1e6:.1f} us per eval")
    finally:
        server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
