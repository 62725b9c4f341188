"""The window a report names, on real shufflers whose clocks the test sets.

The device takes its window from the server time of its last ``GetConfig`` run on its
monotonic clock (its wall clock may be set); the report keeps that window and its id through
every retry, the shuffler files it there (or refuses it: ``window_closed``, dropped;
``window_ahead``, kept), and the aggregator counts an id once in its window. Bad
``GetConfig`` answers come from a real gRPC server that serves them.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crowdmix import client
from crowdmix.client.link import LinkError
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.e2e.clocks import DAY, Clocks, D, clocked_shuffler, reporter, windows
from tests.e2e.config_server import TOKEN, good_answer, serve_config
from tests.shuffler.helpers import OUE, make_registry

pytestmark = pytest.mark.slow  # real servers, seconds each


def B(day: int) -> float:
    """The first second of window ``day``."""
    return float(day * DAY)


@pytest.fixture
def clocks() -> Clocks:
    return Clocks(B(D))


@pytest.fixture
def shuffler(clocks: Clocks) -> Iterator[ShufflerHandle]:
    with clocked_shuffler(clocks) as s:
        yield s


def _windows(s: ShufflerHandle) -> dict[int, int]:
    return windows(s, OUE)


def test_a_device_clock_behind_reports_in_the_servers_window_and_only_once(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    clocks.device_ahead = -600.0  # ten minutes behind
    clocks.t = B(D + 1) + 300  # the server's day D + 1 began; the device's day D has not ended
    with reporter(tmp_path / "app", shuffler, clocks) as r:
        assert r.flush(timeout=10) == 0  # the config and the server's time
        assert r.report(OUE, "a") and r.flush(timeout=10) == 0
        assert _windows(shuffler) == {D + 1: 1}
        clocks.t += 400  # the device's day D + 1 begins: the server's is the same one
        assert r.report(OUE, "b").status is client.ReportStatus.ALREADY_REPORTED_THIS_WINDOW
        clocks.t = B(D + 2) + 10  # the server's next day (the device's is 10 min away)
        assert r.report(OUE, "c") and r.flush(timeout=10) == 0
    assert _windows(shuffler) == {D + 1: 1, D + 2: 1}


def test_a_device_clock_ahead_reports_in_the_servers_window_when_it_turns(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    clocks.device_ahead = 600.0  # ten minutes ahead
    clocks.t = B(D + 1) - 300  # the device's day D + 1 began; the server's day D has not ended
    with reporter(tmp_path / "app", shuffler, clocks) as r:
        assert r.flush(timeout=10) == 0
        assert r.report(OUE, "a") and r.flush(timeout=10) == 0
        assert _windows(shuffler) == {D: 1}
        clocks.t += 400  # the server's day D + 1 begins, the device's is the same one
        assert r.report(OUE, "b") and r.flush(timeout=10) == 0
    assert _windows(shuffler) == {D: 1, D + 1: 1}


class LostFirstReply(client.Reporter):
    """The shuffler stores the first request, and its reply never reaches the device
    (a deadline that expires on the way back: the outcome is unknown). Every request
    is recorded: (window, report id) of its one report."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[int, bytes]] = []

    def _submit(self, request: Any, timeout: float) -> int:
        (report,) = request.reports
        self.sent.append((report.window, report.report_id))
        n = super()._submit(request, timeout)
        if len(self.sent) == 1:
            raise LinkError("DEADLINE_EXCEEDED", "the reply was lost")
        return n


def test_a_retry_after_the_window_turned_names_the_same_window_and_id(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    clocks.t = B(D + 1) - 100  # 100 s before the day ends
    with reporter(tmp_path / "app", shuffler, clocks, LostFirstReply) as r:
        assert r.flush(timeout=10) == 0
        assert r.report(OUE, "a")
        assert r.flush(timeout=10) == 1  # stored by the shuffler, reply lost
        clocks.t = B(D + 1) + 100  # the next day: day D still takes reports
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"delivered": 1}
        first, retry = r.sent  # type: ignore[attr-defined]
    assert first == retry and first[0] == D
    # both copies filed under day D, one id: the aggregator counts the report once
    assert _windows(shuffler) == {D: 2}


