"""A clock set on the device moves no window, and an early report holds back no other.

The device takes the server's time from ``GetConfig`` and runs it on its monotonic
clock: its wall clock set days forward or back after the fetch changes no report's
window. A report that does name a window days ahead (the server's own clock was wrong
when the device fetched the config) is refused ``window_ahead``; once the server time is
learnt again it is withdrawn (counted) and its metric's claim moved back, so neither it
nor the reports claimed after it wait days: they name the current window and are
delivered in it. Real shuffler on loopback, the device's clocks and the shuffler's set
by the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crowdmix import client
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.e2e.config_server import TOKEN
from tests.shuffler.helpers import OUE, RAPPOR, make_registry

pytestmark = pytest.mark.slow  # real servers, seconds each

DAY = 86400
D = 20000  # a day's window index


class Clocks:
    """One true time ``t``: the device's wall clock reads ``t + device_ahead`` (its
    monotonic clock just ``t``), the shuffler's ``t + server_ahead``."""

    def __init__(self, t: float) -> None:
        self.t, self.device_ahead, self.server_ahead = t, 0.0, 0.0

    def device(self) -> float:
        return self.t + self.device_ahead

    def mono(self) -> float:
        return self.t

    def server(self) -> float:
        return self.t + self.server_ahead


@pytest.fixture
def clocks() -> Clocks:
    return Clocks(D * DAY + 3600.0)


@pytest.fixture
def shuffler(clocks: Clocks) -> Iterator[ShufflerHandle]:
    with start_shuffler(
        make_registry(min_batch=1), MemoryStore(), tokens=frozenset({TOKEN}), clock=clocks.server
    ) as s:
        yield s


def _windows(s: ShufflerHandle, metric: str) -> dict[int, int]:
    out: dict[int, int] = {}
    for key, n in s.store.pending(metric).items():
        out[key.window] = out.get(key.window, 0) + n
    return out


def _reporter(app: Path, s: ShufflerHandle, clocks: Clocks) -> client.Reporter:
    kw: dict[str, Any] = {"token": TOKEN, "tls": False, "sealing": "off", "background": False}
    return client.Reporter(
        app, f"127.0.0.1:{s.port}", clock=clocks.device, monotonic=clocks.mono, **kw
    )


def test_a_wall_clock_set_days_forward_then_back_moves_no_window(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    with _reporter(tmp_path / "app", shuffler, clocks) as r:
        assert r.flush(timeout=10) == 0  # the config and the server's time
        clocks.device_ahead = 2 * DAY  # the clock set two days forward
        assert r.report(OUE, "a") and r.flush(timeout=10) == 0  # claimed in day D
        clocks.device_ahead = 0.0  # and right again
        assert r.report(RAPPOR, "x") and r.flush(timeout=10) == 0  # day D as well
        clocks.t += 2 * DAY
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"delivered": 2}
    assert _windows(shuffler, OUE) == {D: 1} and _windows(shuffler, RAPPOR) == {D: 1}


def test_a_report_in_a_window_days_ahead_does_not_hold_back_a_report_of_the_current_window(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    with _reporter(tmp_path / "app", shuffler, clocks) as r:
        clocks.server_ahead = 2 * DAY  # the shuffler's clock is wrong when the device asks
        assert r.flush(timeout=10) == 0
        clocks.server_ahead = 0.0  # and is put right
        assert r.report(OUE, "a")  # claimed in day D + 2
        # window_ahead: the server time learnt again, and the report two days ahead of it
        # withdrawn (no shuffler whose clock is right took it), not kept for two days
        assert r.flush(timeout=10) == 0
        assert r.report(RAPPOR, "x")  # claimed in day D
        assert r.report(OUE, "b")  # the claim of day D + 2 was moved back: day D
        r.flush(timeout=10)
        delivered_in_time = _windows(shuffler, RAPPOR), _windows(shuffler, OUE)
        clocks.t += 2 * DAY  # day D + 2: nothing was left for it
        assert r.flush(timeout=10) == 0
        counters = r.counters()
    assert delivered_in_time == ({D: 1}, {D: 1}), "a report of day D waited behind day D + 2"
    assert _windows(shuffler, OUE) == {D: 1}
    assert counters == {"delivered": 2, "window_ahead": 1}, counters
