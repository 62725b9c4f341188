"""The device's durable outbox: claimed reports until the shuffler acknowledges them.

One SQLite file (``sqlite3``, the standard library) in the app's directory holds

- ``claims``: per metric, the last collection window used (a report was made in it,
  or a report was delivered in it);
- ``outbox``: every claimed report not yet acknowledged — report id, metric, the
  window it was claimed in, cohort, params fingerprint, the encoded bits, when it was
  made, how many sends were tried and the window of the first one;
- ``config``: the last ``GetConfig`` answer (protobuf bytes) and when it was fetched;
- ``sent``: per metric and claimed window, marks of the attempts made — the last
  server window a copy may have arrived in, the latest deadline on the device's
  clock, and that of attempts made without the server's time — from which
  ``crowdmix.client.skew`` decides when the metric's next report may go;
- ``counters``: what happened to reports that left without an acknowledgement.

The promises, each one SQLite transaction (``BEGIN IMMEDIATE``, WAL journal,
``synchronous=FULL``), so a process killed at any instant leaves the state before
or after it, never half:

- ``claim``: the claim *and* the report are written together, or neither is (a
  shuffled histogram's real report and its fakes: all of them, or none). A
  metric gets a new report only when its last used window is older than the
  current one **and** it has no report still waiting: a device that is offline for
  days holds one report per metric and delivers it late, never a backlog of one per
  day. When it is delivered, the delivery's window counts as used too (the shuffler
  files a report under the window it *arrives* in), so a device never lands two
  reports of one metric in one window.
- ``begin_send`` records the attempt (count, window of the first one, its marks in
  ``sent``) *before* the request leaves; ``acknowledged`` deletes the rows only after the shuffler
  acknowledged them. A killed process therefore re-sends, after its restart, the
  rows whose acknowledgement it did not record — with the same report ids: the aggregator
  drops an id already counted in its window or an adjacent one, so a repeat is dropped
  there, whichever copy reaches it first. A row is sent again only within the (device)
  window of its first attempt, and only when the request's deadline lies in it too: every
  copy then reaches the server within less than one window of time, so — whatever the
  constant offset between the device's and the server's clocks — in one server window or two
  adjacent ones. Otherwise it is not sent again (a repeat could be counted twice): it is
  dropped and counted (``unconfirmed``). A row dropped for any reason after a try counts the
  window of the drop as used, as a delivery does (a copy may have arrived).
- Bounded: at most ``max_reports`` rows and ``max_bytes`` of report payload. When
  full, a new report is refused — ``claim`` returns ``FULL`` and records no claim —
  so the reports already promised are kept (dropping one would lose a claimed
  report; refusing makes none).
- Reports whose window is older than the metric's disposal age (the server's
  ``disposal_seconds``) are dropped and counted (``expired``).

What sits on disk: the *encoded* report — bits already randomized on the device
(ε-LDP: the permanent and the instantaneous randomized response are applied) —
never the value. Sealing to the aggregator happens when the report is sent, with
the key valid then (``crowdmix.client.reporter`` explains why). Deleted rows are zeroed
(``secure_delete``) and the write-ahead log is truncated after every delete, so
a delivered report leaves no copy in the app's files.
"""

from __future__ import annotations

import contextlib
import enum
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crowdmix.client.errors import CrowdmixClientError
from crowdmix.client.report import Report, make_report
from crowdmix.client.skew import SendMarks