def test_a_report_whose_window_closed_while_retrying_is_dropped(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    clocks.t = B(D) + 100
    with reporter(tmp_path / "app", shuffler, clocks, LostFirstReply) as r:
        assert r.flush(timeout=10) == 0
        assert r.report(OUE, "a") and r.flush(timeout=10) == 1  # stored, reply lost
        clocks.t = B(D + 2) + 100  # day D is closed now
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"window_closed": 1}
        assert len(r.sent) == 1  # type: ignore[attr-defined]  # no request for a closed window
    assert _windows(shuffler) == {D: 1}


def test_a_new_window_length_neither_blocks_the_metric_nor_sends_a_stale_window(
    clocks: Clocks, tmp_path: Path
) -> None:
    """Hourly windows, then daily: a report claimed in an hour cannot be filed under a
    day (its index means another time): dropped as ``window_changed``. The metric
    reports again from the first day after that hour, not in the year 3300 (an hour's
    index read as a day's)."""
    clocks.t = B(D) + 7200
    app = tmp_path / "app"

    def shuffler(window: int) -> ShufflerHandle:
        registry = dataclasses.replace(make_registry(min_batch=1), window_seconds=window)
        return start_shuffler(registry, tokens=frozenset({TOKEN}), clock=clocks.server)

    with shuffler(3600) as hourly, reporter(app, hourly, clocks) as r:
        assert r.flush(timeout=10) == 0
        assert r.report(OUE, "a")  # claimed in an hour, not sent
    with shuffler(DAY) as daily, reporter(app, f"127.0.0.1:{daily.port}", clocks) as r:
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"window_changed": 1}
        # this day holds the claimed hour: its report is made already
        assert r.report(OUE, "b").status is client.ReportStatus.ALREADY_REPORTED_THIS_WINDOW
        clocks.t = B(D + 1) + 10
        assert r.report(OUE, "c") and r.flush(timeout=10) == 0
        assert _windows(daily) == {D + 1: 1}


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("window_seconds", 60, "window_seconds 60 is below"),
        ("window_seconds", 3599, "window_seconds 3599 is below"),
        ("server_time", 32503680000.0, "server_time"),  # the year 3000
        ("server_time", -1.0, "server_time"),
    ],
)
def test_a_config_answer_no_server_gives_makes_no_report(
    tmp_path: Path, field: str, value: float, said: str
) -> None:
    """A window below an hour would let a server draw a report a second from every
    device; a server time far off would put the claimed windows there, and the metric
    would report nothing until then. Either answer is refused whole."""
    answer = good_answer()
    setattr(answer, field, value)
    with (
        serve_config(answer) as target,
        client.Reporter(
            tmp_path / "app", target, token=TOKEN, tls=False, sealing="off", background=False
        ) as r,
    ):
        assert r.flush(timeout=5) == 0
        assert r.report(OUE, "a").status is client.ReportStatus.NO_CONFIG and r.queued == 0
        assert r.last_error is not None and "bad answer" in r.last_error and said in r.last_error


def test_the_background_sender_survives_an_unexpected_error(
    shuffler: ShufflerHandle, clocks: Clocks, tmp_path: Path
) -> None:
    """An error the sender did not foresee is logged and retried, never the silent end
    of sending (a thread that dies takes every later report with it)."""

    class Flaky(client.Reporter):
        calls = 0

        def _submit(self, request: object, timeout: float) -> int:
            Flaky.calls += 1
            if Flaky.calls == 1:
                raise OverflowError("Python int too large to convert to SQLite INTEGER")
            return super()._submit(request, timeout)

    clocks.t = time.time()  # the sender runs on its own time here
    with Flaky(
        tmp_path / "app",
        f"127.0.0.1:{shuffler.port}",
        token=TOKEN,
        tls=False,
        sealing="off",
        backoff_base=0.01,
        backoff_cap=0.05,
    ) as r:
        assert r.flush(timeout=10) == 0
        assert r.report(OUE, "a")
        for _ in range(1000):
            if r.queued == 0:
                break
            time.sleep(0.02)
        assert r.queued == 0, r.last_error
        assert r._thread is not None and r._thread.is_alive()
