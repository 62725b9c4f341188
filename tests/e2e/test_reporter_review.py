"""Outside review of ``client.Reporter``: clocks, windows and bad answers, on real servers.

The shuffler files a report under the window of *its* clock when the report
arrives, and the aggregator recognises a repeated report id only within that
window and the adjacent ones (copies filed two windows apart are both counted). A
device's clock is never exactly the server's: these tests run a real shuffler whose
clock is some minutes ahead of the device's and read the windows it filed the reports
under from its store. Bad ``GetConfig`` answers come from a real gRPC server on loopback
that serves them.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from crowdmix import client
from crowdmix.client.device_config import DeviceConfig, to_proto
from crowdmix.client.link import LinkError
from crowdmix.client.sealed import PublicKeySet
from crowdmix.client.skew import GUARD_SECONDS
from crowdmix.cluster import free_port
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.shuffler.helpers import OUE, make_registry

pytestmark = pytest.mark.slow  # real servers, seconds each

TOKEN = "app-token-123"
DAY = 86400
SKEW = 600  # the server's clock is ten minutes ahead of the device's
D = 20000  # a day number; B(d) is its first second


def B(day: int) -> float:
    return float(day * DAY)


class Clocks:
    """One fake time: the device reads it, the shuffler reads it plus ``SKEW``."""

    def __init__(self, t: float) -> None:
        self.t = t

    def device(self) -> float:
        return self.t

    def server(self) -> float:
        return self.t + SKEW


@pytest.fixture
def skewed() -> Iterator[tuple[ShufflerHandle, MemoryStore, Clocks]]:
    clocks = Clocks(B(D))
    store = MemoryStore()
    with start_shuffler(
        make_registry(min_batch=1),
        store,
        tokens=frozenset({TOKEN}),
        clock=clocks.server,
    ) as s:
        yield s, store, clocks


def _server_windows(store: MemoryStore) -> dict[int, int]:
    """Reports the shuffler holds of ``OUE``, by the window it filed them under."""
    out: dict[int, int] = {}
    for key, n in store.pending(OUE).items():
        out[key.window] = out.get(key.window, 0) + n
    return out


class LostFirstReply(client.Reporter):
    """The shuffler stores the first request, and its reply never reaches the device
    (a deadline that expires on the way back: the outcome is unknown)."""

    lost = False

    def _submit(self, request: object, timeout: float) -> int:
        n = super()._submit(request, timeout)
        if not self.lost:
            self.lost = True
            raise LinkError("DEADLINE_EXCEEDED", "the reply was lost")
        return n


def test_a_retry_after_an_unknown_outcome_stays_where_the_aggregator_dedupes_it(
    skewed: tuple[ShufflerHandle, MemoryStore, Clocks], tmp_path: Path
) -> None:
    shuffler, store, clocks = skewed
    target = f"127.0.0.1:{shuffler.port}"
    # device day D, 700 s before its end; the server (10 min ahead) is still in day D
    clocks.t = B(D + 1) - 700
    r = LostFirstReply(
        tmp_path / "app",
        target,
        token=TOKEN,
        tls=False,
        sealing="off",
        background=False,
        clock=clocks.device,
    )
    with r:
        assert r.report(OUE, "a") is True
        assert r.flush(timeout=10) == 1  # stored by the shuffler, reply lost
        assert _server_windows(store) == {D: 1}
        # the next device day (first attempt one window back: the old rule resends),
        # 300 s before its end: the server is already in day D + 2
        clocks.t = B(D + 2) - 300
        assert r.flush(timeout=10) == 0
        counters = r.counters()
    windows = _server_windows(store)
    # every copy of the report lies in one window or two adjacent ones, where the
    # aggregator (ids of W and W - 1) counts it once
    assert max(windows) - min(windows) <= 1, windows
    assert counters.get("delivered", 0) + counters.get("unconfirmed", 0) == 1


def test_a_skewed_device_never_lands_two_reports_in_one_server_window(
    skewed: tuple[ShufflerHandle, MemoryStore, Clocks], tmp_path: Path
) -> None:
    shuffler, store, clocks = skewed
    target = f"127.0.0.1:{shuffler.port}"
    clocks.t = B(D + 1) - 300  # device: the end of day D; server: day D + 1 began
    with client.Reporter(
        tmp_path / "app",
        target,
        token=TOKEN,
        tls=False,
        sealing="off",
        background=False,
        clock=clocks.device,
    ) as r:
        assert r.report(OUE, "a") is True and r.flush(timeout=10) == 0
        clocks.t = B(D + 1) + 100  # device: day D + 1 began; server: still day D + 1
        assert r.report(OUE, "b") is True  # the device's new day: made...
        assert r.flush(timeout=10) == 1  # ...and held: "a" is in the server's day D + 1
        assert _server_windows(store) == {D + 1: 1}
        clocks.t = B(D + 2) - SKEW - 1  # the server's day D + 1 has a second left
        assert r.flush(timeout=10) == 1
        clocks.t = B(D + 2) - SKEW + GUARD_SECONDS + 1  # the server's day D + 2 began
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"delivered": 2}
    assert _server_windows(store) == {D + 1: 1, D + 2: 1}


class ConfigServer(crowdmix_pb2_grpc.ShufflerServicer):  # type: ignore[misc]
    """A shuffler that answers GetConfig with a given (bad) answer and stores nothing."""

    def __init__(self, answer: pb.ConfigResponse) -> None:
        self.answer = answer

    def GetConfig(self, request: pb.GetConfigRequest, context: grpc.ServicerContext) -> object:
        return self.answer

    def Submit(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> object:
        context.abort(grpc.StatusCode.UNAVAILABLE, "store down")


def _serve(answer: pb.ConfigResponse) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    crowdmix_pb2_grpc.add_ShufflerServicer_to_server(ConfigServer(answer), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def _good_answer() -> pb.ConfigResponse:
    return to_proto(DeviceConfig.of(make_registry(), PublicKeySet(())))


@pytest.mark.parametrize("window_seconds", [1, 60, 3599])
def test_a_window_below_an_hour_is_refused_clearly_and_makes_no_report(
    tmp_path: Path, window_seconds: int
) -> None:
    answer = _good_answer()
    answer.window_seconds = window_seconds
    server, target = _serve(answer)
    try:
        with client.Reporter(
            tmp_path / "app", target, token=TOKEN, tls=False, sealing="off", background=False
        ) as r:
            # a window shorter than the registry's floor (an hour) would let a server
            # draw a report per second from every device
            assert r.report(OUE, "a") is False
            assert r.queued == 0
            assert r.last_error is not None and "bad answer" in r.last_error
    finally:
        server.stop(None)


def test_the_background_sender_survives_an_unexpected_error(tmp_path: Path) -> None:
    """An error the sender did not foresee is logged and retried, never the silent end
    of sending (a thread that dies takes every later report with it)."""
    store = MemoryStore()
    with start_shuffler(make_registry(min_batch=1), store, tokens=frozenset({TOKEN})) as s:

        class Flaky(client.Reporter):
            calls = 0

            def _submit(self, request: object, timeout: float) -> int:
                Flaky.calls += 1
                if Flaky.calls == 1:
                    raise OverflowError("Python int too large to convert to SQLite INTEGER")
                return super()._submit(request, timeout)

        with Flaky(
            tmp_path / "app",
            f"127.0.0.1:{s.port}",
            token=TOKEN,
            tls=False,
            sealing="off",
            backoff_base=0.01,
            backoff_cap=0.05,
        ) as r:
            assert r.report(OUE, "a") is True
            for _ in range(1000):
                if r.queued == 0:
                    break
                time.sleep(0.02)
            assert r.queued == 0, r.last_error
            assert r._thread is not None and r._thread.is_alive()


@pytest.mark.parametrize(("before", "after"), [(3600, DAY), (DAY, 3600)])
def test_a_new_window_length_from_the_server_neither_stalls_nor_drops_reports(
    tmp_path: Path, before: int, after: int
) -> None:
    """Window numbers are stored on the device; from hourly to daily, an hour's number
    read as a day lies in the far future (the metric never reported again); from daily
    to hourly, a day's number read as an hour lies in 1972 (a waiting report expired)."""
    clocks = Clocks(B(D) + 7200.0)
    app = tmp_path / "app"

    def shuffler(window: int) -> ShufflerHandle:
        registry = dataclasses.replace(make_registry(min_batch=1), window_seconds=window)
        return start_shuffler(registry, tokens=frozenset({TOKEN}), clock=clocks.device)

    def reporter(s: ShufflerHandle) -> client.Reporter:
        return client.Reporter(
            app,
            f"127.0.0.1:{s.port}",
            token=TOKEN,
            tls=False,
            sealing="off",
            background=False,
            clock=clocks.device,
        )

    with shuffler(before) as s, reporter(s) as r:
        assert r.report(OUE, "a") is True and r.flush(timeout=10) == 0  # delivered
        clocks.t += before  # the next window
        assert r.report(OUE, "b") is True  # claimed, not sent yet
        clocks.t += 4000  # past the cached config's hour
    with shuffler(after) as s, reporter(s) as r:
        if after > before:
            # "a" lies in the server's day now: "b" waits for the next one (crowdmix.client.skew)
            assert r.flush(timeout=10) == 1
            assert r.counters().get("expired", 0) == 0
            clocks.t += after
        assert r.flush(timeout=10) == 0
        counters = r.counters()
        assert counters.get("expired", 0) == 0, counters  # claimed, never tried: sent
        assert counters["delivered"] == 2
        clocks.t += 2 * max(before, after)  # well into a later window of either length
        assert r.report(OUE, "c") is True


