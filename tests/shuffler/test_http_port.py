"""The shuffler's HTTP port (Connect protocol, unary): the same Submit and GetConfig as
the gRPC port, from the same process and intake path, over HTTP/1.1 and HTTP/2 (h2c)."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import h2.connection
import h2.events
import pytest

from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.errors import ConfigError
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.server import ShufflerHandle, start_shuffler
from tests.shuffler.helpers import OUE, make_registry

TOKEN = "http-port-test-token-0123456789"
ORIGIN = "https://app.example"
PATH = "/crowdmix.v2.Shuffler/"
REGISTRY = make_registry(min_batch=1000, max_batch=2000)
FP = REGISTRY.metrics[OUE].fingerprint


def _window() -> int:
    return int(time.time() // REGISTRY.window_seconds)


def _request(n: int, *, start: int = 0, metric: str = OUE) -> bytes:
    return pb.SubmitRequest(
        reports=[
            pb.Report(
                metric=metric,
                bits=bytes([1 << (i % 5)]),
                params_fingerprint=FP,
                report_id=(start + i + 1).to_bytes(16, "little"),
                window=_window(),
            )
            for i in range(n)
        ],
        protocol=2,
    ).SerializeToString()


@pytest.fixture
def shuffler() -> Iterator[ShufflerHandle]:
    settings = ShufflerSettings(
        http_port=0, http_allow_origins=(ORIGIN,), max_request_bytes=64 * 1024
    )
    handle = start_shuffler(
        REGISTRY, MemoryStore(), None, settings=settings, tokens=frozenset({TOKEN})
    )
    yield handle
    handle.stop(1.0)


def post(
    handle: ShufflerHandle,
    method: str,
    body: bytes,
    *,
    token: str | None = TOKEN,
    headers: dict[str, str] | None = None,
    verb: str = "POST",
) -> tuple[int, bytes, dict[str, str]]:
    assert handle.http_port is not None
    conn = http.client.HTTPConnection("127.0.0.1", handle.http_port, timeout=10)
    h = {"content-type": "application/proto", "connect-protocol-version": "1"}
    if token is not None:
        h["authorization"] = f"Bearer {token}"
    h.update(headers or {})
    try:
        conn.request(verb, PATH + method, body=body, headers=h)
        resp = conn.getresponse()
        return resp.status, resp.read(), {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


def error(body: bytes) -> tuple[str, str]:
    doc = json.loads(body)
    return doc["code"], doc["message"]


def pending(handle: ShufflerHandle) -> int:
    return sum(handle.store.pending(OUE).values())


def test_submit_over_http_stores_the_reports_and_counts_them(shuffler: ShufflerHandle) -> None:
    status, body, headers = post(shuffler, "Submit", _request(5))
    assert status == 200 and headers["content-type"] == "application/proto"
    assert pb.SubmitResponse.FromString(body).accepted == 5
    assert pending(shuffler) == 5
    assert shuffler.metrics.accepted_reports._value.get() == 5
    assert shuffler.metrics.accepted_requests._value.get() == 1


def test_http_and_grpc_ports_share_one_intake(shuffler: ShufflerHandle) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{shuffler.port}") as channel:
        stub = crowdmix_pb2_grpc.ShufflerStub(channel)
        md = (("authorization", f"Bearer {TOKEN}"),)
        stub.Submit(pb.SubmitRequest.FromString(_request(3, start=100)), metadata=md)
        grpc_config = stub.GetConfig(pb.GetConfigRequest(), metadata=md)
    assert post(shuffler, "Submit", _request(4))[0] == 200
    assert pending(shuffler) == 7
    status, body, _ = post(shuffler, "GetConfig", b"")
    http_config = pb.ConfigResponse.FromString(body)
    assert status == 200
    http_config.ClearField("server_time")
    grpc_config.ClearField("server_time")
    assert http_config == grpc_config


@pytest.mark.parametrize(
    ("token", "code", "reason"),
    [
        (None, "unauthenticated", "no_token"),
        ("not-a-valid-token-at-all", "unauthenticated", "bad_token"),
    ],
)
def test_the_bearer_token_is_checked_as_on_the_grpc_port(
    shuffler: ShufflerHandle, token: str | None, code: str, reason: str
) -> None:
    for method, body in (("Submit", _request(1)), ("GetConfig", b"")):
        status, answer, _ = post(shuffler, method, body, token=token)
        assert status == 401
        assert error(answer)[0] == code and error(answer)[1].startswith(reason)
    assert pending(shuffler) == 0
    assert shuffler.metrics.rejected_requests.labels(reason)._value.get() == 2


@pytest.mark.parametrize(
    ("body", "status", "code", "reason"),
    [
        (b"\xff\xff\xff", 400, "invalid_argument", "malformed"),
        (_request(1, metric="nope"), 400, "invalid_argument", "unknown_metric"),
        (b"x" * (64 * 1024 + 1), 429, "resource_exhausted", "too_large"),
    ],
)
def test_refusals_carry_the_connect_code_and_the_reason(
    shuffler: ShufflerHandle, body: bytes, status: int, code: str, reason: str
) -> None:
    got, answer, headers = post(shuffler, "Submit", body)
    assert got == status and headers["content-type"] == "application/json"
    assert error(answer)[0] == code
    assert error(answer)[1].startswith(reason)
    assert pending(shuffler) == 0
    assert shuffler.metrics.rejected_requests.labels(reason)._value.get() == 1


def test_protocol_errors_are_refused_before_the_intake(shuffler: ShufflerHandle) -> None:
    assert (
        post(shuffler, "Submit", _request(1), headers={"content-type": "application/json"})[0]
        == 415
    )
    status, body, _ = post(shuffler, "Nope", b"")
    assert status == 501 and error(body)[0] == "unimplemented"
    assert post(shuffler, "Submit", b"", verb="GET")[0] == 405
    status, body, _ = post(shuffler, "Submit", _request(1), headers={"content-encoding": "br"})
    assert status == 501 and error(body)[0] == "unimplemented"
    status, body, _ = post(
        shuffler, "Submit", _request(1), headers={"connect-protocol-version": "2"}
    )
    assert status == 400
    assert pending(shuffler) == 0


def test_cors_answers_allowed_origins_only(shuffler: ShufflerHandle) -> None:
    status, _, headers = post(
        shuffler,
        "Submit",
        b"",
        verb="OPTIONS",
        headers={"origin": ORIGIN, "access-control-request-method": "POST"},
    )
    assert status == 204
    assert headers["access-control-allow-origin"] == ORIGIN
    assert "authorization" in headers["access-control-allow-headers"]
    status, _, headers = post(shuffler, "Submit", _request(1), headers={"origin": ORIGIN})
    assert status == 200 and headers["access-control-allow-origin"] == ORIGIN
    status, _, headers = post(
        shuffler, "Submit", b"", verb="OPTIONS", headers={"origin": "https://evil.example"}
    )
    assert status == 403 and "access-control-allow-origin" not in headers
    status, _, headers = post(
        shuffler, "Submit", _request(1), headers={"origin": "https://evil.example"}
    )
    assert "access-control-allow-origin" not in headers


def _h2c_post(port: int, method: str, body: bytes, n: int = 1) -> list[tuple[int, bytes]]:
    """``n`` POSTs on one HTTP/2 cleartext connection (prior knowledge), as streams."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    conn = h2.connection.H2Connection()
    conn.initiate_connection()
    streams: dict[int, dict[str, Any]] = {}
    for _ in range(n):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(
            sid,
            [
                (":method", "POST"),
                (":path", PATH + method),
                (":scheme", "http"),
                (":authority", f"127.0.0.1:{port}"),
                ("content-type", "application/proto"),
                ("authorization", f"Bearer {TOKEN}"),
            ],
        )
        conn.send_data(sid, body, end_stream=True)
        streams[sid] = {"status": 0, "data": b"", "done": False}
    sock.sendall(conn.data_to_send())
    try:
        while not all(s["done"] for s in streams.values()):
            data = sock.recv(65536)
            assert data, "the server closed the connection"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    streams[event.stream_id]["status"] = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    streams[event.stream_id]["data"] += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    streams[event.stream_id]["done"] = True
            sock.sendall(conn.data_to_send())
    finally:
        sock.close()
    return [(s["status"], s["data"]) for s in streams.values()]


