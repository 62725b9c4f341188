"""A clock set on the device moves no window, and an early report holds back no other.

The device takes the server's time from ``GetConfig`` and runs it on its monotonic
clock: its wall clock set days forward or back after the fetch changes no report's
window. A report that does name a window days ahead (the server's clock was wrong, or a
new process runs the cached answer on a wall clock set while the app was down) is refused
``window_ahead``; once the server time is learnt again it is withdrawn (counted) and its
metric's claim moved back, so neither it nor the reports claimed after it wait days. A
clock set while the app runs, when the fetch that would correct it fails, is stored
against the server time the process runs on, so a restart names the right window. Real
shuffler on loopback, the device's clocks and the shuffler's set by the test.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crowdmix import client
from crowdmix.client.outbox import Outbox
from crowdmix.shuffler.server import ShufflerHandle
from tests.e2e.clocks import DAY, Clocks, D, clocked_shuffler, reporter, windows
from tests.shuffler.helpers import OUE, RAPPOR

pytestmark = pytest.mark.slow  # real servers, seconds each


@pytest.fixture
def clocks() -> Clocks:
    return Clocks(D * DAY + 3600.0)


@pytest.fixture
def shuffler(clocks: Clocks) -> Iterator[ShufflerHandle]:
    with clocked_shuffler(clocks) as s:
        yield s


def test_a_wall_clock_set_days_forward_then_back_moves_no_window(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    with reporter(tmp_path / "app", shuffler, clocks) as r:
        assert r.flush(timeout=10) == 0  # the config and the server's time
        clocks.device_ahead = 2 * DAY  # the clock set two days forward
        assert r.report(OUE, "a") and r.flush(timeout=10) == 0  # claimed in day D
        clocks.device_ahead = 0.0  # and right again
        assert r.report(RAPPOR, "x") and r.flush(timeout=10) == 0  # day D as well
        clocks.t += 2 * DAY
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"delivered": 2}
    assert windows(shuffler, OUE) == {D: 1} and windows(shuffler, RAPPOR) == {D: 1}


def test_a_report_in_a_window_days_ahead_does_not_hold_back_a_report_of_the_current_window(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    with reporter(tmp_path / "app", shuffler, clocks) as r:
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
        delivered_in_time = windows(shuffler, RAPPOR), windows(shuffler, OUE)
        clocks.t += 2 * DAY  # day D + 2: nothing was left for it
        assert r.flush(timeout=10) == 0
        counters = r.counters()
    assert delivered_in_time == ({D: 1}, {D: 1}), "a report of day D waited behind day D + 2"
    assert windows(shuffler, OUE) == {D: 1}
    assert counters == {"delivered": 2, "window_ahead": 1}, counters


def test_a_restart_on_a_clock_set_forward_does_not_block_the_metric(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    app = tmp_path / "app"
    with reporter(app, shuffler, clocks) as r:
        assert r.flush(timeout=10) == 0  # the config cached, offset 0
    clocks.t += 600
    clocks.device_ahead = 30 * DAY  # set forward while the app was down
    with reporter(app, shuffler, clocks) as r:
        first = r.report(OUE, "a")
        r.flush(timeout=10)  # the server time learnt again
        second = r.report(OUE, "b")
        r.flush(timeout=10)
        # one report of day D is delivered, today, whichever call made it
        assert (first.status, second.status).count(client.ReportStatus.CLAIMED) >= 1
        assert r.queued == 0, "a report waits for a window 30 days ahead"
    assert {k.window for k in shuffler.store.pending(OUE)} == {D}


def test_a_clock_set_while_running_is_kept_for_the_restart_when_the_fetch_fails(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    app = tmp_path / "app"
    with reporter(app, shuffler, clocks) as r:
        assert r.flush(timeout=10) == 0  # the config cached, offset 0
        shuffler.stop()
        clocks.t += 600
        clocks.device_ahead = 30 * DAY  # set forward while the app runs, offline
        assert r.report(OUE, "a").status is client.ReportStatus.CLAIMED
        assert r.flush(timeout=2) == 1  # the refetch failed: the report waits
    (row,) = Outbox(app / "outbox.sqlite3").pending()
    assert row.window == D  # the server's day: the monotonic clock, not the wall one
    clocks.t += 600
    with reporter(app, shuffler, clocks) as r:  # restarted, still offline
        # day D again (claimed): on the old offset it would claim day D + 30
        assert r.report(OUE, "b").status is client.ReportStatus.ALREADY_REPORTED_THIS_WINDOW
    # the stored offset follows the monotonic clock: day D still, not day D + 30
    box = Outbox(app / "outbox.sqlite3")
    cached = box.cached_config()
    assert cached is not None and abs(cached[2] + 30 * DAY) < 1
