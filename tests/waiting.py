"""Waiting in a test for what another thread or process makes true."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["eventually"]


def eventually(cond: Callable[[], object], timeout: float = 30.0, step: float = 0.05) -> bool:
    """Whether ``cond()`` came true within ``timeout`` seconds, asked every ``step``."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= deadline:
            return False
        time.sleep(step)
    return True