def test_a_dropped_report_that_may_have_arrived_uses_up_its_window(tmp_path: Path) -> None:
    """Clocks agree here. A report claimed yesterday is tried today; the shuffler stores
    it and the reply is lost; at the end of today it is dropped (a repeat could arrive
    tomorrow, past the aggregator's dedupe). Its copy is in today's server window: a
    new report made today would be a second one there."""
    clocks = Clocks(B(D - 1) + 100)
    store = MemoryStore()
    with (
        start_shuffler(
            make_registry(min_batch=1), store, tokens=frozenset({TOKEN}), clock=clocks.device
        ) as s,
        LostFirstReply(
            tmp_path / "app",
            f"127.0.0.1:{s.port}",
            token=TOKEN,
            tls=False,
            sealing="off",
            background=False,
            clock=clocks.device,
        ) as r,
    ):
        assert r.report(OUE, "a") is True  # claimed on day D - 1, not sent then
        clocks.t = B(D) + 100
        assert r.flush(timeout=10) == 1  # day D: stored, reply lost
        clocks.t = B(D + 1) - 5  # a repeat's deadline would fall on day D + 1
        assert r.flush(timeout=10) == 0
        assert r.counters().get("unconfirmed") == 1
        r.report(OUE, "b")
        r.flush(timeout=10)
    windows = _server_windows(store)
    assert all(n <= 1 for n in windows.values()), windows


