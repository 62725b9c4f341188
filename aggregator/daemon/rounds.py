"""The round file at the aggregator: which round each window of a heavy-hitters metric
serves, so ingest counts only the reports encoded against it.

The round job (``crowdmix discover``) writes the file on the aggregator's side; the
shufflers serve copies of it. A report names its round's fingerprint
(``crowdmix.core.rounds.ServedRound.fingerprint``); one that names another round of its
window (a shuffler serving another file) would be decoded against the wrong round, so
ingest refuses it (reason ``round``). ``RoundFile`` stats the file before each lookup
and re-reads it when it changed; a file that does not read, or is gone, keeps the last
good rounds.
"""

from __future__ import annotations

import logging
import os
import threading

from crowdmix.aggregator.errors import ConfigError
from crowdmix.core.errors import ParamsError
from crowdmix.core.registry import MetricConfig
from crowdmix.core.rounds import RoundBook, read_rounds

__all__ = ["RoundFile"]

log = logging.getLogger("crowdmix.aggregator")


class RoundFile:
    """The round file at ``path`` (none yet: no round), re-read when it changes."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._stamp = self._stat()
        try:
            self._book = read_rounds(self.path)
        except ParamsError as exc:
            raise ConfigError(str(exc)) from None

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def book(self) -> RoundBook:
        """The rounds as the file holds them now (the last good read)."""
        stamp = self._stat()
        if stamp is not None and stamp != self._stamp:  # a file gone keeps its last rounds
            with self._lock:
                if stamp != self._stamp:
                    try:
                        # gone between the stat and the read: keep the last good rounds
                        self._book = read_rounds(self.path, missing_ok=False)
                    except ParamsError as exc:
                        log.warning("keeping the previous heavy-hitter rounds: %s", exc)
                    self._stamp = stamp
        return self._book

    def round_fingerprint(self, metric: MetricConfig, window: int) -> int | None:
        """The fingerprint the reports of ``window`` must name, or None (no round)."""
        return self.book().round_fingerprint(metric.name, metric.fingerprint, window)
