"""``client.Reporter`` against a real in-process shuffler (gRPC on loopback).

The network going away and coming back is a real TCP forwarder on loopback that
the test opens and closes; offline means connections are refused, as on a
device without a route. What each test proves is in its name.
"""

from __future__ import annotations

import contextlib
import logging
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from crowdmix import client
from crowdmix.aggregator.sealing.keys import KeySet
from crowdmix.client.outbox import Outbox
from crowdmix.client.reporter import ReportStatus
from crowdmix.cluster import free_port
from crowdmix.core.params import RapporParams
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.e2e.config_server import TOKEN
from tests.shuffler.helpers import OUE, RAPPOR, make_registry
from tests.waiting import eventually

pytestmark = pytest.mark.slow  # real processes or servers, seconds each


class Forwarder:
    """A TCP forwarder on a fixed loopback port: ``up()`` listens and relays to
    ``target``; ``down()`` closes the listener and every relayed connection."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self._target = target_port
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def up(self) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(16)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                a, _ = listener.accept()
            except OSError:
                return
            try:
                b = socket.create_connection(("127.0.0.1", self._target))
            except OSError:  # the shuffler behind is down: the client sees a reset
                a.close()
                continue
            with self._lock:
                self._conns += [a, b]
            for x, y in ((a, b), (b, a)):
                threading.Thread(target=self._pipe, args=(x, y), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def down(self) -> None:
        if self._listener is not None:
            # shutdown wakes the blocked accept(): close() alone leaves the port listening
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for c in self._conns:
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)
                c.close()
            self._conns.clear()


@pytest.fixture
def plain_shuffler() -> Iterator[ShufflerHandle]:
    with start_shuffler(make_registry(min_batch=1), tokens=frozenset({TOKEN})) as s:
        yield s


def _reporter(app: Path, target: str, **kw: object) -> client.Reporter:
    return client.Reporter(app, target, token=TOKEN, tls=False, **kw)  # type: ignore[arg-type]


def _online(r: client.Reporter) -> client.Reporter:
    """Fetch the config (``report`` never touches the network: the sender, or ``flush``,
    fetches it)."""
    assert r.flush(timeout=10) == 0 and r.config() is not None, r.last_error
    return r


def test_the_app_names_the_metric_and_the_report_is_sealed_and_acknowledged(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{sealed_shuffler.port}"
    with _reporter(tmp_path / "app", target, background=False) as r:
        # never reached: no config, and report() does not fetch one in the app's thread
        assert r.report(RAPPOR, "example.com").status is ReportStatus.NO_CONFIG
        assert r._link is None  # no connection was even made
        _online(r)
        assert r.report(RAPPOR, "example.com")
        for f in (tmp_path / "app").iterdir():  # waiting: the encoded bits, not the value
            assert b"example.com" not in f.read_bytes(), f
        again = r.report(RAPPOR, "example.com")
        assert again.status is ReportStatus.ALREADY_REPORTED_THIS_WINDOW and not again
        assert r.report(OUE, "c")  # basic mechanisms too, params from the server
        unknown = r.report("no_such_metric", "x")
        assert unknown.status is ReportStatus.UNKNOWN_METRIC
        assert "not in the shuffler's config" in unknown.detail
        bad = r.report(OUE, "not-in-the-domain")
        assert bad.status is ReportStatus.INVALID_VALUE and "not-in-the-domain" in bad.detail
        assert r.queued == 2
        ids = [row.report.report_id for row in r._outbox.pending()]
        assert all(any(rid in f.read_bytes() for f in (tmp_path / "app").iterdir()) for rid in ids)
        assert r.flush(timeout=10) == 0
        assert r.counters() == {
            "delivered": 2,
            "no_config": 1,
            "unknown_metric": 1,
            "invalid_value": 1,
        }
        # a clear report would have been refused: a shuffler with keys takes sealed only
        config = r.config()
        assert config is not None and config.sealed
        assert config.window_seconds == 86400 and config.disposal_seconds[RAPPOR] == 30 * 86400
    # on disk: the encoded report, never the value; after the ack, not even its id
    for f in (tmp_path / "app").iterdir():
        assert b"example.com" not in f.read_bytes(), f
        for rid in ids:
            assert rid not in f.read_bytes(), f
    secret = tmp_path / "app" / "secret"
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == 32


def test_offline_reports_wait_on_disk_and_leave_after_a_restart(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    net = Forwarder(sealed_shuffler.port)
    app = tmp_path / "app"
    # the very first start offline: no config, so no report (and no claim) is made
    with _reporter(app, net.address, background=False) as r:
        assert r.flush(timeout=2) == 0  # tries to fetch one: unreachable
        assert r.report(RAPPOR, "a").status is ReportStatus.NO_CONFIG and r.queued == 0
        assert r.last_error is not None and "UNAVAILABLE" in r.last_error
    net.up()
    with _online(_reporter(app, net.address, background=False)) as r:
        assert r.report(RAPPOR, "a") and r.flush(timeout=10) == 0
    net.down()
    # offline now: the cached config makes the report; flush returns what is left
    with _reporter(app, net.address, background=False) as r:
        assert r.report(OUE, "b")
        assert r.flush(timeout=1.0) == 1  # no exception: one report still queued
    net.up()
    # the next start sends it in the background, unasked
    with _reporter(app, net.address) as r:
        assert eventually(lambda: r.queued == 0, 20.0, 0.02)
        assert r.counters()["delivered"] == 2


def test_network_available_sends_now_instead_of_after_the_backoff(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    net = Forwarder(sealed_shuffler.port)
    net.up()
    app = tmp_path / "app"
    with _online(_reporter(app, net.address, background=False)):
        pass  # the config is cached
    net.down()

    class Longest(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b  # the longest backoff the policy allows: ten minutes here

    with _reporter(app, net.address, backoff_base=600.0, backoff_cap=600.0, jitter=Longest()) as r:
        assert r.report(RAPPOR, "x")  # the sender tries, fails, backs off
        assert eventually(lambda: r.failed_attempts >= 1, 20.0, 0.02)
        net.up()
        assert r.report(OUE, "b")  # a new report does not cut the backoff short
        assert r.queued == 2
        r.network_available()
        assert eventually(lambda: r.queued == 0, 20.0, 0.02)


def test_sealing_required_never_sends_clear_reports_but_off_does(
    plain_shuffler: ShufflerHandle, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    target = f"127.0.0.1:{plain_shuffler.port}"
    with _reporter(tmp_path / "a", target, background=False) as r:
        assert r.flush(timeout=5) == 0  # the config: no key
        assert r.report(RAPPOR, "x")
        with caplog.at_level(logging.WARNING, logger="crowdmix.client"):
            assert r.flush(timeout=2) == 1  # kept, not downgraded
            assert r.flush(timeout=2) == 1
        assert r.last_error is not None and "takes clear reports only" in r.last_error
        warned = [m for m in caplog.messages if "takes clear reports only" in m]
        assert len(warned) == 1, caplog.messages  # said once, not at every try
    with _online(_reporter(tmp_path / "b", target, background=False, sealing="off")) as r:
        assert r.report(RAPPOR, "x") and r.flush(timeout=10) == 0


def _tamper_cached_config(app: Path, change: object, fetched: float | None = None) -> None:
    box = Outbox(app / "outbox.sqlite3")
    cached = box.cached_config()
    assert cached is not None
    answer = pb.ConfigResponse.FromString(cached[0])
    change(answer)  # type: ignore[operator]
    box.store_config(answer.SerializeToString(), cached[1] if fetched is None else fetched, 0.0)
    box.close()


def test_a_stale_key_is_refetched_once_and_the_report_resealed(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target, app = f"127.0.0.1:{sealed_shuffler.port}", tmp_path / "app"
    with _online(_reporter(app, target, background=False)) as r:
        assert r.report(OUE, "a") and r.flush(10) == 0

    def other_key(answer: pb.ConfigResponse) -> None:
        keys, _ = KeySet().with_new_key(int(time.time()) - 10)  # a key this shuffler never saw
        k = keys.keys[0]
        del answer.keys[:]
        answer.keys.add(key_id=k.key_id ^ 0x5A5A, suite=k.suite, public_key=k.public_key)

    _tamper_cached_config(app, other_key)
    with _reporter(app, target, background=False) as r:
        assert r.report(RAPPOR, "b")
        assert r.flush(timeout=10) == 0  # stale_key -> GetConfig -> sealed again
        assert r.counters() == {"delivered": 2}


def _older_params(answer: pb.ConfigResponse) -> None:  # as if the server changed f since
    for m in answer.metrics:
        if m.name == RAPPOR:
            r_ = m.rappor
            r_.f = 0.25
            params = RapporParams(k=r_.k, h=r_.h, m=r_.m, f=r_.f, p=r_.p, q=r_.q)
            m.params_fingerprint = params.fingerprint("mmh3")


def test_a_params_refusal_refetches_the_config_and_drops_what_cannot_be_counted(
    plain_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target, app = f"127.0.0.1:{plain_shuffler.port}", tmp_path / "app"
    with _online(_reporter(app, target, background=False, sealing="off")) as r:
        assert r.report(OUE, "a") and r.flush(10) == 0

    _tamper_cached_config(app, _older_params)
    with _reporter(app, target, background=False, sealing="off") as r:
        assert r.report(RAPPOR, "b")  # encoded under the outdated params
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"delivered": 1, "params_changed": 1}
        config = r.config()
        assert config is not None and config.metrics[RAPPOR].rappor.f == 0.5  # type: ignore[union-attr]


def test_an_expired_config_makes_the_report_and_the_sender_renews_it(tmp_path: Path) -> None:
    """``report`` never waits for the network: with an expired cached config it
    encodes under that config and wakes the sender, which fetches the new one; a
    report the new params no longer take is dropped and counted, and the next
    window's report is made under the new params."""
    now = [time.time()]  # one fake time for the device and the shuffler
    registry = make_registry(min_batch=1)
    app = tmp_path / "app"
    with start_shuffler(registry, tokens=frozenset({TOKEN}), clock=lambda: now[0]) as s:
        target = f"127.0.0.1:{s.port}"
        kw: dict[str, Any] = {"background": False, "sealing": "off"}
        kw |= {"clock": lambda: now[0], "monotonic": lambda: now[0]}
        with _online(_reporter(app, target, **kw)):
            pass
        _tamper_cached_config(app, _older_params, fetched=now[0] - 3601)  # past its hour
        with _reporter(app, target, **kw) as r:
            assert r.report(RAPPOR, "b")
            assert r._link is None  # made without touching the network
            assert r.flush(timeout=10) == 0
            assert r.counters() == {"params_changed": 1}
            now[0] += 86400  # the next window: the renewed config's params
            assert r.report(RAPPOR, "c") and r.flush(timeout=10) == 0
            assert r.counters() == {"params_changed": 1, "delivered": 1}


