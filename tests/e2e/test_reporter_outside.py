"""An outside review of the send gate (``crowdmix.client.skew``): attacks that broke it.

Real shuffler, real SQLite outbox, real second connections to it (what a second
process on the same app dir holds).
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from crowdmix import client
from crowdmix.client.skew import SendMarks
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from crowdmix.shuffler.store import PendingWrite
from tests.e2e.test_reporter_review import DAY, TOKEN, B, Clocks, D, _server_windows
from tests.e2e.test_reporter_skew import OlderShuffler
from tests.shuffler.helpers import OUE, make_registry

pytestmark = pytest.mark.slow  # real servers, seconds each


@pytest.fixture
def shuffler() -> Iterator[tuple[ShufflerHandle, MemoryStore]]:
    store = MemoryStore()
    with start_shuffler(make_registry(min_batch=1), store, tokens=frozenset({TOKEN})) as s:
        yield s, store


@pytest.fixture
def skewed() -> Iterator[tuple[ShufflerHandle, MemoryStore, Clocks]]:
    """The shuffler's clock runs ten minutes ahead of the device's (fake) one."""
    clocks = Clocks(B(D))
    store = MemoryStore()
    with start_shuffler(
        make_registry(min_batch=1), store, tokens=frozenset({TOKEN}), clock=clocks.server
    ) as s:
        yield s, store, clocks


class Recording(client.Reporter):
    """Notes, for every Submit, the device time it left and the deadline it got."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[tuple[float, float]] = []

    def _submit(self, request: object, timeout: float) -> int:
        self.calls.append((time.time(), timeout))
        return super()._submit(request, timeout)


def test_an_attempt_never_outlives_the_deadline_its_mark_records(
    shuffler: tuple[ShufflerHandle, MemoryStore], tmp_path: Path
) -> None:
    """The mark of an attempt (its deadline, hence the last server window a copy may
    land in) is computed before ``begin_send``; that transaction may wait for the
    outbox's lock (another process on the app dir holds it, up to SQLite's 30 s busy
    timeout) or for a slow fsync. The request must still end by the recorded
    deadline, or a copy may arrive in a server window later than the mark says and
    the metric's next report may join it there."""
    s, _ = shuffler
    app = tmp_path / "app"
    r = Recording(
        app,
        f"127.0.0.1:{s.port}",
        token=TOKEN,
        tls=False,
        sealing="off",
        background=False,
        timeout=10.0,
    )
    with r:
        assert r.report(OUE, "a") is True  # fetches the config: the estimate is fresh
        other = sqlite3.connect(
            app / "outbox.sqlite3", isolation_level=None, check_same_thread=False
        )
        other.execute("BEGIN IMMEDIATE")  # another process writes the outbox

        def release() -> None:
            time.sleep(1.5)
            other.execute("COMMIT")

        t = threading.Thread(target=release)
        t.start()
        try:
            assert r.flush(timeout=20) == 0
        finally:
            t.join()
            other.close()
        ((left, timeout),) = r.calls
    db = sqlite3.connect(app / "outbox.sqlite3")
    ((deadline,),) = db.execute("SELECT deadline FROM sent WHERE metric = ?", (OUE,)).fetchall()
    db.close()
    # the request's own deadline lies within the one its mark records
    assert left + timeout <= deadline + 0.05, left + timeout - deadline


class StalledStore(MemoryStore):
    """A store whose first write hangs until ``go`` is set (a Redis that stalls)."""

    def __init__(self) -> None:
        super().__init__()
        self.go = threading.Event()
        self.first = threading.Event()

    def append(self, writes: Sequence[PendingWrite]) -> None:
        if not self.first.is_set():
            self.first.set()
            self.go.wait(30)
        super().append(writes)


def test_a_request_the_device_gave_up_on_is_not_filed_in_a_later_window(
    tmp_path: Path,
) -> None:
    """A device marks an attempt with the last server window it can arrive in, from
    its deadline. A request queued behind a stalled store write outlives that
    deadline (the device saw DEADLINE_EXCEEDED); the shuffler must not then file it
    under the window its clock shows when the write finally happens — a later one,
    where the device's next report may land too."""
    server_t = [B(D + 1) - 100.0]  # the shuffler's clock: 100 s before day D + 1
    store = StalledStore()
    with start_shuffler(
        make_registry(min_batch=1), store, tokens=frozenset({TOKEN}), clock=lambda: server_t[0]
    ) as s:
        target = f"127.0.0.1:{s.port}"
        kw: dict[str, Any] = {"token": TOKEN, "tls": False, "sealing": "off", "background": False}
        other = client.Reporter(tmp_path / "other", target, timeout=30.0, **kw)
        device = client.Reporter(tmp_path / "device", target, timeout=1.0, **kw)
        try:
            assert other.report(OUE, "a") is True and device.report(OUE, "b") is True
            hung = threading.Thread(target=other.flush, kwargs={"timeout": 30})
            hung.start()
            assert store.first.wait(10)  # the other device's write hangs in the store
            assert device.flush(timeout=5) == 1  # queued behind it: DEADLINE_EXCEEDED
            server_t[0] = B(D + 1) + 100.0  # the server's next day
            store.go.set()
            hung.join()
            assert other.queued == 0
            time.sleep(0.5)  # let the shuffler's drain finish what it queued
            windows = {k.window: n for k, n in store.pending(OUE).items()}
        finally:
            other.close()
            device.close()
    # the device's request never reached the day after its deadline
    assert windows == {D: 1}, windows