def test_submit_over_http2_cleartext(shuffler: ShufflerHandle) -> None:
    assert shuffler.http_port is not None
    answers = _h2c_post(shuffler.http_port, "Submit", _request(2), n=3)
    assert [s for s, _ in answers] == [200, 200, 200]
    assert all(pb.SubmitResponse.FromString(d).accepted == 2 for _, d in answers)
    assert pending(shuffler) == 6  # same ids three times: the shuffler stores each copy


def test_a_busy_http_port_is_refused_at_start() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        from crowdmix.shuffler.errors import BindError

        with pytest.raises(BindError, match="HTTP"):
            start_shuffler(REGISTRY, MemoryStore(), None, settings=ShufflerSettings(http_port=port))


def test_bad_http_settings_name_the_field() -> None:
    with pytest.raises(ConfigError, match="http_port"):
        ShufflerSettings(http_port=70000)
    with pytest.raises(ConfigError, match="http_allow_origins"):
        ShufflerSettings(http_allow_origins="https://a.example")  # type: ignore[arg-type]


def test_the_rate_limit_is_per_http_connection() -> None:
    settings = ShufflerSettings(http_port=0, rate_limit_reports=5.0)
    handle = start_shuffler(REGISTRY, MemoryStore(), None, settings=settings)
    try:
        assert handle.http_port is not None
        first = http.client.HTTPConnection("127.0.0.1", handle.http_port, timeout=10)
        headers = {"content-type": "application/proto"}
        answers = []
        for start in (0, 10):  # one keep-alive connection: its bucket holds 5 reports/s
            first.request("POST", PATH + "Submit", body=_request(5, start=start), headers=headers)
            resp = first.getresponse()
            answers.append((resp.status, resp.read()))
        first.close()
        assert answers[0][0] == 200
        assert answers[1][0] == 429 and error(answers[1][1]) == (
            "resource_exhausted",
            "rate_limited: this connection is over its report rate",
        )
        assert post(handle, "Submit", _request(5, start=20), token=None)[0] == 200  # a new one
        assert pending(handle) == 10
    finally:
        handle.stop(1.0)