def test_a_report_whose_window_closed_is_dropped_and_counted_not_sent(tmp_path: Path) -> None:
    now = [time.time()]  # one fake time for the device and the shuffler
    store = MemoryStore()
    registry = make_registry(min_batch=1)
    with start_shuffler(registry, store, tokens=frozenset({TOKEN}), clock=lambda: now[0]) as s:
        target, app = f"127.0.0.1:{s.port}", tmp_path / "app"
        offline = Forwarder(s.port).address  # never up
        with _online(_reporter(app, target, background=False, sealing="off")):
            pass
        with _reporter(app, offline, background=False, sealing="off", clock=lambda: now[0]) as r:
            assert r.report(RAPPOR, "b") and r.flush(timeout=1) == 1
        now[0] += 2 * 86400  # two days later the report's window is closed
        with _reporter(app, target, background=False, sealing="off", clock=lambda: now[0]) as r:
            assert r.flush(timeout=10) == 0
            assert r.counters() == {"window_closed": 1}  # dropped, never sent
            assert r.report(RAPPOR, "c") and r.flush(timeout=10) == 0  # today's goes
    assert sum(store.pending(RAPPOR).values()) == 1


def test_a_full_outbox_refuses_the_new_report_and_claims_nothing(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{sealed_shuffler.port}"
    with _online(_reporter(tmp_path / "app", target, background=False, max_reports=1)) as r:
        assert r.report(RAPPOR, "a")
        full = r.report(OUE, "b")
        assert full.status is ReportStatus.OUTBOX_FULL and "1 reports" in full.detail
        assert r.counters() == {"outbox_full": 1}
        assert r.flush(10) == 0
        assert r.report(OUE, "b")  # room again, and the window was never claimed


def test_exit_offline_does_not_wait_behind_the_background_sender(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target, app = f"127.0.0.1:{sealed_shuffler.port}", tmp_path / "app"
    with _online(_reporter(app, target, background=False)):
        pass
    offline = Forwarder(sealed_shuffler.port).address  # never up
    r = _reporter(app, offline, timeout=30.0)
    assert r.report(RAPPOR, "b")  # the sender starts trying at once
    t0 = time.monotonic()
    assert r.flush(timeout=0.5) == 1  # no exception, and not 30 s behind the sender
    r.close()
    assert time.monotonic() - t0 < 10.0  # bounded by a connection wait (1 s), not `timeout`
    closed = r.report(RAPPOR, "c")
    assert closed.status is ReportStatus.CLOSED and r.flush() == 1 and r.queued == 1
