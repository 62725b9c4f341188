"""The delivery policy as a table: rows, config, clocks and sender state in, one action out.

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
    CLOCK_SLACK,
    MIN_KEY_WAIT,
    CachedConfig,
    Decision,
    Drop,
    Reading,
    Refetch,
    Send,
    SendState,
    Wait,
    check_server_time,
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


def at(wall: float, set_by: float = 0.0) -> Reading:
    """The device's clocks when its wall clock reads ``wall``, after the wall clock was
    set ``set_by`` seconds forward (the monotonic clock counts from boot, a day ago)."""
    return Reading(wall, wall - set_by - NOW + 86400.0)


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
    *keys: PublicKeyConfig,
    fetched: float = NOW - 60,
    offset: float = 0.0,
    cache: int = 3600,
    tolerance: int = 1,
) -> CachedConfig:
    """Fetched at device time ``fetched`` (-inf: bundled) from a server ``offset``
    seconds ahead, serving ``tolerance``."""
    dc = DeviceConfig(
        metrics={"theme": THEME, "screen": SCREEN},
        keys=PublicKeySet(keys),
        cache_seconds=cache,
        window_seconds=WS,
        window_tolerance=tolerance,
    )
    if fetched == -math.inf:
        return CachedConfig(dc, NOW, at(NOW), age=math.inf)
    return CachedConfig(dc, fetched + offset, at(fetched))


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
AT_NOW = at(NOW)
STATE = SendState()


@dataclass(frozen=True)
class Case:
    rows: list[PendingReport] = field(default_factory=rows)
    config: CachedConfig | None = SEALED
    now: Reading = AT_NOW
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
    "two windows ahead of a server time learnt here (a clock set forward): withdrawn": (
        Case(rows=rows(window=D + 2)), ("drop", "window_ahead", 1)),
    "thirty windows ahead, on a restored config's wall clock: the shuffler decides": (
        Case(rows=rows(window=D + 30), config=replace(SEALED, age=10.0)),
        ("send", D + 30, 7, 1)),
    "the server's clock is ahead: its window counts, not ours": (
        Case(rows=rows(window=D - 1), config=config(KEY, offset=WS)),
        ("drop", "window_closed", 1)),
    "the server's clock is behind: a report of its window is still open": (
        Case(rows=rows(window=D - 2), config=config(KEY, offset=-2 * 3600.0)),
        ("send", D - 2, 7, 1)),
    "the shuffler serves a tolerance of two: two windows back still sent": (
        Case(rows=rows(window=D - 2), config=config(KEY, tolerance=2)), ("send", D - 2, 7, 1)),
    "the shuffler serves a tolerance of zero: the window before is dropped": (
        Case(rows=rows(window=D - 1), config=config(KEY, tolerance=0)),
        ("drop", "window_closed", 1)),
    # the device's wall clock set since the fetch: the server time runs on the monotonic one
    "the wall clock set two days back: fetch the server time again": (
        Case(now=at(NOW - 2 * WS, set_by=-2 * WS)), ("refetch",)),
    "the wall clock set two days back, the fetch failed: the window is still the server's": (
        Case(now=at(NOW - 2 * WS, set_by=-2 * WS), state=REFETCHED), ("send", D, 7, 1)),
    "the wall clock set two days forward: the report is not taken for closed": (
        Case(now=at(NOW + 2 * WS, set_by=2 * WS), state=REFETCHED), ("send", D, 7, 1)),
    "the wall clock set by less than the slack: no refetch": (
        Case(now=at(NOW + CLOCK_SLACK / 2, set_by=CLOCK_SLACK / 2)), ("send", D, 7, 1)),
    "the device slept on a monotonic clock that stops in suspend: fetch again": (
        Case(now=at(NOW + 8 * 3600, set_by=8 * 3600)), ("refetch",)),
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
    action = decide(group, SEALED, at(NOW), STATE)
    assert isinstance(action, Send)
    assert action.rows == tuple(group) and action.report_bytes == SCREEN.report_bytes


def test_the_window_is_the_server_time_learnt_plus_the_monotonic_time_since() -> None:
    c = config(offset=-100.0)  # fetched at NOW - 60: the server read NOW - 160
    assert c.server_now(at(NOW)) == NOW - 100.0
    assert c.window(at(D * WS + 50)) == D - 1 and c.window(at(D * WS + 100)) == D
    # the wall clock set a day forward moves neither the server time nor the window
    assert c.server_now(at(NOW + WS, set_by=WS)) == NOW - 100.0
    assert c.window(at(NOW + WS, set_by=WS)) == D


def test_a_config_restored_in_a_new_process_runs_on_the_wall_clock_offset() -> None:
    dc = config().config
    # stored by an earlier process 10 minutes ago, from a server 100 s ahead
    c = CachedConfig.restored(dc, fetched=NOW - 600, offset=100.0, now=at(NOW))
    assert c.server_now(at(NOW)) == NOW + 100.0 and c.held(at(NOW)) == 600.0
    assert not c.expired(at(NOW)) and c.expired(at(NOW + 3000))
    # the wall clock was set back while the app was down: expired, fetched again
    back = CachedConfig.restored(dc, fetched=NOW + 600, offset=100.0, now=at(NOW))
    assert back.expired(at(NOW))


@pytest.mark.parametrize("server_time", [0.0, -5.0, math.nan, math.inf, 32503680000.0])
def test_a_server_time_no_clock_shows_is_refused(server_time: float) -> None:
    with pytest.raises(ValueError, match="server_time"):
        check_server_time(server_time)
    assert check_server_time(1_700_000_100.0) == 1_700_000_100.0


def test_a_restored_config_on_a_clock_set_forward_drops_nothing_unasked() -> None:
    """A new process, its wall clock set two days forward while the app was down, the
    fetch failed: the server time is only the wall clock plus the stored offset, so the
    queued report of day D is not taken for closed; the shuffler says whether it is."""
    later = at(NOW + 2 * WS, set_by=2 * WS)
    c = CachedConfig.restored(config(KEY).config, fetched=NOW - 600, offset=0.0, now=later)
    assert c.window(later) == D + 2 and c.expired(later)
    assert summary(decide(rows(window=D), c, later, REFETCHED)) == ("send", D, 7, 1)
    # a bundled config (never fetched) is only the wall clock as well
    b = config(KEY, fetched=-math.inf)
    assert summary(decide(rows(window=D - 2), b, at(NOW), REFETCHED)) == ("send", D - 2, 7, 1)
    # fetched in this process: its server time runs on the monotonic clock, trusted
    # even when the config expired and the fetch failed
    fresh = config(KEY)
    assert summary(decide(rows(window=D - 2), fresh, at(NOW + 2 * WS), REFETCHED)) == (
        "drop",
        "window_closed",
        1,
    )


def test_a_heavy_hitters_report_is_held_to_its_windows_round() -> None:
    """A report names its round's fingerprint: sent while the config serves that round
    (sealed, naming it in the clear too), fetched again when the config serves another
    round of its window, then dropped (``round_changed``); a window the config no longer
    lists is the shuffler's to judge; a ``round_mismatch`` refusal refetches once."""
    from crowdmix.core.rounds import ServedRound
    from tests.discovery.test_round_config import _registry

    words = _registry()["words"]
    served = ServedRound(round=0, window=D, opened=D, epsilon=3.0, start=0, stop=3, seeds=16,
                         buckets=23)  # fmt: skip
    other = replace(served, epsilon=4.0, buckets=59)  # another shuffler's round of D

    def with_round(r: ServedRound) -> CachedConfig:
        c = config(KEY)
        dc = replace(c.config, metrics={"words": words}, rounds={"words": (r,)})
        return replace(c, config=dc)

    def hh_rows(fp: int, window: int = D) -> list[PendingReport]:
        return [PendingReport(make_report("words", 0, bytes(4), fp, b"\x05" * 16), window, WS)]

    ours = served.fingerprint(words.fingerprint)
    action = decide(hh_rows(ours), with_round(served), AT_NOW, STATE)
    assert isinstance(action, Send) and action.round_bound
    assert summary(decide(hh_rows(ours), with_round(other), AT_NOW, STATE)) == ("refetch",)
    assert summary(decide(hh_rows(ours), with_round(other), AT_NOW, REFETCHED)) == (
        "drop", "round_changed", 1)  # fmt: skip
    unlisted = hh_rows(ours, window=D - 1)
    assert summary(decide(unlisted, with_round(served), AT_NOW, STATE)) == ("send", D - 1, 7, 1)
    mismatch = classify("FAILED_PRECONDITION", "round_mismatch: metric 'words': ...")
    refused = replace(STATE, answer=mismatch)
    assert summary(decide(hh_rows(ours), with_round(served), AT_NOW, refused)) == ("refetch",)
    # refused again after the refetch, by a shuffler of another round: kept, tried later
    again = replace(REFETCHED, answer=mismatch)
    assert summary(decide(hh_rows(ours), with_round(served), AT_NOW, again)) == ("offline", False)