@pytest.mark.parametrize("made_by", ["old SDK", "new SDK"])
def test_an_outbox_from_before_the_marks_still_gates_the_next_report(
    skewed: tuple[ShufflerHandle, MemoryStore, Clocks], tmp_path: Path, made_by: str
) -> None:
    """An SDK from before the ``sent`` table delivered the metric's last report; the
    app then updates. The outbox has the claim, no marks: the first report of the new
    SDK must still not land in the server window of the old SDK's last one."""
    shuffler, store, clocks = skewed
    target = f"127.0.0.1:{shuffler.port}"
    app = tmp_path / "app"
    kw: dict[str, Any] = {"token": TOKEN, "tls": False, "sealing": "off", "background": False}
    clocks.t = B(D + 1) - 300  # device: the end of day D; server: day D + 1 began
    with client.Reporter(app, target, clock=clocks.device, **kw) as r:
        assert r.report(OUE, "a") is True and r.flush(timeout=10) == 0
        clocks.t = B(D + 1) + 100  # device: day D + 1; server: still day D + 1
        if made_by == "old SDK":  # it claimed "b" too, and exited before sending it
            assert r.report(OUE, "b") is True
    db = sqlite3.connect(app / "outbox.sqlite3", isolation_level=None)
    db.execute("DROP TABLE sent")  # what the older SDK left: no marks
    db.close()
    with client.Reporter(app, target, clock=clocks.device, **kw) as r:
        if made_by == "new SDK":
            assert r.report(OUE, "b") is True
        r.flush(timeout=10)
    windows = _server_windows(store)
    assert all(n == 1 for n in windows.values()), windows


class Counting(client.Reporter):
    submits = 0

    def _submit(self, request: object, timeout: float) -> int:
        self.submits += 1
        return super()._submit(request, timeout)


def test_a_report_the_other_process_delivered_is_not_sent_again(
    shuffler: tuple[ShufflerHandle, MemoryStore], tmp_path: Path
) -> None:
    """Two processes of the app on one app dir: B reads the metric's rows, then A
    sends, acknowledges and deletes them before B records its attempt. B's
    ``begin_send`` then finds no row (and records no mark), yet B used to send the
    report again: a copy the marks do not know of, so the metric's next report may
    share its server window."""
    s, store = shuffler
    app = tmp_path / "app"
    kw: dict[str, Any] = {"token": TOKEN, "tls": False, "sealing": "off", "background": False}
    target = f"127.0.0.1:{s.port}"
    a, b = Counting(app, target, **kw), Counting(app, target, **kw)
    with a, b:
        assert a.report(OUE, "a") is True
        assert b.config() is not None
        real_marks = b._outbox.marks

        def marks_after_a_delivered(metric: str, before: int) -> SendMarks:
            assert a.flush(timeout=10) == 0  # A delivers the rows B has read
            return real_marks(metric, before)

        b._outbox.marks = marks_after_a_delivered  # type: ignore[method-assign]
        b.flush(timeout=10)
        assert (a.submits, b.submits) == (1, 0)
    assert sum(store.pending(OUE).values()) == 1


class FarFutureShuffler(OlderShuffler):
    """Forwards to a real shuffler; its GetConfig says the year is 3000."""

    def GetConfig(self, request: pb.GetConfigRequest, context: grpc.ServicerContext) -> object:
        answer = self._forward(self._stub.GetConfig, request, context)
        assert isinstance(answer, pb.ConfigResponse)
        answer.server_time = 32503680000.0  # 3000-01-01
        return answer


