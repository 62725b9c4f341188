"""The delivery policy as a table: rows, config, time and sender state in, one action out.

No SQLite, no gRPC: ``crowdmix.client.delivery.decide`` is a pure function; the
reporter only does what it answers (tests/e2e/test_reporter.py shows that wiring).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest

from crowdmix.client.answers import classify
from crowdmix.client.ceiling import Ceiling
from crowdmix.client.delivery import (
    MIN_KEY_WAIT,
    CachedConfig,
    Decision,
    Drop,
    Refetch,
    Send,
    SendState,
    Wait,
    clock_offset,
    decide,
)
from crowdmix.client.outbox import PendingReport
from crowdmix.client.report import make_report
from crowdmix.core.basic import BasicParams
from crowdmix.core.device_config import DeviceConfig
from crowdmix.core.histogram import HistogramParams
from crowdmix.core.registry import MetricConfig
from crowdmix.core.sealed import X25519_SUITE, PublicKeyConfig, PublicKeySet

WS = 86400
D = 20000  # a window (day) index
NOW = D * WS + 3600.0  # one hour into window D, device clock
THEME = MetricConfig(
    name="theme",
    basic=BasicParams(mechanism="krr", epsilon=1.0, domain_size=3),
    domain=("light", "dark", "system"),
)
SCREEN = MetricConfig(
    name="screen",
    histogram=HistogramParams(domain_size=4, fake_slots=1, fake_probability=0.5, local_epsilon=2.0),
)
KEY = PublicKeyConfig(key_id=7, suite=X25519_SUITE.name, public_key=bytes(32), not_before=0)
OLD_KEY = PublicKeyConfig(
    key_id=6, suite=X25519_SUITE.name, public_key=bytes(32), not_before=0, not_after=int(NOW) - 10
)


def config(
    *keys: PublicKeyConfig, fetched: float = NOW - 60, offset: float = 0.0, cache: int = 3600
) -> CachedConfig:
    return CachedConfig(
        DeviceConfig(
            metrics={"theme": THEME, "screen": SCREEN},
            keys=PublicKeySet(keys),
            cache_seconds=cache,
            window_seconds=WS,
        ),
        fetched=fetched,
        offset=offset,
    )


def rows(
    metric: str = "theme", window: int = D, n: int = 1, fp: int | None = None
) -> list[PendingReport]:
    mc = {"theme": THEME, "screen": SCREEN}[metric]
    return [
        PendingReport(
            make_report(metric, 0, bytes(mc.report_bytes), mc.fingerprint if fp is None else fp,
                        bytes([i + 1]) * 16),
            window,
            WS,
        )
        for i in range(n)
    ]  # fmt: skip


SEALED = config(KEY)
STATE = SendState()


@dataclass(frozen=True)
class Case:
    rows: list[PendingReport] = field(default_factory=rows)
    config: CachedConfig | None = SEALED
    now: float = NOW
    state: SendState = STATE


def summary(action: Decision) -> tuple[object, ...]:
    """The parts of an action a case checks (messages are for people)."""
    if isinstance(action, Send):
        return (
            "send",
            action.window,
            None if action.key is None else action.key.key_id,
            len(action.rows),
        )
    if isinstance(action, Drop):
        return ("drop", action.reason, len(action.report_ids))
    if isinstance(action, Refetch):
        return ("refetch",)
    if isinstance(action, Wait):
        return ("wait", action.seconds, action.problem is not None)
    return ("offline", action.fatal)


REFETCHED = replace(STATE, refetched=True)
UNAUTHENTICATED = classify("UNAUTHENTICATED", "bad_token: the bearer token is not valid")
UNREACHABLE = classify("UNAVAILABLE", "failed to connect to all addresses")
PARAMS_REFUSED = classify("INVALID_ARGUMENT", "fingerprint_mismatch: x")
CLEAR = replace(STATE, sealing="off")

TABLE: dict[str, tuple[Case, tuple[object, ...]]] = {
    # the config
    "no config: fetch one": (Case(config=None), ("refetch",)),
    "no config and nothing waits: fetch one all the same": (
        Case(rows=[], config=None), ("refetch",)),
    "no config, the fetch failed: offline": (
        Case(config=None, state=replace(REFETCHED, fetch_failure=UNREACHABLE)), ("offline", False)),
    "no config, the token was refused: offline, and the app hears of it": (
        Case(config=None, state=replace(REFETCHED, fetch_failure=UNAUTHENTICATED)),
        ("offline", True)),
    "expired config: fetch a new one first": (
        Case(config=config(KEY, fetched=NOW - 3600)), ("refetch",)),
    "expired config whose refetch failed: send with it": (
        Case(config=config(KEY, fetched=NOW - 3600), state=REFETCHED), ("send", D, 7, 1)),
    "a bundled config is fetched anew before anything is sent": (
        Case(config=config(KEY, fetched=-math.inf)), ("refetch",)),
    "nothing waits: idle until woken": (Case(rows=[]), ("wait", None, False)),
    # backoff
    "backing off: wait the rest of it": (
        Case(state=replace(STATE, backoff=12.5)), ("wait", 12.5, False)),
    "backing off without a config: no fetch either": (
        Case(config=None, state=replace(STATE, backoff=3.0)), ("wait", 3.0, False)),
    # the window
    "this window: send": (Case(), ("send", D, 7, 1)),
    "the window before: still taken (tolerance one window)": (
        Case(rows=rows(window=D - 1)), ("send", D - 1, 7, 1)),
    "a window of another length (the server changed it): dropped": (
        Case(rows=[replace(r, window_seconds=3600) for r in rows()]),
        ("drop", "window_changed", 1)),
    "two windows back: closed, dropped without asking": (
        Case(rows=rows(window=D - 2)), ("drop", "window_closed", 1)),
    "a window ahead of ours (a clock set back): the shuffler decides": (
        Case(rows=rows(window=D + 1)), ("send", D + 1, 7, 1)),
    "the server's clock is ahead: its window counts, not ours": (
        Case(rows=rows(window=D - 1), config=config(KEY, offset=WS)),
        ("drop", "window_closed", 1)),
    "the server's clock is behind: a report of its window is still open": (
        Case(rows=rows(window=D - 2), config=config(KEY, offset=-2 * 3600.0)),
        ("send", D - 2, 7, 1)),
    # the shuffler's answers to this group's last attempt
    "window_closed answer: dropped": (
        Case(state=replace(STATE, answer=classify("FAILED_PRECONDITION", "window_closed: w"))),
        ("drop", "window_closed", 1)),
    "window_ahead answer: learn the server time again": (
        Case(state=replace(STATE, answer=classify("FAILED_PRECONDITION", "window_ahead: w"))),
        ("refetch",)),
    "window_ahead after the refetch: keep it, try later": (
        Case(state=replace(REFETCHED, answer=classify("FAILED_PRECONDITION", "window_ahead: w"))),
        ("offline", False)),
    "stale_key answer: refetch and reseal": (
        Case(state=replace(STATE, answer=classify("FAILED_PRECONDITION", "stale_key: 9"))),
        ("refetch",)),
    "params refused: refetch once": (
        Case(state=replace(STATE, answer=PARAMS_REFUSED)), ("refetch",)),
    "params refused after the refetch: dropped as refused": (
        Case(state=replace(REFETCHED, answer=PARAMS_REFUSED)), ("drop", "refused", 1)),
    "token refused: keep it, the app hears of it": (
        Case(state=replace(STATE, answer=UNAUTHENTICATED)), ("offline", True)),
    "unreachable: keep it, back off": (
        Case(state=replace(STATE, answer=UNREACHABLE)), ("offline", False)),
    "another protocol: keep it, the app hears of it": (
        Case(state=replace(STATE, answer=classify("INVALID_ARGUMENT", "protocol_unsupported: 3"))),
        ("offline", True)),
    # the reports' params
    "a metric the config lacks: refetch": (
        Case(rows=[replace(r, report=make_report("gone", 0, b"\x00", 1, r.report.report_id))
                   for r in rows()]), ("refetch",)),
    "a metric the fresh config lacks: params_changed": (
        Case(rows=[replace(r, report=make_report("gone", 0, b"\x00", 1, r.report.report_id))
                   for r in rows()], state=REFETCHED), ("drop", "params_changed", 1)),
    "encoded under other params: refetch, then params_changed": (
        Case(rows=rows(fp=12345), state=REFETCHED), ("drop", "params_changed", 1)),
    "a histogram's group goes whole": (Case(rows=rows("screen", n=3)), ("send", D, 7, 3)),
    "a histogram is never sent clear": (
        Case(rows=rows("screen", n=2), state=CLEAR), ("drop", "refused", 2)),
    "above the ceiling (a report made under a looser one): dropped": (
        Case(state=replace(STATE, ceiling=Ceiling(max_epsilon=0.5))),
        ("drop", "refused_by_ceiling", 1)),
    # keys
    "sealing off: clear": (Case(config=config(), state=CLEAR), ("send", D, None, 1)),
    "no key: refetch once": (Case(config=config()), ("refetch",)),
    "no key after the refetch: wait, and the app hears why (never clear)": (
        Case(config=config(), state=REFETCHED), ("wait", 3540.0, True)),
    "only an expired key: as no key": (
        Case(config=config(OLD_KEY), state=REFETCHED), ("wait", 3540.0, True)),
    "no key in an old config: wait at least a minute": (
        Case(config=config(fetched=NOW - 3599), state=REFETCHED), ("wait", MIN_KEY_WAIT, True)),
    "the newest usable key": (Case(config=config(OLD_KEY, KEY)), ("send", D, 7, 1)),
}  # fmt: skip


@pytest.mark.parametrize("name", list(TABLE))
def test_decide(name: str) -> None:
    case, expected = TABLE[name]
    assert summary(decide(case.rows, case.config, case.now, case.state)) == expected


def test_send_carries_the_rows_and_the_metrics_length() -> None:
    group = rows("screen", n=2)
    action = decide(group, SEALED, NOW, STATE)
    assert isinstance(action, Send)
    assert action.rows == tuple(group) and action.report_bytes == SCREEN.report_bytes


def test_the_config_window_is_the_corrected_clock() -> None:
    c = config(offset=-100.0)
    assert c.window(D * WS + 50) == D - 1 and c.window(D * WS + 100) == D
    assert clock_offset(1_700_000_100.0, 1_700_000_000.0) == 100.0


@pytest.mark.parametrize("server_time", [0.0, -5.0, math.nan, math.inf, 32503680000.0])
def test_a_server_time_no_clock_shows_is_refused(server_time: float) -> None:
    with pytest.raises(ValueError, match="server_time"):
        clock_offset(server_time, NOW)