CLAIMER = """
import sys, time
from pathlib import Path
from crowdmix import client
app, target, go = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
r = client.Reporter(app, target, token="app-token-123", tls=False, sealing="off",
                    background=False)
while not go.exists():
    time.sleep(0.001)
print(r.report("home_page", "x"))
r.close()
"""


def test_two_processes_on_one_app_dir_claim_one_report(tmp_path: Path) -> None:
    """Two app processes (say, the app and its widget) share the app directory and
    report at the same instant: one report is made, the other process is told so."""
    offline = f"127.0.0.1:{free_port()}"  # nothing listens: the cached config is used
    with start_shuffler(make_registry(min_batch=1), tokens=frozenset({TOKEN})) as s:
        for i in range(3):
            app, go = tmp_path / f"app{i}", tmp_path / f"go{i}"
            with client.Reporter(
                app,
                f"127.0.0.1:{s.port}",
                token=TOKEN,
                tls=False,
                sealing="off",
                background=False,
            ) as r:  # caches the config
                assert r.report(OUE, "a") is True and r.flush(timeout=10) == 0
            procs = [
                subprocess.Popen(
                    [sys.executable, "-c", CLAIMER, str(app), offline, str(go)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                for _ in range(2)
            ]
            time.sleep(1.0)  # both started and waiting (a late one only makes it easier)
            go.touch()
            outs = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
            assert outs == ["False", "True"], outs
            with client.Reporter(app, offline, tls=False, sealing="off", background=False) as r:
                assert r.queued == 1


def test_a_shuffler_cannot_serve_params_that_send_the_value_in_the_clear(
    tmp_path: Path,
) -> None:
    """RAPPOR with f = 0, p = 0, q = 1 is the value's Bloom filter itself (ε = ∞). The
    client trusts nobody: a served config must not be able to switch its privacy off,
    as a shuffler without keys cannot switch sealing off."""
    from crowdmix.client.params import RapporParams
    from crowdmix.client.registry import MetricConfig
    from tests.shuffler.helpers import RAPPOR

    answer = _good_answer()
    for m in answer.metrics:
        if m.name == RAPPOR:
            m.rappor.f, m.rappor.p, m.rappor.q = 0.0, 0.0, 1.0
            params = RapporParams(k=m.rappor.k, h=m.rappor.h, m=m.rappor.m, f=0.0, p=0.0, q=1.0)
            m.params_fingerprint = MetricConfig(name=RAPPOR, rappor=params).fingerprint
    server, target = _serve(answer)
    try:
        with client.Reporter(
            tmp_path / "app", target, token=TOKEN, tls=False, sealing="off", background=False
        ) as r:
            with pytest.raises(
                client.ParamsError, match=r"'home_page'.*ε_1 = inf.*max_epsilon = 10"
            ):
                r.report(RAPPOR, "example.com")
            assert r.queued == 0
            assert r.report(OUE, "a") is True  # the other metrics are unaffected
    finally:
        server.stop(None)