__all__ = ["Claim", "Outbox", "OutboxError", "PendingReport"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS claims (
    metric TEXT PRIMARY KEY,
    window INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS outbox (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    report_id BLOB NOT NULL UNIQUE,
    metric TEXT NOT NULL,
    window INTEGER NOT NULL,
    cohort INTEGER NOT NULL,
    fingerprint INTEGER NOT NULL,
    bits BLOB NOT NULL,
    created INTEGER NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    first_attempt_window INTEGER
);
CREATE INDEX IF NOT EXISTS outbox_metric ON outbox(metric);
CREATE INDEX IF NOT EXISTS outbox_window ON outbox(window);
CREATE INDEX IF NOT EXISTS outbox_attempt ON outbox(first_attempt_window);
CREATE TABLE IF NOT EXISTS config (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    answer BLOB NOT NULL,
    fetched REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS window_length (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    seconds INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    n INTEGER NOT NULL
);
"""
# Made in its own transaction with the marks an older outbox (from before it) implies.
_SENT = """
CREATE TABLE sent (
    metric TEXT NOT NULL,
    window INTEGER NOT NULL,
    server_window INTEGER,
    deadline REAL NOT NULL,
    blind_deadline REAL,
    PRIMARY KEY (metric, window)
)
"""
#: An outbox from before the ``sent`` table: an attempt it made ended at most this long
#: after it began (the SDK's request timeout, 10 s by default, with a wide margin).
LEGACY_ATTEMPT_SECONDS = 120.0
#: Bytes a row costs beyond its bits (report id, window, cohort, ... ; for the bound only).
ROW_OVERHEAD = 64
_U64 = 1 << 64
_SELECT_PENDING = (
    "SELECT report_id, metric, window, cohort, fingerprint, bits, created, attempts,"
    " first_attempt_window FROM outbox"
)


class OutboxError(CrowdmixClientError):
    """The outbox file cannot be opened, read or written."""


class Claim(enum.Enum):
    """What ``Outbox.claim`` did."""

    MADE = "made"  # claimed and queued, one transaction
    USED = "used"  # this window's report was made (or delivered) already
    WAITING = "waiting"  # an earlier report of the metric is still waiting to be sent
    FULL = "full"  # the outbox is at its bound: nothing claimed, nothing queued


@dataclass(frozen=True, slots=True)
class PendingReport:
    """One row of the outbox."""

    report: Report
    window: int
    created: int
    attempts: int
    first_attempt_window: int | None


def _signed(fp: int) -> int:
    """A u64 fingerprint as SQLite's signed 64-bit integer (and back with ``% 2**64``)."""
    return fp - _U64 if fp >= 1 << 63 else fp


class Outbox:
    """The SQLite outbox at ``path`` (created, 0600, on first use)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_reports: int = 1000,
        max_bytes: int = 1 << 20,
        clock: Callable[[], float] = time.time,
    ) -> None:
        for name, v in (("max_reports", max_reports), ("max_bytes", max_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        self.path = Path(path)
        self.max_reports = max_reports
        self.max_bytes = max_bytes
        self._clock = clock
        self._lock = threading.Lock()
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            os.close(fd)
            self._db = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=30.0
            )
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.execute("PRAGMA secure_delete=ON")
            self._db.executescript(_SCHEMA)
        except (OSError, sqlite3.Error) as exc:
            raise OutboxError(f"cannot open the outbox {self.path}: {exc}") from None
        self._tx(self._make_sent)

    def _make_sent(self, db: sqlite3.Connection) -> None:
        """Make the ``sent`` table, with marks for what an older outbox (one without
        it) may have sent: a metric it claimed had attempts the marks do not know of,
        and without a mark its next report would go out ungated (into the server
        window of its last one). Each gets a blind mark (``crowdmix.client.skew``'s gap rule):
        its attempts began by the end of its last used window — or now, if a row of
        it was tried and still waits — and ended within ``LEGACY_ATTEMPT_SECONDS``.
        The mark is filed before every window (-1): it gates a claim the older outbox
        made and never tried too."""
        if db.execute("SELECT 1 FROM sqlite_master WHERE name = 'sent'").fetchone():
            return
        db.execute(_SENT)
        now = self._clock()
        row = db.execute("SELECT seconds FROM window_length WHERE id = 1").fetchone()
        ws = None if row is None else int(row[0])
        tried = {
            m
            for (m,) in db.execute(
                "SELECT DISTINCT metric FROM outbox WHERE first_attempt_window IS NOT NULL"
            )
        }
        marks = []
        for metric, window in db.execute("SELECT metric, window FROM claims").fetchall():
            began = now if ws is None or metric in tried else min(now, (window + 1) * ws)
            end = began + LEGACY_ATTEMPT_SECONDS
            marks.append((metric, end, end))
        db.executemany(
            "INSERT INTO sent(metric, window, server_window, deadline, blind_deadline)"
            " VALUES (?, -1, NULL, ?, ?)",
            marks,
        )

    # -- transactions ---------------------------------------------------------

    def _tx(self, body: Callable[[sqlite3.Connection], object]) -> object:
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    result = body(self._db)
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise
                self._db.execute("COMMIT")
                return result
            except sqlite3.Error as exc:
                raise OutboxError(f"outbox {self.path}: {exc}") from None

    @staticmethod
    def _count(db: sqlite3.Connection, name: str, n: int) -> None:
        if n:
            db.execute(
                "INSERT INTO counters(name, n) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET n = n + excluded.n",
                (name, n),
            )

    # -- claiming -------------------------------------------------------------

    def claim(
        self, metric: str, window: int, make: Callable[[], Report | Sequence[Report]]
    ) -> Claim:
        """If ``metric`` may report in ``window``: call ``make()`` (encode) and store its
        report — or its reports: a shuffled histogram's real report and its fakes, a
        *group* — with the claim, in one transaction. ``make`` raising stores nothing.
        The bounds count every row of a group; a group that does not fit is refused
        whole. A metric has at most one claim waiting, so its rows are its group
        (``rows_of``): sent in one request and deleted together."""

        def body(db: sqlite3.Connection) -> Claim:
            row = db.execute("SELECT window FROM claims WHERE metric = ?", (metric,)).fetchone()
            if row is not None and row[0] >= window:
                return Claim.USED
            if db.execute("SELECT 1 FROM outbox WHERE metric = ? LIMIT 1", (metric,)).fetchone():
                return Claim.WAITING
            n, size = db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(bits) + LENGTH(metric)), 0) FROM outbox"
            ).fetchone()
            made = make()
            reports = [made] if isinstance(made, Report) else list(made)
            if not reports:
                raise ValueError(f"metric {metric!r}: the encoder made no report")
            cost = sum(len(r.bits) + len(metric.encode()) + ROW_OVERHEAD for r in reports)
            if (
                n + len(reports) > self.max_reports
                or size + n * ROW_OVERHEAD + cost > self.max_bytes
            ):
                self._count(db, "refused_full", 1)
                return Claim.FULL
            created = int(self._clock())
            db.executemany(
                "INSERT INTO outbox(report_id, metric, window, cohort, fingerprint, bits, created)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                [
                    (
                        r.report_id,
                        metric,
                        window,
                        r.cohort,
                        _signed(r.params_fingerprint),
                        r.bits,
                        created,
                    )
                    for r in reports
                ],
            )
            db.execute(
                "INSERT INTO claims(metric, window) VALUES (?, ?) "
                "ON CONFLICT(metric) DO UPDATE SET window = MAX(window, excluded.window)",
                (metric, window),
            )
            return Claim.MADE

        result = self._tx(body)
        assert isinstance(result, Claim)
        return result

    def last_window(self, metric: str) -> int | None:
        row = self._db.execute("SELECT window FROM claims WHERE metric = ?", (metric,)).fetchone()
        return None if row is None else int(row[0])

    # -- sending --------------------------------------------------------------

    def pending(
        self, limit: int | None = None, *, exclude: Collection[str] = ()
    ) -> list[PendingReport]:
        """Waiting reports, oldest first; none of the metrics in ``exclude``."""
        skip = list(exclude)
        sql = (
            _SELECT_PENDING
            + (f" WHERE metric NOT IN ({','.join('?' * len(skip))})" if skip else "")
            + " ORDER BY seq"
        )
        return self._pending_rows(
            sql + (" LIMIT ?" if limit is not None else ""),
            (*skip, limit) if limit is not None else tuple(skip),
        )

    def rows_of(self, metric: str) -> list[PendingReport]:
        """Every waiting row of ``metric``, in the order made: its one claim's report or
        group (a metric never has two claims waiting)."""
        return self._pending_rows(_SELECT_PENDING + " WHERE metric = ? ORDER BY seq", (metric,))

    def older(self, window: int, attempt_window: int) -> list[PendingReport]:
        """Rows claimed in ``window`` or before, or first tried in a window other than
        ``attempt_window``: the candidates for dropping (indexed, so a large outbox is
        not read whole)."""
        return self._pending_rows(
            _SELECT_PENDING
            + " WHERE window <= ? OR first_attempt_window < ? OR first_attempt_window > ?"
            " ORDER BY seq",
            (window, attempt_window, attempt_window),
        )

    def _pending_rows(self, sql: str, args: tuple[Any, ...]) -> list[PendingReport]:
        """Rows of ``_SELECT_PENDING`` + ``sql``'s condition, as ``PendingReport``s."""
        with self._lock:
            try:
                rows = self._db.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise OutboxError(f"outbox {self.path}: {exc}") from None
        return [
            PendingReport(
                report=make_report(metric, cohort, bits, fp % _U64, rid),
                window=w,
                created=created,
                attempts=attempts,
                first_attempt_window=first,
            )
            for rid, metric, w, cohort, fp, bits, created, attempts, first in rows
        ]

    def _read(self, sql: str) -> list[Any]:
        """A read outside a transaction, its failure an ``OutboxError`` like every other."""
        with self._lock:
            try:
                return list(self._db.execute(sql).fetchall())
            except sqlite3.Error as exc:
                raise OutboxError(f"outbox {self.path}: {exc}") from None

    def __len__(self) -> int:
        return int(self._read("SELECT COUNT(*) FROM outbox")[0][0])

    def begin_send(
        self,
        report_ids: Sequence[bytes],
        window: int,
        *,
        deadline: float | None = None,
        server_window: int | None = None,
        window_seconds: int | None = None,
    ) -> bool:
        """Record an attempt of these rows in ``window``, before the request leaves.
        With ``deadline`` (device clock), also the attempt's mark for its metric and
        claimed window (``marks``): ``server_window`` is the last server window it can
        arrive in, None when the shuffler told no time (a blind attempt).

        False, recording nothing, when a row is gone (another process on the app dir
        delivered or dropped it since it was read), or when ``window_seconds`` (the
        length the windows given are counted in) is not the outbox's any more (another
        fetch renumbered it since): then it must not be sent."""

        def body(db: sqlite3.Connection) -> bool:
            if window_seconds is not None:
                row = db.execute("SELECT seconds FROM window_length WHERE id = 1").fetchone()
                if row is not None and int(row[0]) != window_seconds:
                    return False
            (present,) = db.execute(
                f"SELECT COUNT(*) FROM outbox WHERE report_id IN "
                f"({','.join('?' * len(report_ids))})",
                list(report_ids),
            ).fetchone()
            if present != len(set(report_ids)):
                return False
            db.executemany(
                "UPDATE outbox SET attempts = attempts + 1,"
                " first_attempt_window = COALESCE(first_attempt_window, ?) WHERE report_id = ?",
                [(window, rid) for rid in report_ids],
            )
            if deadline is None:
                return True
            groups = db.execute(
                f"SELECT DISTINCT metric, window FROM outbox WHERE report_id IN "
                f"({','.join('?' * len(report_ids))})",
                list(report_ids),
            ).fetchall()
            blind = deadline if server_window is None else None
            for metric, claimed in groups:
                db.execute(
                    "INSERT INTO sent(metric, window, server_window, deadline, blind_deadline)"
                    " VALUES (?, ?, ?, ?, ?) ON CONFLICT(metric, window) DO UPDATE SET"
                    " server_window = MAX(COALESCE(server_window, excluded.server_window),"
                    "                     COALESCE(excluded.server_window, server_window)),"
                    " deadline = MAX(deadline, excluded.deadline),"
                    " blind_deadline = MAX(COALESCE(blind_deadline, excluded.blind_deadline),"
                    "                      COALESCE(excluded.blind_deadline, blind_deadline))",
                    (metric, claimed, server_window, deadline, blind),
                )
                # marks of windows before the previous one are dominated (a report is
                # sent only after its predecessors' marks): keep two per metric
                db.execute(
                    "DELETE FROM sent WHERE metric = ? AND window < (SELECT MAX(window) FROM"
                    " sent WHERE metric = ? AND window < ?)",
                    (metric, metric, claimed),
                )
            return True

        return not report_ids or self._tx(body) is True

    def marks(self, metric: str, before: int) -> SendMarks:
        """What was attempted of ``metric``'s reports claimed before window ``before``
        (``crowdmix.client.skew``: when its next report may be sent)."""
        with self._lock:
            try:
                row = self._db.execute(
                    "SELECT MAX(server_window), MAX(deadline), MAX(blind_deadline) FROM sent"
                    " WHERE metric = ? AND window < ?",
                    (metric, before),
                ).fetchone()
            except sqlite3.Error as exc:
                raise OutboxError(f"outbox {self.path}: {exc}") from None
        return SendMarks(server_window=row[0], deadline=row[1], blind_deadline=row[2])

    def acknowledged(self, report_ids: Sequence[bytes], window: int) -> None:
        """The shuffler acknowledged these rows in ``window``: delete them, and count
        ``window`` as used for their metrics (the shuffler filed them under it)."""

        def body(db: sqlite3.Connection) -> None:
            metrics = {
                m
                for (m,) in db.execute(
                    f"SELECT DISTINCT metric FROM outbox WHERE report_id IN "
                    f"({','.join('?' * len(report_ids))})",
                    list(report_ids),
                )
            }
            db.executemany("DELETE FROM outbox WHERE report_id = ?", [(r,) for r in report_ids])
            db.executemany(
                "INSERT INTO claims(metric, window) VALUES (?, ?) "
                "ON CONFLICT(metric) DO UPDATE SET window = MAX(window, excluded.window)",
                [(m, window) for m in metrics],
            )
            self._count(db, "delivered", len(report_ids))

        if report_ids:
            self._tx(body)
            self._checkpoint()

    def _checkpoint(self) -> None:
        """Fold the WAL into the database and truncate it: with ``secure_delete`` the
        deleted rows' bytes are then zeroed in the file and gone from the WAL."""
        # best effort: a failed checkpoint is retried by the next delete
        with self._lock, contextlib.suppress(sqlite3.Error):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def drop(self, report_ids: Iterable[bytes], reason: str, window: int | None = None) -> None:
        """Delete rows that will never be delivered, counted under ``reason``. With
        ``window`` (the current one), a row that was ever tried counts ``window`` as used
        for its metric, as a delivery does: a copy of it may have reached the shuffler,
        which filed it under the window it arrived in."""
        ids = list(report_ids)

        def body(db: sqlite3.Connection) -> None:
            if window is not None:
                tried = [
                    m
                    for (m,) in db.execute(
                        f"SELECT DISTINCT metric FROM outbox WHERE first_attempt_window IS NOT"
                        f" NULL AND report_id IN ({','.join('?' * len(ids))})",
                        ids,
                    )
                ]
                db.executemany(
                    "INSERT INTO claims(metric, window) VALUES (?, ?) "
                    "ON CONFLICT(metric) DO UPDATE SET window = MAX(window, excluded.window)",
                    [(m, window) for m in tried],
                )
            n = 0
            for rid in ids:
                n += db.execute("DELETE FROM outbox WHERE report_id = ?", (rid,)).rowcount
            self._count(db, reason, n)

        if ids:
            self._tx(body)
            self._checkpoint()

    def counters(self) -> dict[str, int]:
        rows = self._read("SELECT name, n FROM counters")
        return {str(k): int(v) for k, v in rows}

    # -- the cached config ----------------------------------------------------

    def cached_config(self) -> tuple[bytes, float] | None:
        """The last stored GetConfig answer and its fetch time (Unix seconds)."""
        rows = self._read("SELECT answer, fetched FROM config WHERE id = 1")
        return None if not rows else (bytes(rows[0][0]), float(rows[0][1]))

    def store_config(
        self,
        answer: bytes,
        fetched: float,
        *,
        window_seconds: int | None = None,
        previous_window_seconds: int | None = None,
    ) -> None:
        """Cache ``answer``. With ``window_seconds`` (the answer's collection window), a
        change of the window's length renumbers the stored windows in the same
        transaction: a window number means nothing without its length. A claimed window
        becomes the new window holding its last second (so no new report shares the
        time it covered); a row tried under the old length is never sent again (the
        aggregator cannot match ids across the change: it is dropped as unconfirmed).
        ``previous_window_seconds`` is the length of the cached answer, for an outbox
        that has not recorded one."""

        def body(db: sqlite3.Connection) -> None:
            if window_seconds is not None:
                row = db.execute("SELECT seconds FROM window_length WHERE id = 1").fetchone()
                old = int(row[0]) if row is not None else previous_window_seconds
                if old is not None and old != window_seconds:
                    last = "((window + 1) * ? - 1) / ?"  # windows are positive: / floors
                    args = (old, window_seconds)
                    db.execute(f"UPDATE claims SET window = {last}", args)
                    # per metric, one mark before every window (-1), its server window
                    # the new one holding the old one's last second
                    marks = db.execute(
                        "SELECT metric, MAX(server_window), MAX(deadline), MAX(blind_deadline)"
                        " FROM sent GROUP BY metric"
                    ).fetchall()
                    db.execute("DELETE FROM sent")
                    db.executemany(
                        "INSERT INTO sent(metric, window, server_window, deadline,"
                        " blind_deadline) VALUES (?, -1, ?, ?, ?)",
                        [
                            (m, None if w is None else ((w + 1) * old - 1) // window_seconds, d, b)
                            for m, w, d, b in marks
                        ],
                    )
                    db.execute(
                        f"UPDATE outbox SET window = {last}, first_attempt_window ="
                        " CASE WHEN first_attempt_window IS NULL THEN NULL ELSE -1 END",
                        args,
                    )
                db.execute(
                    "INSERT INTO window_length(id, seconds) VALUES (1, ?) "
                    "ON CONFLICT(id) DO UPDATE SET seconds = excluded.seconds",
                    (window_seconds,),
                )
            db.execute(
                "INSERT INTO config(id, answer, fetched) VALUES (1, ?, ?) "
                "ON CONFLICT(id) DO UPDATE SET answer = excluded.answer,"
                " fetched = excluded.fetched",
                (answer, fetched),
            )

        self._tx(body)

    def close(self) -> None:
        with self._lock:
            self._db.close()
