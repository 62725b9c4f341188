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

from crowdmix.aggregator.errors import ConfigError
from crowdmix.core.registry import MetricConfig
from crowdmix.core.rounds import RoundBook, WatchedRounds

__all__ = ["RoundFile"]

log = logging.getLogger("crowdmix.aggregator")


class RoundFile(WatchedRounds):
    """The round file at ``path`` (none yet: no round), looked at before each lookup."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path, error=ConfigError, log=log, check_seconds=0.0)

    def book(self) -> RoundBook:
        """The rounds as the file holds them now (the last good read)."""
        return self.value

    def round_fingerprint(self, metric: MetricConfig, window: int) -> int | None:
        """The fingerprint the reports of ``window`` must name, or None (no round)."""
        return self.book().round_fingerprint(metric.name, metric.fingerprint, window)
