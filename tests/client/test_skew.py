"""When a metric's next report may be sent (client.skew), and the marks the outbox keeps."""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from crowdmix.client.outbox import Claim, Outbox
from crowdmix.client.report import Report
from crowdmix.client.skew import (
    GUARD_SECONDS,
    JUMP_SECONDS,
    MAX_ESTIMATE_AGE,
    ClockEstimate,
    SendMarks,
    hold_seconds,
    last_arrival_window,
)

DAY = 86400
T = 1_728_000_000.0  # a day's first second


def test_the_offset_lies_between_the_answer_and_the_request() -> None:
    # asked at 100, answered at 103 (device), the server read 700 in between
    e = ClockEstimate.of(700.0, 100.0, 103.0, 5.0, 8.0)
    assert e == ClockEstimate(low=597.0, high=600.0, wall=103.0, mono=8.0)
    assert e.knows_server_time
    old = ClockEstimate.of(0.0, 100.0, 103.0, 5.0, 8.0)  # a shuffler without the field
    assert old is not None and (old.low, old.high) == (None, None)
    assert not old.knows_server_time
    assert ClockEstimate.of(math.nan, 100.0, 103.0, 5.0, 8.0) == old
    # the wall clock was set during the request: no estimate (ask again)
    assert ClockEstimate.of(700.0, 100.0, 400.0, 5.0, 8.0) is None
    assert ClockEstimate.of(700.0, 100.0, 50.0, 5.0, 5.0) is None


def test_an_estimate_holds_for_an_hour_while_the_wall_clock_keeps_pace() -> None:
    e = ClockEstimate(low=0.0, high=1.0, wall=T, mono=10.0)
    assert e.fresh(T + 60, 70.0)
    assert e.fresh(T + MAX_ESTIMATE_AGE, 10.0 + MAX_ESTIMATE_AGE)
    assert not e.fresh(T + MAX_ESTIMATE_AGE + 1, 11.0 + MAX_ESTIMATE_AGE)  # too old
    assert not e.fresh(T + 60 + JUMP_SECONDS + 0.5, 70.0)  # set forward
    assert not e.fresh(T - 600, 70.0)  # set back
    assert not e.fresh(T, 9.0)  # a monotonic reading from before it: another boot


