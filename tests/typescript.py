"""The TypeScript SDK for the Python end-to-end tests: built once per session from the
lockfile (``npm ci`` when its node_modules is missing, then ``npm run build``)."""

from __future__ import annotations

import fcntl
import functools
import shutil
import subprocess
from pathlib import Path

__all__ = ["SDK_DIR", "built_sdk", "node"]

SDK_DIR = Path(__file__).resolve().parent.parent / "sdk" / "typescript"


def node() -> str:
    path = shutil.which("node")
    if path is None:
        raise AssertionError("these tests need Node.js >= 20 (apt-get install nodejs npm)")
    return path


@functools.cache
def built_sdk() -> Path:
    """The SDK's directory, with dist/ freshly built (once per test process; parallel
    workers take turns through a lock file, so none reads a half-written bundle)."""
    npm = shutil.which("npm")
    if npm is None:
        raise AssertionError("these tests need npm (apt-get install npm)")
    with open(SDK_DIR / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (SDK_DIR / "node_modules" / "@hpke" / "core").exists():
            subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SDK_DIR, check=True)
        subprocess.run([node(), "scripts/build.mjs"], cwd=SDK_DIR, check=True)
    return SDK_DIR