def test_one_absurd_server_time_does_not_hold_a_metric_for_ever(
    skewed: tuple[ShufflerHandle, MemoryStore, Clocks], tmp_path: Path
) -> None:
    """A shuffler's GetConfig said the year is 3000 once. The device must not take it
    for the server's clock: sending under it recorded a mark in the year 3000, and
    the metric's next report was held (across restarts: the mark is on disk) until
    then. Such an answer is a bad answer: the reports wait, the error says why."""
    shuffler, store, clocks = skewed
    proxy = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    forward = FarFutureShuffler(f"127.0.0.1:{shuffler.port}")
    crowdmix_pb2_grpc.add_ShufflerServicer_to_server(forward, proxy)
    port = proxy.add_insecure_port("127.0.0.1:0")
    proxy.start()
    app = tmp_path / "app"
    kw: dict[str, Any] = {"token": TOKEN, "tls": False, "sealing": "off", "background": False}
    try:
        clocks.t = B(D) + 1000
        with client.Reporter(app, f"127.0.0.1:{shuffler.port}", clock=clocks.device, **kw) as r:
            assert r.report(OUE, "a") is True  # a config, from the real shuffler
        with client.Reporter(app, f"127.0.0.1:{port}", clock=clocks.device, **kw) as r:
            r.flush(timeout=5)  # through the shuffler that says it is the year 3000
            error, sent_under_it = r.last_error, r.counters().get("delivered", 0)
    finally:
        proxy.stop(None)
        forward._channel.close()
    assert sent_under_it == 0 and error is not None and "server_time" in error, error
    clocks.t = B(D + 3)  # days later, the real shuffler again
    with client.Reporter(app, f"127.0.0.1:{shuffler.port}", clock=clocks.device, **kw) as r:
        r.flush(timeout=10)
        clocks.t = B(D + 4) + 3600
        assert r.report(OUE, "b") is True
        assert r.flush(timeout=10) == 0  # not held until the year 3000
    assert all(n == 1 for n in _server_windows(store).values()), _server_windows(store)


def test_a_stored_report_above_the_ceiling_does_not_leave(
    shuffler: tuple[ShufflerHandle, MemoryStore], tmp_path: Path
) -> None:
    """The app made a report under a looser ceiling (an earlier version of the app),
    then lowered ``max_epsilon``. The report waits in the outbox, encoded under
    params above the new ceiling: the sender must not send it either (it is dropped
    and counted), or the ceiling binds only reports made after it."""
    s, store = shuffler
    app = tmp_path / "app"
    kw: dict[str, Any] = {"token": TOKEN, "tls": False, "sealing": "off", "background": False}
    target = f"127.0.0.1:{s.port}"
    with client.Reporter(app, target, **kw) as r:
        assert r.report(OUE, "a") is True  # not sent: the app exits first
    with client.Reporter(app, target, max_epsilon=0.01, max_epsilon_inf=0.01, **kw) as r:
        with pytest.raises(client.ParamsError):
            r.report(OUE, "b")
        assert r.flush(timeout=10) == 0
        assert r.counters().get("delivered", 0) == 0, r.counters()
    assert store.pending(OUE) == {}


def test_a_mark_is_never_recorded_in_a_window_length_the_outbox_no_longer_uses(
    tmp_path: Path,
) -> None:
    """The server goes from daily to hourly windows. Another fetch (the app's thread in
    ``report``, or a second process) renumbers the outbox to hours while the sender,
    with the daily config in hand, is about to record its attempt: a day's number
    stored as an hour's lies in 1972, and the metric's next report is not gated."""
    t = B(D) + 7200.0
    app = tmp_path / "app"
    kw: dict[str, Any] = {"token": TOKEN, "tls": False, "sealing": "off", "background": False}

    def shuffler(window: int) -> ShufflerHandle:
        registry = dataclasses.replace(make_registry(min_batch=1), window_seconds=window)
        return start_shuffler(registry, tokens=frozenset({TOKEN}), clock=lambda: t)

    with shuffler(DAY) as daily, shuffler(3600) as hourly:
        r = client.Reporter(app, f"127.0.0.1:{daily.port}", clock=lambda: t, **kw)
        q = client.Reporter(app, f"127.0.0.1:{hourly.port}", clock=lambda: t, **kw)
        with r, q:
            assert r.report(OUE, "a") is True  # under the daily config
            real_marks = r._outbox.marks

            def marks_then_renumbered(metric: str, before: int) -> SendMarks:
                marks = real_marks(metric, before)
                q._fetch_config(5.0)  # the hourly config: the outbox is renumbered
                return marks

            r._outbox.marks = marks_then_renumbered  # type: ignore[method-assign]
            r.flush(timeout=10)
    db = sqlite3.connect(app / "outbox.sqlite3")
    ((seconds,),) = db.execute("SELECT seconds FROM window_length").fetchall()
    marks = db.execute("SELECT server_window FROM sent WHERE server_window IS NOT NULL").fetchall()
    db.close()
    assert seconds == 3600
    # every mark, read in the recorded length, is not before the attempt it marks
    assert all(w >= int(t // seconds) for (w,) in marks), marks