def test_with_tls_the_http_port_speaks_https_and_offers_h2(tmp_path: Path) -> None:
    from tests.redis_server import self_signed

    crt, key = self_signed(tmp_path)
    settings = ShufflerSettings(http_port=0, tls_cert=str(crt), tls_key=str(key))
    handle = start_shuffler(
        REGISTRY, MemoryStore(), None, settings=settings, tokens=frozenset({TOKEN})
    )
    try:
        assert handle.http_port is not None
        context = ssl.create_default_context(cafile=str(crt))
        context.set_alpn_protocols(["h2", "http/1.1"])
        with (
            socket.create_connection(("127.0.0.1", handle.http_port), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            assert tls.selected_alpn_protocol() == "h2"
        conn = http.client.HTTPSConnection(
            "127.0.0.1",
            handle.http_port,
            timeout=10,
            context=ssl.create_default_context(cafile=str(crt)),
        )
        conn.request(
            "POST",
            PATH + "Submit",
            body=_request(2),
            headers={"content-type": "application/proto", "authorization": f"Bearer {TOKEN}"},
        )
        resp = conn.getresponse()
        assert resp.status == 200 and pb.SubmitResponse.FromString(resp.read()).accepted == 2
        conn.close()
        with (
            pytest.raises(ConnectionError),
            socket.create_connection(("127.0.0.1", handle.http_port), timeout=10) as plain,
        ):  # plaintext is not served
            plain.sendall(b"POST " + PATH.encode() + b"Submit HTTP/1.1\r\nhost: x\r\n\r\n")
            if not plain.recv(100):
                raise ConnectionResetError
    finally:
        handle.stop(1.0)
