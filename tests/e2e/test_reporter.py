"""``client.Reporter`` against a real in-process shuffler (gRPC on loopback).

The network going away and coming back is a real TCP forwarder on loopback that
the test opens and closes; offline means connections are refused, as on a
device without a route. What each test proves is in its name.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from crowdmix import client
from crowdmix.aggregator.sealing.keys import KeySet, save_keyset, write_public_config
from crowdmix.client.outbox import Outbox
from crowdmix.client.params import RapporParams
from crowdmix.cluster import free_port
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.shuffler.helpers import OUE, RAPPOR, make_registry

pytestmark = pytest.mark.slow  # real processes or servers, seconds each

TOKEN = "app-token-123"


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
            b = socket.create_connection(("127.0.0.1", self._target))
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


def _public_keys(directory: Path) -> Path:
    now = int(time.time())
    keys, _ = KeySet().with_new_key(now)
    save_keyset(directory / "keys.json", keys, now=now, create=True)
    write_public_config(directory / "public.json", keys, now=now)
    return directory / "public.json"


@pytest.fixture
def sealed_shuffler(tmp_path: Path) -> Iterator[ShufflerHandle]:
    settings = ShufflerSettings(public_keys=str(_public_keys(tmp_path)))
    with start_shuffler(
        make_registry(min_batch=1), settings=settings, tokens=frozenset({TOKEN})
    ) as s:
        yield s


@pytest.fixture
def plain_shuffler() -> Iterator[ShufflerHandle]:
    with start_shuffler(make_registry(min_batch=1), tokens=frozenset({TOKEN})) as s:
        yield s


def _reporter(app: Path, target: str, **kw: object) -> client.Reporter:
    return client.Reporter(app, target, token=TOKEN, tls=False, **kw)  # type: ignore[arg-type]


def _wait(cond: object, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():  # type: ignore[operator]
            return True
        time.sleep(0.02)
    return False


def test_the_app_names_the_metric_and_the_report_is_sealed_and_acknowledged(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{sealed_shuffler.port}"
    with _reporter(tmp_path / "app", target, background=False) as r:
        assert r.report(RAPPOR, "example.com") is True
        for f in (tmp_path / "app").iterdir():  # waiting: the encoded bits, not the value
            assert b"example.com" not in f.read_bytes(), f
        assert r.report(RAPPOR, "example.com") is False  # this window's report is made
        assert r.report(OUE, "c") is True  # basic mechanisms too, params from the server
        with pytest.raises(client.ParamsError, match="not in the shuffler's config"):
            r.report("no_such_metric", "x")
        with pytest.raises(ValueError):
            r.report(OUE, "not-in-the-domain")
        assert r.queued == 2
        ids = [row.report.report_id for row in r._outbox.pending()]
        assert all(any(rid in f.read_bytes() for f in (tmp_path / "app").iterdir()) for rid in ids)
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"delivered": 2}
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
        assert r.report(RAPPOR, "a") is False and r.queued == 0
        assert r.last_error is not None and "UNAVAILABLE" in r.last_error
    net.up()
    with _reporter(app, net.address, background=False) as r:
        assert r.report(RAPPOR, "a") is True and r.flush(timeout=10) == 0
    net.down()
    # offline now: the cached config makes the report; flush returns what is left
    with _reporter(app, net.address, background=False) as r:
        assert r.report(OUE, "b") is True
        t0 = time.monotonic()
        assert r.flush(timeout=1.0) == 1  # no exception: one report still queued
        assert time.monotonic() - t0 < 5.0
    net.up()
    # the next start sends it in the background, unasked
    with _reporter(app, net.address) as r:
        assert _wait(lambda: r.queued == 0)
        assert r.counters()["delivered"] == 2


def test_network_available_sends_now_instead_of_after_the_backoff(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    net = Forwarder(sealed_shuffler.port)
    net.up()
    app = tmp_path / "app"
    with _reporter(app, net.address, background=False) as r:
        r.config() or r.report(OUE, "a")  # fetch and cache the config
        assert r.flush(10) == 0
    net.down()

    class Longest(random.Random):
        def uniform(self, a: float, b: float) -> float:
            return b  # the longest backoff the policy allows: ten minutes here

    with _reporter(app, net.address, backoff_base=600.0, backoff_cap=600.0, jitter=Longest()) as r:
        assert r.report(RAPPOR, "x") is True  # the sender tries, fails, backs off
        # (last_error alone is not enough: a config refresh in report() can set it
        # while the sender is still waiting for its first connection)
        assert _wait(lambda: r.failed_attempts >= 1)
        net.up()
        time.sleep(0.5)
        assert r.queued == 1  # still backing off
        r.network_available()
        assert _wait(lambda: r.queued == 0)


def test_sealing_required_never_sends_clear_reports_but_off_does(
    plain_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{plain_shuffler.port}"
    with _reporter(tmp_path / "a", target, background=False) as r:
        assert r.report(RAPPOR, "x") is True
        assert r.flush(timeout=2) == 1  # kept, not downgraded
        assert r.last_error is not None and "publishes no aggregator key" in r.last_error
    with _reporter(tmp_path / "b", target, background=False, sealing="off") as r:
        assert r.report(RAPPOR, "x") is True and r.flush(timeout=10) == 0


def _tamper_cached_config(app: Path, change: object) -> None:
    box = Outbox(app / "outbox.sqlite3")
    cached = box.cached_config()
    assert cached is not None
    answer = pb.ConfigResponse.FromString(cached[0])
    change(answer)  # type: ignore[operator]
    box.store_config(answer.SerializeToString(), time.time())
    box.close()


def test_a_stale_key_is_refetched_once_and_the_report_resealed(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target, app = f"127.0.0.1:{sealed_shuffler.port}", tmp_path / "app"
    with _reporter(app, target, background=False) as r:
        assert r.report(OUE, "a") and r.flush(10) == 0

    def other_key(answer: pb.ConfigResponse) -> None:
        keys, _ = KeySet().with_new_key(int(time.time()) - 10)  # a key this shuffler never saw
        k = keys.keys[0]
        del answer.keys[:]
        answer.keys.add(key_id=k.key_id ^ 0x5A5A, suite=k.suite, public_key=k.public_key)

    _tamper_cached_config(app, other_key)
    with _reporter(app, target, background=False) as r:
        assert r.report(RAPPOR, "b") is True
        assert r.flush(timeout=10) == 0  # stale_key -> GetConfig -> sealed again
        assert r.counters() == {"delivered": 2}


def test_a_params_refusal_refetches_the_config_and_drops_what_cannot_be_counted(
    plain_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target, app = f"127.0.0.1:{plain_shuffler.port}", tmp_path / "app"
    with _reporter(app, target, background=False, sealing="off") as r:
        assert r.report(OUE, "a") and r.flush(10) == 0

    def older_params(answer: pb.ConfigResponse) -> None:  # as if the server changed f since
        for m in answer.metrics:
            if m.name == RAPPOR:
                r_ = m.rappor
                r_.f = 0.25
                params = RapporParams(k=r_.k, h=r_.h, m=r_.m, f=r_.f, p=r_.p, q=r_.q)
                m.params_fingerprint = params.fingerprint("mmh3")

    _tamper_cached_config(app, older_params)
    with _reporter(app, target, background=False, sealing="off") as r:
        assert r.report(RAPPOR, "b") is True  # encoded under the outdated params
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"delivered": 1, "params_changed": 1}
        config = r.config()
        assert config is not None and config.metrics[RAPPOR].rappor.f == 0.5  # type: ignore[union-attr]


def test_old_reports_are_dropped_and_counted_not_sent(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target, app = f"127.0.0.1:{sealed_shuffler.port}", tmp_path / "app"
    now = time.time()
    offline = Forwarder(sealed_shuffler.port).address  # never up
    with _reporter(app, target, background=False) as r:  # caches the config
        assert r.report(OUE, "a") and r.flush(10) == 0
    with _reporter(app, offline, background=False) as r:
        assert r.report(RAPPOR, "b") is True
        assert r.report(OUE, "c") is False  # window used by the delivery above
    box = Outbox(app / "outbox.sqlite3")
    (row,) = box.pending()
    box.close()
    # 40 days later the window lies past the 30-day disposal age
    with _reporter(app, target, background=False, clock=lambda: now + 40 * 86400) as r:
        assert r.flush(timeout=10) == 0
        assert r.counters()["expired"] == 1 and r.counters()["delivered"] == 1
    # a report whose first attempt is two windows back is not sent again
    app2 = tmp_path / "app2"
    with _reporter(app2, target, background=False) as r:
        assert r.report(OUE, "a") is True
    box = Outbox(app2 / "outbox.sqlite3")
    (row,) = box.pending()
    box.begin_send([row.report.report_id], int(now // 86400))  # outcome never learnt
    box.close()
    with _reporter(app2, target, background=False, clock=lambda: now + 2 * 86400) as r:
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"unconfirmed": 1}


def test_a_full_outbox_refuses_the_new_report_and_claims_nothing(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target = f"127.0.0.1:{sealed_shuffler.port}"
    with _reporter(tmp_path / "app", target, background=False, max_reports=1) as r:
        assert r.report(RAPPOR, "a") is True
        assert r.report(OUE, "b") is False  # full: refused, not claimed
        assert r.counters() == {"refused_full": 1}
        assert r.flush(10) == 0
        assert r.report(OUE, "b") is True  # room again, and the window was never claimed


def test_exit_offline_does_not_wait_behind_the_background_sender(
    sealed_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target, app = f"127.0.0.1:{sealed_shuffler.port}", tmp_path / "app"
    with _reporter(app, target, background=False) as r:  # caches the config
        assert r.report(OUE, "a") and r.flush(10) == 0
    offline = Forwarder(sealed_shuffler.port).address  # never up
    r = _reporter(app, offline, timeout=30.0)
    assert r.report(RAPPOR, "b") is True  # the sender starts trying at once
    t0 = time.monotonic()
    assert r.flush(timeout=0.5) == 1  # no exception, and not 30 s behind the sender
    r.close()
    assert time.monotonic() - t0 < 10.0  # bounded by a connection wait (1 s), not `timeout`
    with pytest.raises(client.CrowdmixClientError, match="closed"):
        r.report(RAPPOR, "c")


def test_an_expired_cached_config_is_refreshed_before_a_report(
    plain_shuffler: ShufflerHandle, tmp_path: Path
) -> None:
    target, app = f"127.0.0.1:{plain_shuffler.port}", tmp_path / "app"
    with _reporter(app, target, background=False, sealing="off") as r:
        assert r.report(OUE, "a") and r.flush(10) == 0

    def older_params(answer: pb.ConfigResponse) -> None:
        for m in answer.metrics:
            if m.name == RAPPOR:
                r_ = m.rappor
                r_.f = 0.25
                params = RapporParams(k=r_.k, h=r_.h, m=r_.m, f=r_.f, p=r_.p, q=r_.q)
                m.params_fingerprint = params.fingerprint("mmh3")

    _tamper_cached_config(app, older_params)
    box = Outbox(app / "outbox.sqlite3")
    cached = box.cached_config()
    assert cached is not None
    box.store_config(cached[0], time.time() - 3601)  # older than its cache_seconds (3600)
    box.close()
    with _reporter(app, target, background=False, sealing="off") as r:
        assert r.report(RAPPOR, "b") is True  # encoded under the server's params, fetched now
        assert r.flush(timeout=10) == 0
        assert r.counters() == {"delivered": 2}
