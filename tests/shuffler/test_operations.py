"""Configuration, limits, health, metrics endpoint, TLS, graceful stop."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.config import ShufflerSettings, load_config, load_tokens
from crowdmix.shuffler.errors import ConfigError
from crowdmix.shuffler.intake import RateLimiter
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import start_shuffler
from tests.redis_server import self_signed
from tests.shuffler.helpers import (
    RAPPOR,
    REGISTRY_TOML,
    RecordingAggregator,
    make_registry,
    serving,
    submit_request,
)
from tests.shuffler.test_pipeline import columns_request
from tests.waiting import eventually

REGISTRY = make_registry()
FP = REGISTRY[RAPPOR].fingerprint


def write(tmp: Path, extra: str = "") -> Path:
    p = tmp / "m.toml"
    p.write_text(REGISTRY_TOML.format(min_batch=10, max_batch=20, max_delay=1.0) + extra)
    return p


def test_config_table_and_flags_merge(tmp_path: Path) -> None:
    path = write(tmp_path, '\n[shuffler]\nlisten = "127.0.0.1:9000"\nmax_concurrent_rpcs = 7\n')
    registry, settings = load_config(path, {"max_concurrent_rpcs": 9, "redis": None})
    assert RAPPOR in registry.metrics
    assert settings.listen == "127.0.0.1:9000" and settings.max_concurrent_rpcs == 9


def test_window_rule_settings_from_the_table_and_flags(tmp_path: Path) -> None:
    path = write(tmp_path, "\n[shuffler]\nwindow_tolerance = 2\nmax_clock_skew_seconds = 30\n")
    _, settings = load_config(path, {"max_clock_skew_seconds": 45.0})
    assert (settings.window_tolerance, settings.max_clock_skew_seconds) == (2, 45.0)
    assert (ShufflerSettings().window_tolerance, ShufflerSettings().max_clock_skew_seconds) == (
        1,
        60.0,
    )
    for table, field in (
        ("window_tolerance = -1", "window_tolerance"),
        ("max_clock_skew_seconds = -1", "max_clock_skew_seconds"),
        ("max_clock_skew_seconds = 86400", "max_clock_skew_seconds"),  # a whole window
        ('server = "aio"', "server"),  # settings of servers long gone are unknown fields
    ):
        with pytest.raises(ConfigError, match=field):
            load_config(write(tmp_path, f"\n[shuffler]\n{table}\n"))


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ('\n[shuffler]\nlisten = "nowhere"\n', "listen"),
        ("\n[shuffler]\nmax_request_bytes = 0\n", "max_request_bytes"),
        ("\n[shuffler]\nrate_limit_reports = -1\n", "rate_limit_reports"),
        ('\n[shuffler]\ntls_cert = "a.pem"\n', "tls_cert"),
        ("\n[shuffler]\nbogus = 1\n", "bogus"),
        ('\n[shuffler]\nredis = "http://x"\n', "redis"),
        (
            '\n[metrics.x]\nencoding = "rappor"\nk = 0\nh = 2\nm = 4\nf = 0.5\np = 0.5\nq = 0.75\n',
            "'x': k",
        ),
        ("\n[metrics.x]\nk = 16\n", "'x': encoding is required"),
        ("\n[shuffler]\ninflight_retry_seconds = 30\n", "inflight_retry_seconds"),
        ("\n[shuffler]\nforward_timeout_seconds = 0\n", "forward_timeout_seconds"),
        # a wrong type is refused by name, not met later as an AttributeError or taken
        ("\n[shuffler]\nlisten = 7400\n", "listen must be a string"),
        ('\n[shuffler]\nredis = ""\n', "redis must be a redis://"),
        ("\n[shuffler]\naggregator = 7500\n", "aggregator must be a string"),
        ("\n[shuffler]\ntokens_file = 1\n", "tokens_file must be a string"),
        ("\n[shuffler]\ntls_cert = true\ntls_key = true\n", "tls_cert must be a string"),
        ('\n[shuffler]\nallow_unauthenticated = "false"\n', "allow_unauthenticated must be"),
        ("\n[shuffler]\nreuse_port = 1\n", "reuse_port must be"),
    ],
)
def test_bad_config_names_the_field(tmp_path: Path, extra: str, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        load_config(write(tmp_path, extra))


def test_a_batch_is_re_offered_only_after_its_forward_deadline() -> None:
    """A batch still inside its forward deadline must not be sent twice: the default
    re-offer age is twice the forward timeout, and a shorter one is refused."""
    from crowdmix.shuffler.aggregator_client import AggregatorSender
    from crowdmix.shuffler.forwarding import Releaser

    settings = ShufflerSettings()
    assert settings.inflight_retry_seconds == 2 * settings.forward_timeout_seconds == 60
    with pytest.raises(ConfigError, match="must exceed forward_timeout_seconds"):
        ShufflerSettings(forward_timeout_seconds=5.0, inflight_retry_seconds=5.0)
    sender = AggregatorSender("127.0.0.1:1", timeout=10.0)
    try:
        with pytest.raises(ValueError, match="must exceed the forward timeout"):
            Releaser(make_registry(), MemoryStore(), sender, inflight_retry_seconds=10.0)
        Releaser(make_registry(), MemoryStore(), sender, inflight_retry_seconds=20.0)
    finally:
        sender.close()


def test_tokens_file(tmp_path: Path) -> None:
    p = tmp_path / "tokens"
    p.write_text("# comment\napp-one abcdefghijklmnop0\n\nqrstuvwxyz0123456789\n")
    assert load_tokens(p) == {"abcdefghijklmnop0", "qrstuvwxyz0123456789"}
    p.write_text("short\n")
    with pytest.raises(ConfigError, match="16"):
        load_tokens(p)
    with pytest.raises(ConfigError, match="tokens_file"):
        load_tokens(tmp_path / "missing")


def test_rate_limiter_token_bucket() -> None:
    now = [0.0]
    limiter = RateLimiter(100.0, monotonic=lambda: now[0])
    assert limiter.admit("c1", 100)
    assert not limiter.admit("c1", 1)  # bucket empty
    assert limiter.admit("c2", 50)  # other connections have their own bucket
    now[0] = 0.5
    assert limiter.admit("c1", 50) and not limiter.admit("c1", 1)
    now[0] = 2.0
    assert limiter.admit("c1", 1000)  # a big request may go into debt...
    now[0] = 3.0
    assert not limiter.admit("c1", 1)  # ...which is paid back before the next one


def own_connection(port: int) -> grpc.Channel:
    """A channel with its own TCP connection (grpc shares connections between channels
    to one target by default, and the rate limit is per connection)."""
    return grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )


def test_rate_limit_and_buffer_bound_are_resource_exhausted() -> None:
    settings = ShufflerSettings(rate_limit_reports=100.0, max_buffered_reports=250)
    store = MemoryStore()
    handle = start_shuffler(REGISTRY, store, None, settings=settings)
    try:
        with own_connection(handle.port) as ch:
            stub = crowdmix_pb2_grpc.ShufflerStub(ch)
            assert stub.Submit(columns_request(np.arange(100), FP)).accepted == 100
            with pytest.raises(grpc.RpcError) as err:
                stub.Submit(columns_request(np.arange(100), FP))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert err.value.details().startswith("rate_limited")
        with own_connection(handle.port) as ch2:  # a new connection
            stub = crowdmix_pb2_grpc.ShufflerStub(ch2)
            assert stub.Submit(columns_request(np.arange(100), FP)).accepted == 100
        with own_connection(handle.port) as ch3:
            stub = crowdmix_pb2_grpc.ShufflerStub(ch3)
            with pytest.raises(grpc.RpcError) as err:
                stub.Submit(columns_request(np.arange(100), FP))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert err.value.details().startswith("buffer_full")
    finally:
        handle.stop(grace=1)
    assert sum(store.pending(RAPPOR).values()) == 200
    rejected = handle.metrics.rejected_requests
    assert rejected.labels("rate_limited")._value.get() == 1
    assert rejected.labels("buffer_full")._value.get() == 1


def test_calls_beyond_max_concurrent_rpcs_are_resource_exhausted() -> None:
    """Calls held by a slow store count against the limit; the excess is refused
    before it is read, and only acknowledged requests are stored."""
    from tests.shuffler.test_pipeline import SlowStore

    settings = ShufflerSettings(max_concurrent_rpcs=4)
    store = SlowStore()
    with serving(REGISTRY, store, None, settings=settings) as (_, stub):
        futures = [
            stub.Submit.future(columns_request(np.arange(10), FP), timeout=10) for _ in range(40)
        ]
        codes = [f.code() for f in futures]
    ok = codes.count(grpc.StatusCode.OK)
    exhausted = codes.count(grpc.StatusCode.RESOURCE_EXHAUSTED)
    assert ok + exhausted == 40
    assert ok >= 4 and exhausted >= 1
    assert sum(store.pending(RAPPOR).values()) == 10 * ok


def _three_message_stream(
    store: MemoryStore,
    settings: ShufflerSettings,
    send: Callable[[list[pb.SubmitRequest]], Iterator[pb.SubmitRequest]] = iter,
) -> pytest.ExceptionInfo[grpc.RpcError]:
    """A SubmitStream of three messages of three reports each (``send`` yields them) to a
    shuffler on ``store``, which refuses the stream: what it answered."""
    with serving(REGISTRY, store, None, settings=settings) as (_, stub):
        messages = [columns_request(np.arange(3), FP) for _ in range(3)]
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitStream(send(messages), timeout=10)
    return err


def test_a_stream_failing_after_stored_messages_says_what_it_stored() -> None:
    """buffer_full stops a stream after part of it is stored: the answer keeps its own
    status (RESOURCE_EXHAUSTED: retry later, which report ids make safe) and says how
    much was stored, in the details and in the trailing metadata."""
    store = MemoryStore()
    err = _three_message_stream(store, ShufflerSettings(max_buffered_reports=5))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "buffer" in err.value.details()
    stored = sum(store.pending(RAPPOR).values())
    assert stored in (3, 6)  # whole messages only; the second may overlap
    assert err.value.details().startswith(f"stored {stored} report(s) of {stored // 3} message")
    trailing = dict(err.value.trailing_metadata())
    assert trailing["crowdmix-stored-reports"] == str(stored)
    assert trailing["crowdmix-stored-messages"] == str(stored // 3)


def test_a_streams_stored_count_is_a_prefix_when_a_later_commit_succeeds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two commits of a stream overlap. When message 2's write fails and message 3's
    (already under way) succeeds, the answer counts only the prefix (message 1) and
    says that later reports were stored too: a sender without ids that resends the
    messages after the first M must know some of them may count twice.
    (A wrong answer here once said "6 reports of 2 messages".)"""
    import asyncio

    from crowdmix.shuffler.commit import GroupCommitter
    from crowdmix.shuffler.errors import StoreUnavailable

    real_write = GroupCommitter._write
    rounds = [0]

    async def second_write_fails(self: GroupCommitter, requests: object) -> object:
        rounds[0] += 1
        mine = rounds[0]
        await asyncio.sleep(0.2)  # long enough for the next message's commit to queue
        if mine == 2:
            return StoreUnavailable("redis blip")
        return await real_write(self, requests)  # type: ignore[arg-type]

    monkeypatch.setattr(GroupCommitter, "_write", second_write_fails)

    def paced(messages: list[pb.SubmitRequest]) -> Iterator[pb.SubmitRequest]:
        for message, pause in zip(messages, (0.25, 0.05, 0.0), strict=True):
            yield message
            time.sleep(pause)

    store = MemoryStore()
    err = _three_message_stream(store, ShufflerSettings(), send=paced)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    stored = sum(store.pending(RAPPOR).values())
    trailing = dict(err.value.trailing_metadata())
    assert trailing["crowdmix-stored-messages"] == "1"  # the prefix: message 1 only
    assert trailing["crowdmix-stored-reports"] == "3"
    if stored == 6:  # message 3's commit overlapped and succeeded: said, not counted
        assert "3 report(s) of later messages were stored too" in err.value.details()
    else:
        assert stored == 3


