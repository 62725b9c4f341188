"""At most one report per metric per collection window: the device keeps the promise.

Every privacy statement assumes each client sends at most one report of a metric per
collection window, and the shuffler cannot check it (it must not know who sent what)::

    budget = client.ReportBudget(app_data / "crowdmix-budget.json", registry.window_seconds)
    if budget.claim("home_page"):
        sender.submit(encoder.encode(value), window=budget.window())

``claim`` writes the metric's window to the file atomically *before* it returns True, so
an app restart does not reset it, and a clock set back reopens no window. It claims
before encoding: a report that fails to send is not made again in that window (a second
freshly randomized report reveals more than the statement says). Windows are the
registry's (``Registry.window_of``). ``client.Reporter`` does all of this for an app.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from crowdmix.client.errors import CrowdmixClientError, ParamsError

__all__ = ["ReportBudget"]


class ReportBudget:
    """Per metric, the last collection window a report was made in.

    ``path`` None keeps the state in memory only (it then resets with the process:
    for tests and short-lived tools, not for apps).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        window_seconds: int = 86400,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(window_seconds, bool) or not isinstance(window_seconds, int):
            raise ParamsError(f"window_seconds must be an integer, got {window_seconds!r}")
        if window_seconds < 1:
            raise ParamsError(f"window_seconds must be positive, got {window_seconds}")
        self._path = None if path is None else Path(path)
        self._window_seconds = window_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._last = self._load()

    def window(self) -> int:
        """The current collection window."""
        return int(self._clock() // self._window_seconds)

    def available(self, metric: str) -> bool:
        """Whether ``claim(metric)`` would succeed now (it does not claim)."""
        with self._lock:
            return self._last.get(metric, -1) < self.window()

    def claim(self, metric: str) -> bool:
        """True (and recorded, on disk when there is a path) if ``metric`` has no report
        in the current window yet; False if it has. Raises ``CrowdmixClientError`` when
        the state cannot be written, and then claims nothing."""
        with self._lock:
            window = self.window()
            previous = self._last.get(metric)
            if previous is not None and previous >= window:
                return False
            self._last[metric] = window
            try:
                self._save()
            except OSError as exc:
                if previous is None:
                    del self._last[metric]
                else:
                    self._last[metric] = previous
                raise CrowdmixClientError(
                    f"cannot record the report budget in {self._path}: {exc.strerror or exc}"
                ) from None
            return True

    def _load(self) -> dict[str, int]:
        if self._path is None or not self._path.exists():
            return {}
        try:
            data = json.loads(self._path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise CrowdmixClientError(
                f"cannot read the report budget {self._path}: {exc}"
            ) from None
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool)
            for k, v in data.items()
        ):
            # Refuse rather than start afresh: starting afresh could make a second
            # report in a window that already has one.
            raise CrowdmixClientError(
                f"{self._path} is not a report budget (a JSON object of metric -> window)"
            )
        return dict(data)

    def _save(self) -> None:
        if self._path is None:
            return
        tmp = self._path.with_name(f".{self._path.name}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(self._last, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self._path)
