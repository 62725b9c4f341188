"""Collection windows as people read them: the window index and its start date.

A window is ``unix_seconds // window_seconds`` (``Registry.window_of``); its start
is ``window * window_seconds`` in UTC. Whole-day windows read as dates, shorter
ones as date and time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

__all__ = ["window_date", "window_span"]


def window_date(window: int, seconds: int | None) -> str:
    """The start of collection window ``window`` (UTC): a date for whole-day windows,
    else date and time; empty when the window's length is not known."""
    if seconds is None:
        return ""
    fmt = "%Y-%m-%d" if seconds % 86400 == 0 else "%Y-%m-%d %H:%M UTC"
    return time.strftime(fmt, time.gmtime(window * seconds))


def window_span(windows: Sequence[int], seconds: int | None) -> str:
    """Windows as numbers and dates: ``"window 20400 (2025-11-08)"``, ``"windows
    20400-20406 (2025-11-08 to 2025-11-14)"``, ``"windows 20400, 20402 (...)"``."""
    if not windows:
        return "no window"
    ws = sorted(windows)
    dates = [window_date(w, seconds) for w in (ws[0], ws[-1])]
    if len(ws) == 1:
        return f"window {ws[0]}" + (f" ({dates[0]})" if seconds else "")
    if ws[-1] - ws[0] + 1 == len(ws):
        numbers = f"{ws[0]}-{ws[-1]}"
    elif len(ws) <= 4:
        numbers = ", ".join(str(w) for w in ws)
    else:
        numbers = f"{ws[0]}..{ws[-1]} ({len(ws)} of them)"
    return f"windows {numbers}" + (f" ({dates[0]} to {dates[1]})" if seconds else "")
