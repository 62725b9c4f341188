"""When a device may send a metric's next report: on the server's clock, not its own.

The shuffler files a report under the collection window its *own* clock shows when
the report arrives. A device that claims one report per window on its clock can,
with a clock some minutes off, land two reports of a metric in one server window
(one sent late in its day, the next early in its next day) — and every privacy
statement assumes at most one per device, metric and window. So a metric's new
report is *sent* only when the server's clock is surely in a window after every
one in which a copy of the metric's previous report may have arrived:

- ``GetConfig`` answers with the server's time ``s``. Asked at device time
  ``t_send`` and answered at ``t_recv``, ``s`` was read in between, so the offset
  ``server − device`` lies in ``[s − t_recv, s − t_send]`` (``ClockEstimate``).
- Every attempt of a report reaches the server (if at all) between its start and
  its deadline. Mapped through the offset's upper bound, its deadline gives the
  last server window a copy may lie in (``last_arrival_window``); the device keeps
  the latest such window per metric (``crowdmix.client.outbox`` ``SendMarks``).
- A new report goes out once the offset's *lower* bound puts the server in a later
  window (``hold_seconds``). Both ends carry ``GUARD_SECONDS`` for drift since the
  estimate.

An estimate is trusted for ``MAX_ESTIMATE_AGE`` seconds, in the process that made
it, while the wall clock keeps pace with ``time.monotonic`` (within
``JUMP_SECONDS``); otherwise the device asks again before it sends. A shuffler
that sends no time (``server_time`` 0, older than this field) gets the gap rule
instead: the next report leaves at least one window (plus the guard) after the
previous one's last deadline on the device's clock. With any constant offset its
copies then arrive at least one window apart: never in one server window.

Pure arithmetic; the reporter (``crowdmix.client.reporter``) does the I/O.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "GUARD_SECONDS",
    "JUMP_SECONDS",
    "MAX_ESTIMATE_AGE",
    "SERVER_TIME_RANGE",
    "ClockEstimate",
    "SendMarks",
    "hold_seconds",
    "last_arrival_window",
    "plausible_server_time",
]

#: Margin on both ends for drift since the estimate: an hour at 500 ppm (the most
#: NTP slews a clock) is 1.8 s.
GUARD_SECONDS = 5.0
#: An estimate older than this (monotonic seconds) is renewed before a send.
MAX_ESTIMATE_AGE = 3600.0
#: The wall clock moved this much more or less than ``time.monotonic``: it was set
#: (a jump), and the estimate no longer holds.
JUMP_SECONDS = 2.0


#: The server times a device believes (Unix seconds, 2020-01-01 to 2100-01-01); 0 is
#: "no time" (an older shuffler). Any other answer is a broken server's: taken for
#: its clock, a far-future one would send now and leave a mark that holds the metric
#: until then (on disk, across restarts), one in the past would hold it as long as
#: the server says so. The reporter refuses such an answer whole (the reports wait).
SERVER_TIME_RANGE = (1_577_836_800.0, 4_102_444_800.0)


def plausible_server_time(server_time: float) -> bool:
    """Whether ``server_time`` from ``GetConfig`` is absent (0) or a time to believe."""
    lo, hi = SERVER_TIME_RANGE
    return server_time == 0 or lo <= server_time <= hi  # False for NaN and ±inf


@dataclass(frozen=True, slots=True)
class ClockEstimate:
    """What one ``GetConfig`` answer told about the server's clock.

    ``low``/``high`` bound ``server − device`` (seconds); both None when the
    shuffler sent no time. ``wall``/``mono`` are the device's clocks at the answer."""

    low: float | None
    high: float | None
    wall: float
    mono: float

    @classmethod
    def of(
        cls, server_time: float, t_send: float, t_recv: float, mono_send: float, mono_recv: float
    ) -> ClockEstimate | None:
        """The estimate from one answer; None when the wall clock was set during the
        request (its two readings disagree with ``time.monotonic``'s): ask again."""
        if abs((t_recv - t_send) - (mono_recv - mono_send)) > JUMP_SECONDS or t_recv < t_send:
            return None
        if not server_time or not math.isfinite(server_time):  # an older shuffler
            return cls(None, None, t_recv, mono_recv)
        return cls(server_time - t_recv, server_time - t_send, t_recv, mono_recv)

    @property
    def knows_server_time(self) -> bool:
        return self.low is not None

    def fresh(self, wall: float, mono: float) -> bool:
        """Whether it still holds at device time ``wall`` (``mono`` on the monotonic
        clock): young enough, and the wall clock was not set since."""
        age = mono - self.mono
        return 0.0 <= age <= MAX_ESTIMATE_AGE and abs((wall - self.wall) - age) <= JUMP_SECONDS


@dataclass(frozen=True, slots=True)
class SendMarks:
    """What the device remembers of a metric's earlier reports' attempts.

    ``server_window``: the last server window a copy may have arrived in (attempts
    made with a server time); ``deadline``: the latest attempt deadline, device
    clock (every attempt); ``blind_deadline``: the same over attempts made without
    a server time (None: there were none)."""

    server_window: int | None = None
    deadline: float | None = None
    blind_deadline: float | None = None


def last_arrival_window(deadline: float, high: float, window_seconds: int) -> int:
    """The latest server window an attempt with this (device-clock) deadline can
    arrive in: the deadline through the offset's upper bound, plus the guard."""
    return math.floor((deadline + high + GUARD_SECONDS) / window_seconds)


def hold_seconds(
    now: float, window_seconds: int, estimate: ClockEstimate, marks: SendMarks
) -> float:
    """Device seconds until a metric's new report may be sent; 0: now.

    With a server time: until the offset's lower bound (less the guard) puts the
    server past ``marks.server_window``, and one window past any blind attempt's
    deadline. Without: one window (plus the guard) past the last deadline."""
    ws = window_seconds
    wait = 0.0
    if estimate.low is not None:
        if marks.server_window is not None:
            wait = (marks.server_window + 1) * ws - (now + estimate.low - GUARD_SECONDS)
        if marks.blind_deadline is not None:
            wait = max(wait, marks.blind_deadline + ws + GUARD_SECONDS - now)
    elif marks.deadline is not None:
        wait = marks.deadline + ws + GUARD_SECONDS - now
    return max(wait, 0.0)
