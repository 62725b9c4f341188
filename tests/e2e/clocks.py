"""Injected clocks for the window tests: one true time, a device and a shuffler that may
read it differently, and a reporter and shuffler on loopback that use them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from crowdmix import client
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.e2e.config_server import TOKEN
from tests.shuffler.helpers import make_registry

DAY = 86400
D = 20000  # a day's window index


class Clocks:
    """One true time ``t``: the device's wall clock reads ``t + device_ahead`` (its
    monotonic clock just ``t``), the shuffler's ``t + server_ahead``."""

    def __init__(self, t: float, device_ahead: float = 0.0) -> None:
        self.t, self.device_ahead, self.server_ahead = t, device_ahead, 0.0

    def device(self) -> float:
        return self.t + self.device_ahead

    def mono(self) -> float:
        return self.t

    def server(self) -> float:
        return self.t + self.server_ahead


def clocked_shuffler(clocks: Clocks) -> ShufflerHandle:
    """A shuffler on the shuffler's clock, releasing nothing (min_batch 1, memory store)."""
    return start_shuffler(
        make_registry(min_batch=1), MemoryStore(), tokens=frozenset({TOKEN}), clock=clocks.server
    )


def windows(s: ShufflerHandle, metric: str) -> dict[int, int]:
    """Reports the shuffler holds of ``metric``, by the window it filed them under."""
    out: dict[int, int] = {}
    for key, n in s.store.pending(metric).items():
        out[key.window] = out.get(key.window, 0) + n
    return out


def reporter(
    app: Path,
    target: str | ShufflerHandle,
    clocks: Clocks,
    cls: type[client.Reporter] = client.Reporter,
) -> client.Reporter:
    """A clear, foreground reporter on the device's wall and monotonic clocks, sending to
    ``target`` (an address, or a shuffler on loopback)."""
    if isinstance(target, ShufflerHandle):
        target = f"127.0.0.1:{target.port}"
    kw: dict[str, Any] = {"token": TOKEN, "tls": False, "sealing": "off", "background": False}
    return cls(app, target, clock=clocks.device, monotonic=clocks.mono, **kw)
