"""Which collection window a report may name: the shuffler's accept rule.

A report names its window ``w`` (``Report.window``: floor(unix seconds /
window_seconds) on the device's clock, corrected once by ``GetConfig``'s server
time). With ``cur`` the shuffler's current window, it is accepted iff::

    cur − tolerance  ≤  w  ≤  window_of(now + max_skew)

and filed under ``w``. Below: ``window_closed`` (the device drops the report and
counts it; its window may already be released). Above: ``window_ahead`` (the
device's clock runs ahead; it re-learns the server time once and retries later).
The same rule, read the other way, says when a window can receive no more
reports: once ``cur − tolerance > w`` (``closed_at``), which is when a window
released whole may go (plus its grace). DAP does the same with a report's
timestamp, a tolerable clock skew and an expiry age.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from crowdmix.shuffler.errors import ConfigError, WindowRefused

__all__ = ["WindowRule"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WindowRule:
    """The accept rule for a registry's window length; pure (``now`` is given)."""

    window_seconds: int
    tolerance: int = 1  # windows before the current one still accepted
    max_skew_seconds: float = 60.0  # how far a device's clock may run ahead

    def __post_init__(self) -> None:
        t = self.tolerance
        if isinstance(t, bool) or not isinstance(t, int) or t < 0:
            raise ConfigError(f"window_tolerance must be an integer >= 0, got {t!r}")
        s = self.max_skew_seconds
        if isinstance(s, bool) or not isinstance(s, int | float) or not 0 <= s < math.inf:
            raise ConfigError(f"max_clock_skew_seconds must be a number >= 0, got {s!r}")
        if s >= self.window_seconds:
            # a report of the window after next would be taken, which no device sends
            raise ConfigError(
                f"max_clock_skew_seconds ({s}) must be less than the collection window "
                f"({self.window_seconds} s)"
            )

    def window_of(self, unix_seconds: float) -> int:
        return int(unix_seconds // self.window_seconds)

    def accepted(self, now: float) -> tuple[int, int]:
        """The first and the last window accepted at ``now``, both inclusive."""
        return self.window_of(now) - self.tolerance, self.window_of(now + self.max_skew_seconds)

    def check(self, window: int, now: float, disposal_seconds: float = math.inf) -> None:
        """Nothing when ``window`` is accepted at ``now``, else ``WindowRefused``. A window
        that ended ``disposal_seconds`` ago or more is closed too, whatever the tolerance:
        the releaser would dispose of it unforwarded, so it must not be acknowledged."""
        ws = self.window_seconds
        expired = (window + 1) * ws <= now - disposal_seconds
        if (
            not expired
            and now // ws - self.tolerance <= window <= (now + self.max_skew_seconds) // ws
        ):
            return
        first, last = self.accepted(now)
        if expired:
            raise WindowRefused(
                "window_closed",
                f"window {window} is closed: it ended more than the metric's disposal age "
                "ago; drop the report",
            )
        if window < first:
            raise WindowRefused(
                "window_closed",
                f"window {window} is closed: this shuffler takes windows {first} to {last}; "
                "drop the report",
            )
        raise WindowRefused(
            "window_ahead",
            f"window {window} has not begun: this shuffler takes windows {first} to "
            f"{last}; fetch the server time (GetConfig) again and retry later",
        )

    def closed_at(self, window: int) -> float:
        """The first moment at which ``window`` is refused as closed (unix seconds)."""
        return float((window + self.tolerance + 1) * self.window_seconds)
