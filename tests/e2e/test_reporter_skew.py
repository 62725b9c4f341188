"""A device whose clock is off never lands two reports of a metric in one server window.

A real shuffler whose clock runs ten minutes ahead of the device's files reports
under the windows of its own clock; the test reads them back from its store. The
device learns the server's time from ``GetConfig`` (``crowdmix.client.skew``); an older
shuffler that does not send it is played by a real gRPC proxy in front of the real
shuffler that clears the field. The guarantee survives a SIGKILL: the marks of
what was sent live in the outbox.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from crowdmix import client
from crowdmix.client.skew import GUARD_SECONDS
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.e2e.test_reporter_review import SKEW, TOKEN, B, Clocks, D, _server_windows
from tests.shuffler.helpers import OUE, make_registry

pytestmark = pytest.mark.slow  # real servers and processes, seconds each

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def skewed() -> Iterator[tuple[ShufflerHandle, MemoryStore, Clocks]]:
    clocks = Clocks(B(D))
    store = MemoryStore()
    with start_shuffler(
        make_registry(min_batch=1), store, tokens=frozenset({TOKEN}), clock=clocks.server
    ) as s:
        yield s, store, clocks


class OlderShuffler(crowdmix_pb2_grpc.ShufflerServicer):  # type: ignore[misc]
    """Forwards to a real shuffler; its GetConfig answers lack ``server_time``, as an
    older shuffler's do."""

    def __init__(self, target: str) -> None:
        self._channel = grpc.insecure_channel(target)
        self._stub = crowdmix_pb2_grpc.ShufflerStub(self._channel)

    def _forward(self, call: object, request: object, context: grpc.ServicerContext) -> object:
        try:
            return call(request, metadata=context.invocation_metadata(), timeout=10)  # type: ignore[operator]
        except grpc.RpcError as exc:
            context.abort(exc.code(), exc.details() or "")  # type: ignore[attr-defined]
            raise  # unreachable

    def GetConfig(self, request: pb.GetConfigRequest, context: grpc.ServicerContext) -> object:
        answer = self._forward(self._stub.GetConfig, request, context)
        assert isinstance(answer, pb.ConfigResponse) and answer.server_time > 0
        answer.ClearField("server_time")
        return answer

    def Submit(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> object:
        return self._forward(self._stub.Submit, request, context)


def _reporter(app: Path, target: str, clocks: Clocks) -> client.Reporter:
    return client.Reporter(
        app,
        target,
        token=TOKEN,
        tls=False,
        sealing="off",
        background=False,
        timeout=10.0,
        clock=clocks.device,
    )


def test_an_older_shuffler_gets_reports_one_window_apart_on_the_device_clock(
    skewed: tuple[ShufflerHandle, MemoryStore, Clocks], tmp_path: Path
) -> None:
    shuffler, store, clocks = skewed
    proxy = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    forward = OlderShuffler(f"127.0.0.1:{shuffler.port}")
    crowdmix_pb2_grpc.add_ShufflerServicer_to_server(forward, proxy)
    port = proxy.add_insecure_port("127.0.0.1:0")
    proxy.start()
    try:
        clocks.t = B(D + 1) - 300  # device: the end of day D; server: day D + 1 began
        with _reporter(tmp_path / "app", f"127.0.0.1:{port}", clocks) as r:
            assert r.report(OUE, "a") is True and r.flush(timeout=10) == 0
            # its last attempt's deadline: at most 10 s (the timeout) after it began
            clocks.t = B(D + 1) + 100  # the device's next day, the server's same day
            assert r.report(OUE, "b") is True
            assert r.flush(timeout=10) == 1  # held: not a window after "a"'s deadline
            clocks.t = B(D + 2) - 300  # a window after "a" began, not after its deadline
            assert r.flush(timeout=10) == 1
            clocks.t = B(D + 2) - 300 + 10 + GUARD_SECONDS + 1
            assert r.flush(timeout=10) == 0
            assert r.counters() == {"delivered": 2}
    finally:
        proxy.stop(None)
        forward._channel.close()
    assert _server_windows(store) == {D + 1: 1, D + 2: 1}


# A device process: reports "a" at a fixed device time, delivers it, says so, and
# waits to be SIGKILLed. argv: app_dir target device_time marker
DEVICE = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from crowdmix import client
    app, target, t, marker = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3]), Path(sys.argv[4])
    r = client.Reporter(app, target, token="app-token-123", tls=False, sealing="off",
                        background=False, clock=lambda: t)
    assert r.report("browser", "a") is True
    assert r.flush(timeout=10) == 0
    marker.write_text("")
    time.sleep(600)  # the test SIGKILLs us now
    """
)


def test_the_guarantee_survives_a_sigkill(
    skewed: tuple[ShufflerHandle, MemoryStore, Clocks], tmp_path: Path
) -> None:
    shuffler, store, clocks = skewed
    target = f"127.0.0.1:{shuffler.port}"
    app, marker = tmp_path / "app", tmp_path / "delivered"
    clocks.t = B(D + 1) - 300  # device: the end of day D; server: day D + 1 began
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(
        [sys.executable, "-c", DEVICE, str(app), target, repr(clocks.t), str(marker)], env=env
    )
    try:
        for _ in range(6000):  # up to a minute for the child to start and deliver
            if marker.exists() or child.poll() is not None:
                break
            time.sleep(0.01)
        assert marker.exists(), f"the device process ended with {child.poll()}"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert _server_windows(store) == {D + 1: 1}
    # the app starts again on the device's next day: a new process, the same outbox
    clocks.t = B(D + 1) + 100
    with _reporter(app, target, clocks) as r:
        assert r.report(OUE, "b") is True
        assert r.flush(timeout=10) == 1  # held: "a" is in the server's day D + 1
        clocks.t = B(D + 2) - SKEW + GUARD_SECONDS + 1  # the server's day D + 2 began
        assert r.flush(timeout=10) == 0
    assert _server_windows(store) == {D + 1: 1, D + 2: 1}


class SettableClocks(Clocks):
    """The device's clock can be set (an NTP correction): the server's stays."""

    skew = float(SKEW)

    def server(self) -> float:
        return self.t + self.skew


def test_a_device_clock_that_was_set_is_read_against_the_server_again(tmp_path: Path) -> None:
    """Hourly windows, and the device's clock set right within the config's hour: the
    estimate made before would put the server ten minutes later than it is, and let
    the next report out in the same server hour."""
    hour = 3600
    h = int(B(D)) // hour + 5  # an hour's number; H its first second
    H = float(h * hour)
    clocks = SettableClocks(H - 300)  # device: the end of hour h - 1; server: hour h
    store = MemoryStore()
    registry = dataclasses.replace(make_registry(min_batch=1), window_seconds=hour)
    with (
        start_shuffler(registry, store, tokens=frozenset({TOKEN}), clock=clocks.server) as s,
        _reporter(tmp_path / "app", f"127.0.0.1:{s.port}", clocks) as r,
    ):
        assert r.report(OUE, "a") is True and r.flush(timeout=10) == 0
        # the device's clock is set ten minutes forward, and the hour nearly passes (the
        # cached config, an hour long, is still used)
        clocks.skew = 0.0
        clocks.t = H + hour - 400
        assert r.report(OUE, "b") is True  # the device's hour h
        assert r.flush(timeout=10) == 1  # held: the server's hour h is not over
        clocks.t = H + hour + GUARD_SECONDS + 1
        assert r.flush(timeout=10) == 0
    assert _server_windows(store) == {h: 1, h + 1: 1}