def test_the_arrival_window_rounds_outward_and_the_hold_ends_at_the_next_window() -> None:
    # a deadline whose latest server time (plus the guard) is the window's last second
    d = T + DAY - 1 - 600 - GUARD_SECONDS
    assert last_arrival_window(d, 600.0, DAY) == T // DAY
    assert last_arrival_window(d + 1, 600.0, DAY) == T // DAY + 1
    e = ClockEstimate(low=590.0, high=600.0, wall=T, mono=0.0)
    marks = SendMarks(server_window=int(T // DAY), deadline=d)
    assert hold_seconds(T + DAY - 590 + GUARD_SECONDS, DAY, e, marks) == 0.0
    assert hold_seconds(T + DAY - 600, DAY, e, marks) == 10 + GUARD_SECONDS
    assert hold_seconds(T, DAY, e, SendMarks()) == 0.0  # nothing sent before
    # a blind attempt (no server time then): one window after its deadline
    blind = SendMarks(server_window=None, deadline=T, blind_deadline=T)
    assert hold_seconds(T + 100, DAY, e, blind) == DAY - 100 + GUARD_SECONDS
    # no server time now: the gap rule on every attempt's deadline
    old = ClockEstimate(low=None, high=None, wall=T, mono=0.0)
    assert hold_seconds(T + 100, DAY, old, marks) == d + DAY + GUARD_SECONDS - T - 100
    assert hold_seconds(d + DAY + GUARD_SECONDS, DAY, old, marks) == 0.0


@given(
    offset=st.floats(-2 * DAY, 2 * DAY),
    spread=st.tuples(st.floats(0, 30), st.floats(0, 30)),
    start=st.floats(0, 3 * DAY),
    duration=st.floats(0, 30),
    window=st.sampled_from([3600, DAY]),
    later=st.floats(0, 3 * DAY),
)
def test_a_report_sent_when_the_hold_ends_lands_in_a_later_server_window(
    offset: float,
    spread: tuple[float, float],
    start: float,
    duration: float,
    window: int,
    later: float,
) -> None:
    """Whatever the offset inside the estimate (or any constant offset, for the gap
    rule): a copy that arrives by the deadline and a new report sent once the hold is
    over lie in different server windows."""
    deadline = T + start + duration
    est = ClockEstimate(low=offset - spread[0], high=offset + spread[1], wall=T, mono=0.0)
    marks = SendMarks(
        server_window=last_arrival_window(deadline, est.high or 0.0, window), deadline=deadline
    )
    blind = ClockEstimate(low=None, high=None, wall=T, mono=0.0)
    for e in (est, blind):
        now = deadline + later
        wait = hold_seconds(now, window, e, marks)
        if wait:
            now += wait + 0.001  # the sender wakes after the hold (with a margin)
        assert hold_seconds(now, window, e, marks) == 0.0
        first = math.floor((deadline + offset) / window)  # the latest copy's window
        assert math.floor((now + offset) / window) > first


def _report(metric: str = "m") -> Report:
    return Report(metric=metric, cohort=1, bits=b"\x01", params_fingerprint=7)


def test_the_outbox_keeps_the_marks_of_sent_reports_across_a_restart(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    assert box.claim("m", 10, _report) is Claim.MADE
    (row,) = box.pending()
    rid = row.report.report_id
    box.begin_send([rid], 10)  # no deadline: no mark (the histogram path may do so)
    assert box.marks("m", 11) == SendMarks()
    box.begin_send([rid], 10, deadline=100.0, server_window=20)
    box.begin_send([rid], 10, deadline=90.0, server_window=19)  # the maxima stay
    box.begin_send([rid], 10, deadline=95.0, server_window=None)  # a blind attempt
    again = Outbox(tmp_path / "o.db")  # as a restarted process sees it
    assert again.marks("m", 11) == SendMarks(server_window=20, deadline=100.0, blind_deadline=95.0)
    assert again.marks("m", 10) == SendMarks()  # its own window's report is no predecessor
    assert again.marks("other", 11) == SendMarks()
    again.acknowledged([rid], 10)
    # two later windows' reports: the marks before the last two are folded away
    for w, sw in ((12, 22), (14, 24)):
        assert again.claim("m", w, _report) is Claim.MADE
        (row,) = again.pending()
        again.begin_send([row.report.report_id], w, deadline=float(w * 10), server_window=sw)
        again.acknowledged([row.report.report_id], w)
    assert [w for (w,) in again._db.execute("SELECT window FROM sent ORDER BY window")] == [12, 14]
    assert again.marks("m", 15) == SendMarks(server_window=24, deadline=140.0)


def test_a_new_window_length_folds_the_marks_before_every_window(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    box.store_config(b"a", 1.0, window_seconds=3600)
    hour = 480_010
    assert box.claim("m", hour, _report) is Claim.MADE
    (row,) = box.pending()
    box.begin_send([row.report.report_id], hour, deadline=5.0, server_window=hour + 1)
    box.acknowledged([row.report.report_id], hour)
    box.store_config(b"b", 2.0, window_seconds=DAY)
    day = ((hour + 2) * 3600 - 1) // DAY  # the day holding the server hour's last second
    assert box.marks("m", 0) == SendMarks(server_window=day, deadline=5.0)


def test_pending_can_leave_out_held_metrics(tmp_path: Path) -> None:
    box = Outbox(tmp_path / "o.db")
    for m in ("a", "b", "c"):
        box.claim(m, 1, lambda m=m: _report(m))  # type: ignore[misc]
    assert [r.report.metric for r in box.pending(exclude={"a", "c"})] == ["b"]
    assert [r.report.metric for r in box.pending(1, exclude=["a"])] == ["b"]


def test_only_a_plausible_server_time_is_believed() -> None:
    from crowdmix.client.skew import SERVER_TIME_RANGE, plausible_server_time

    assert plausible_server_time(0.0)  # no time: an older shuffler (the gap rule)
    assert plausible_server_time(1_800_000_000.0)
    assert plausible_server_time(SERVER_TIME_RANGE[0]) and plausible_server_time(
        SERVER_TIME_RANGE[1]
    )
    for absurd in (math.nan, math.inf, -math.inf, -5.0, 1.0, 700.0, 32503680000.0, 1e300):
        assert not plausible_server_time(absurd), absurd