def test_max_concurrent_rpcs_is_validated() -> None:
    with pytest.raises(ConfigError, match="max_concurrent_rpcs"):
        ShufflerSettings(max_concurrent_rpcs=0)


def test_health_and_prometheus_endpoint(aggregator: RecordingAggregator) -> None:
    settings = ShufflerSettings(metrics_port=0, tick_seconds=0.01)
    registry = make_registry(min_batch=10, max_batch=10)
    handle = start_shuffler(registry, MemoryStore(), aggregator.target, settings=settings)
    try:
        with grpc.insecure_channel(f"127.0.0.1:{handle.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            for service in ("", "crowdmix.v2.Shuffler"):
                resp = health.Check(health_pb2.HealthCheckRequest(service=service))
                assert resp.status == health_pb2.HealthCheckResponse.SERVING
            stub = crowdmix_pb2_grpc.ShufflerStub(ch)
            stub.Submit(columns_request(np.arange(25), FP))
            with pytest.raises(grpc.RpcError):
                stub.Submit(submit_request())
        eventually(lambda: aggregator.total() >= 20, 10, 0.02)
        assert handle.metrics_port
        time.sleep(0.1)
        url = f"http://127.0.0.1:{handle.metrics_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        handle.stop(grace=1)
    assert "crowdmix_shuffler_accepted_reports_total 25.0" in text
    assert 'crowdmix_shuffler_rejected_requests_total{reason="empty"} 1.0' in text
    assert f'crowdmix_shuffler_batches_forwarded_total{{metric="{RAPPOR}"}} 2.0' in text
    assert f'crowdmix_shuffler_pending_reports{{metric="{RAPPOR}"}} 5.0' in text
    assert "crowdmix_shuffler_request_latency_seconds_count" in text
    assert "crowdmix_shuffler_forward_failures_total 0.0" in text


def test_graceful_stop_flushes_releasable_reports(aggregator: RecordingAggregator) -> None:
    registry = make_registry(min_batch=10, max_batch=1000, max_delay=3600)
    handle = start_shuffler(registry, MemoryStore(), aggregator.target)
    with grpc.insecure_channel(f"127.0.0.1:{handle.port}") as ch:
        crowdmix_pb2_grpc.ShufflerStub(ch).Submit(columns_request(np.arange(40), FP))
    assert aggregator.total() == 0  # max_delay is an hour away
    handle.stop(grace=5)
    assert aggregator.total() == 40
    with pytest.raises(grpc.RpcError), grpc.insecure_channel(f"127.0.0.1:{handle.port}") as ch:
        crowdmix_pb2_grpc.ShufflerStub(ch).Submit(columns_request(np.arange(40), FP), timeout=2)


def test_tls_and_token(tmp_path: Path) -> None:
    crt, key = self_signed(tmp_path)
    tokens = tmp_path / "tokens"
    tokens.write_text("app 0123456789abcdef-token\n")
    settings = ShufflerSettings(tls_cert=str(crt), tls_key=str(key), tokens_file=str(tokens))
    handle = start_shuffler(REGISTRY, MemoryStore(), None, settings=settings)
    try:
        creds = grpc.ssl_channel_credentials(root_certificates=crt.read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{handle.port}", creds) as ch:
            stub = crowdmix_pb2_grpc.ShufflerStub(ch)
            meta = (("authorization", "Bearer 0123456789abcdef-token"),)
            assert stub.Submit(columns_request(np.arange(3), FP), metadata=meta).accepted == 3
            with pytest.raises(grpc.RpcError) as err:
                stub.Submit(columns_request(np.arange(3), FP))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        plain = grpc.insecure_channel(f"127.0.0.1:{handle.port}")
        with plain, pytest.raises(grpc.RpcError):  # plaintext is not served
            crowdmix_pb2_grpc.ShufflerStub(plain).Submit(
                columns_request(np.arange(3), FP), timeout=2
            )
    finally:
        handle.stop(grace=1)


def test_example_registry_loads() -> None:
    path = Path(__file__).resolve().parents[2] / "deploy" / "metrics.example.toml"
    registry, settings = load_config(path)
    assert set(registry.metrics) == {"home_page", "browser"}
    assert settings.listen == "127.0.0.1:7400" and settings.redis is None


def test_the_tables_switches_hold_when_their_flags_are_not_given(tmp_path: Path) -> None:
    """``allow_unauthenticated`` and ``reuse_port`` in ``[shuffler]`` (docs/operating.md)
    are used by ``crowdmix shuffler serve`` when ``--allow-unauthenticated`` and
    ``--reuse-port`` are absent: an absent switch is not a "false" that overrides the
    table. The first daemon starts without ``--tokens``; the second binds its port."""
    import os
    import signal
    import subprocess
    import sys

    config = write(tmp_path, "\n[shuffler]\nallow_unauthenticated = true\nreuse_port = true\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    procs: list[subprocess.Popen[bytes]] = []

    def serve(name: str, listen: str) -> int:
        port_file = tmp_path / f"{name}.port"
        args = ["--config", str(config), "--listen", listen, "--port-file", str(port_file)]
        log = (tmp_path / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "crowdmix", "shuffler", "serve", *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        procs.append(proc)
        started = eventually(lambda: port_file.exists() or proc.poll() is not None, 60, 0.05)
        assert started and proc.poll() is None, (tmp_path / f"{name}.log").read_text()
        return int(port_file.read_text())

    try:
        port = serve("first", "127.0.0.1:0")
        assert serve("second", f"127.0.0.1:{port}") == port
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        assert [proc.wait(timeout=60) for proc in procs] == [0, 0]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
