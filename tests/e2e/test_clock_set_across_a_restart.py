"""A wall clock set while the app was down, against real shufflers on loopback.

A new process has no monotonic reading of the last ``GetConfig``: the cached answer
runs on the wall clock and its stored offset. Set far forward, that clock makes the
device claim a window that has not begun; once the server time is learnt again the
claim must neither hold the metric nor keep the report until that window opens. A
clock set while the app runs, when the fetch that would correct it fails, is stored
against the server time the process runs on, so the restart names the right window.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from crowdmix import client
from crowdmix.client.outbox import Outbox
from crowdmix.shuffler.server import ShufflerHandle
from tests.e2e.clocks import DAY, Clocks, D, clocked_shuffler, reporter
from tests.shuffler.helpers import OUE

pytestmark = pytest.mark.slow  # real servers, seconds each


@pytest.fixture
def clocks() -> Clocks:
    return Clocks(D * DAY + 3600.0)


@pytest.fixture
def shuffler(clocks: Clocks) -> Iterator[ShufflerHandle]:
    with clocked_shuffler(clocks) as s:
        yield s


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
