"""The shuffler's accept rule for the window a report names, at the window edges:
cur − tolerance ≤ w ≤ window_of(now + max_skew), else window_closed / window_ahead."""

from __future__ import annotations

import grpc
import pytest

from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.shuffler.config import ShufflerSettings
from crowdmix.shuffler.errors import ConfigError, WindowRefused
from crowdmix.shuffler.memory_store import MemoryStore
from crowdmix.shuffler.windows import WindowRule
from tests.shuffler.helpers import RAPPOR, make_registry, serving, submit_request

DAY = 86400
W = 20_000  # the current window in the table below
T = W * DAY  # its first second

# (now, window named, tolerance, max skew) -> None (taken) or the refusal's reason
EDGES = [
    # the current window, from its first to its last moment
    (T, W, 1, 60, None),
    (T + DAY - 0.001, W, 1, 60, None),
    # the window before: taken with tolerance 1, not with 0; two before: never
    (T, W - 1, 1, 60, None),
    (T + DAY - 0.001, W - 1, 1, 60, None),
    (T, W - 1, 0, 60, "window_closed"),
    (T, W - 2, 1, 60, "window_closed"),
    (T + DAY - 0.001, W - 2, 1, 60, "window_closed"),
    (T, W - 2, 2, 60, None),
    (T, 0, 1, 60, "window_closed"),
    # the window after: only within max_skew of its start
    (T + DAY - 60, W + 1, 1, 60, None),
    (T + DAY - 60.001, W + 1, 1, 60, "window_ahead"),
    (T, W + 1, 1, 60, "window_ahead"),
    (T + DAY - 1, W + 1, 1, 0, "window_ahead"),
    (T + DAY - 1, W + 2, 1, 60, "window_ahead"),
    (T, 2**32 - 1, 1, 60, "window_ahead"),
    # the moment the window turns: W is now the one before
    (T + DAY, W, 1, 60, None),
    (T + DAY, W, 0, 60, "window_closed"),
    (T + 2 * DAY, W, 1, 60, "window_closed"),
]


@pytest.mark.parametrize(("now", "window", "tolerance", "skew", "refusal"), EDGES)
def test_accept_rule_at_the_window_edges(
    now: float, window: int, tolerance: int, skew: float, refusal: str | None
) -> None:
    rule = WindowRule(window_seconds=DAY, tolerance=tolerance, max_skew_seconds=skew)
    if refusal is None:
        rule.check(window, now)
        first, last = rule.accepted(now)
        assert first <= window <= last
        assert now < rule.closed_at(window)
    else:
        with pytest.raises(WindowRefused) as info:
            rule.check(window, now)
        assert info.value.reason == refusal
        assert str(info.value).startswith(f"window {window} ")


def test_a_window_closes_when_the_rule_first_refuses_it() -> None:
    rule = WindowRule(window_seconds=3600, tolerance=1, max_skew_seconds=60)
    closes = rule.closed_at(W)
    assert closes == (W + 2) * 3600
    rule.check(W, closes - 0.001)
    with pytest.raises(WindowRefused, match="closed"):
        rule.check(W, closes)


@pytest.mark.parametrize(
    ("tolerance", "skew", "field"),
    [
        (-1, 60, "window_tolerance"),
        (True, 60, "window_tolerance"),
        (1, -1, "max_clock_skew_seconds"),
        (1, float("inf"), "max_clock_skew_seconds"),
        (1, DAY, "max_clock_skew_seconds"),
    ],
)
def test_bad_rule_settings_name_the_field(tolerance: int, skew: float, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        WindowRule(window_seconds=DAY, tolerance=tolerance, max_skew_seconds=skew)


def test_the_server_refuses_by_window_and_protocol_with_reasons_and_files_the_rest() -> None:
    """Over real gRPC: the status code and details prefix the SDK acts on, nothing stored
    of a refused request, and what is taken is filed under the window it names."""
    now = [T + DAY - 30.0]  # 30 s before window W + 1 starts: W + 1 is within the skew
    registry = make_registry()
    fp = registry[RAPPOR].fingerprint
    store = MemoryStore()

    def row() -> pb.Report:
        return pb.Report(metric=RAPPOR, cohort=1, bits=b"\x01\x00", params_fingerprint=fp)

    with serving(registry, store, settings=ShufflerSettings(), clock=lambda: now[0]) as (_, stub):
        for window, code, reason in (
            (W - 2, grpc.StatusCode.FAILED_PRECONDITION, "window_closed: "),
            (W + 2, grpc.StatusCode.FAILED_PRECONDITION, "window_ahead: "),
        ):
            with pytest.raises(grpc.RpcError) as info:
                stub.Submit(submit_request(reports=[row()], window=window), timeout=10)
            assert info.value.code() == code
            assert info.value.details().startswith(reason)
        # one report of a refused window sinks the whole request
        mixed = submit_request(reports=[row(), row()], window=W)
        mixed.reports[1].window = W - 2
        with pytest.raises(grpc.RpcError) as info:
            stub.Submit(mixed, timeout=10)
        assert info.value.details().startswith("window_closed: ")
        for protocol in (0, 1, 3):
            with pytest.raises(grpc.RpcError) as info:
                stub.Submit(submit_request(reports=[row()], protocol=protocol), timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert info.value.details().startswith("protocol_unsupported: ")
        assert store.pending(RAPPOR) == {}

        for window, n in ((W - 1, 2), (W, 3), (W + 1, 4)):
            request = submit_request(reports=[row() for _ in range(n)], window=window)
            assert stub.Submit(request, timeout=10).accepted == n
        pending = {key.window: count for key, count in store.pending(RAPPOR).items()}
        assert pending == {W - 1: 2, W: 3, W + 1: 4}

        answer = stub.GetConfig(pb.GetConfigRequest(), timeout=10)
        assert (answer.window, answer.server_time) == (W, now[0])
