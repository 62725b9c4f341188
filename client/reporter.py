"""The SDK an app embeds: ``Reporter`` — a report claimed is a report delivered.

    from crowdmix import client
    reporter = client.Reporter(app_dir, "shuffler.example:7400", token=APP_TOKEN,
                               bundled_config="crowdmix-config.pb")
    result = reporter.report("theme", "dark")   # result.status: CLAIMED, NO_CONFIG, ...
    reporter.flush(timeout=2.0)                 # at exit: the number still queued
    reporter.close()

Config comes from ``GetConfig`` (cached; a bundled config allows the first report offline).
One report per metric per window, claimed and stored in one transaction of
``app_dir/outbox.sqlite3``; ``report`` then never raises or blocks: a background thread does
all network I/O, as ``crowdmix.client.delivery.decide`` says. Params above the ceiling
(``crowdmix.client.ceiling``), or a heavy-hitters metric without its window's round, make no
report. Programmer errors raise at construction. No grpc/protobuf import. docs/design.md, "Client".
"""

from __future__ import annotations

import contextlib
import enum
import importlib.util
import logging
import math
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from crowdmix.client.answers import Action, Answer, classify
from crowdmix.client.ceiling import MAX_EPSILON, MAX_EPSILON_INF, Ceiling
from crowdmix.client.delivery import (
    CLOCK_SLACK,
    CachedConfig,
    Drop,
    Offline,
    Reading,
    Send,
    SendState,
    Wait,
    check_server_time,
    decide,
)
from crowdmix.client.delivery import monotonic as device_monotonic
from crowdmix.client.errors import CrowdmixClientError
from crowdmix.client.outbox import Claim, Outbox, OutboxError
from crowdmix.client.target import check_target

if TYPE_CHECKING:
    from crowdmix.client.basic import BasicEncoder
    from crowdmix.client.discovery import WindowEncoder
    from crowdmix.client.histogram import HistogramEncoder
    from crowdmix.client.link import Link
    from crowdmix.client.randomness import BitSource
    from crowdmix.client.rappor import RapporEncoder
    from crowdmix.core.device_config import DeviceConfig
    from crowdmix.core.registry import MetricConfig

__all__ = ["ReportResult", "ReportStatus", "Reporter"]

log = logging.getLogger("crowdmix.client")

Sealing = Literal["required", "off"]
SECRET_BYTES = 32
#: A heavy-hitters report without a served round for its window fetches the config
#: again, at most once per this many seconds (device clock) of the config's age.
ROUND_REFETCH_SECONDS = 10.0
#: How long the background sender waits for a connection before it backs off.
BACKGROUND_CONNECT_WAIT = 1.0


class ReportStatus(enum.Enum):
    """What ``Reporter.report`` did; every status but the first two is counted in
    ``counters()`` under its value."""

    CLAIMED = "claimed"  # made and queued: it leaves with the background sender
    ALREADY_REPORTED_THIS_WINDOW = "already_reported_this_window"
    NO_CONFIG = "no_config"  # never reached the shuffler, and no bundled config
    UNKNOWN_METRIC = "unknown_metric"  # not in the (cached or bundled) config
    INVALID_VALUE = "invalid_value"  # not a value of the metric's domain or type
    REFUSED_BY_CEILING = "refused_by_ceiling"  # served params above the privacy ceiling
    REFUSED_UNSEALED = "refused_unsealed"  # a shuffled histogram with sealing="off"
    NO_ROUND = "no_round"  # heavy hitters: no round served for this window (yet)
    NOT_THIS_ROUND = "not_this_round"  # heavy hitters: this device is in another round
    OUTBOX_FULL = "outbox_full"  # max_reports or max_bytes reached
    OUTBOX_UNUSABLE = "outbox_unusable"  # the outbox file cannot be written
    CLOSED = "closed"  # report() after close()
    INTERNAL_ERROR = "internal_error"  # a bug of this SDK: logged, never raised


@dataclass(frozen=True, slots=True)
class ReportResult:
    """The outcome of one ``report`` call; true only when a report was claimed."""

    status: ReportStatus
    detail: str = ""

    def __bool__(self) -> bool:
        return self.status is ReportStatus.CLAIMED


_CLAIMED = ReportResult(ReportStatus.CLAIMED)
_ALREADY = ReportResult(ReportStatus.ALREADY_REPORTED_THIS_WINDOW)


def _device_secret(path: Path) -> bytes:
    """The device secret at ``path``: made once (32 CSPRNG bytes, 0600), then read.

    Made under a temporary name and linked into place (``link`` fails if the name
    exists), so a crash never leaves a short secret and two processes starting at
    once agree on one."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(tmp, "wb", opener=lambda p, f: os.open(p, f | os.O_TRUNC, 0o600)) as fh:
            fh.write(os.urandom(SECRET_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass  # another process made it first: use theirs
        finally:
            tmp.unlink()
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    secret = path.read_bytes()
    if len(secret) != SECRET_BYTES:
        raise CrowdmixClientError(
            f"{path} is not a device secret ({len(secret)} bytes, expected {SECRET_BYTES})"
        )
    return secret


def backoff_delay(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(cap, base·2^failures)]
    (never quite 0, so a busy loop is impossible)."""
    return max(rng.uniform(0.0, min(cap, base * 2 ** min(failures, 30))), 0.001)


def _check_extra(sealing: Sealing) -> None:
    """Fail at construction, naming the extra, rather than at the first send."""
    needed = ["google.protobuf", "grpc"] + (["cryptography"] if sealing == "required" else [])
    for name in needed:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # the parent package ("google") is missing
            found = False
        if not found:
            raise ModuleNotFoundError(
                f"client.Reporter needs {name}: pip install 'crowdmix[transport]'", name=name
            )


def _value_problem(encoder: object, value: object) -> str | None:
    """Why ``value`` cannot be encoded by ``encoder``, or None."""
    from crowdmix.client.basic import BasicEncoder
    from crowdmix.client.discovery import WindowEncoder
    from crowdmix.client.histogram import HistogramEncoder

    if isinstance(encoder, WindowEncoder):
        if not isinstance(value, str):
            return f"metric {encoder.metric!r}: a heavy-hitters value is a str, got {value!r}"
        return None
    if isinstance(encoder, BasicEncoder | HistogramEncoder):
        if isinstance(value, bool) or not isinstance(value, str | int):
            return f"metric {encoder.metric!r}: a value is a str or an int, got {value!r}"
        try:
            encoder.index_of(value)
        except ValueError as exc:
            return f"metric {encoder.metric!r}: {exc}"
    elif not isinstance(value, str | bytes):
        return f"a value of a RAPPOR metric is a str or bytes, got {value!r}"
    return None


def _load_bundled(path: str | os.PathLike[str], now: Reading) -> CachedConfig:
    """A config bundled with the app (``crowdmix config export``); ``ValueError`` naming
    the file when it is not one."""
    from crowdmix.client.device_config import from_proto
    from crowdmix.protos import crowdmix_pb2 as pb

    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ValueError(f"bundled_config {str(path)!r}: {exc.strerror or exc}") from None
    try:
        config = from_proto(pb.ConfigResponse.FromString(raw))
    except Exception as exc:  # DecodeError or ParamsError: not a config this SDK reads
        raise ValueError(
            f"bundled_config {str(path)!r} is not a config this SDK reads "
            f"(write one with `crowdmix config export`): {exc}"
        ) from None
    # never fetched: the device's wall clock stands in for the server's until the sender
    # fetches a fresh one, at once
    return CachedConfig(config, now.wall, now, age=math.inf)


class Reporter:
    """Claims, encodes, stores and delivers an app's reports (see the module docstring).

    ``app_dir`` holds the outbox and the device secret (created 0700). ``target``
    (``host:port``) and ``token`` name the shuffler; ``tls`` (default) uses the system
    roots unless ``root_certificates`` are given. ``bundled_config`` is a file written
    by ``crowdmix config export``, used until the shuffler is reached. ``max_reports``
    and ``max_bytes`` bound the outbox. ``max_epsilon``, ``max_epsilon_inf`` and
    ``allow_unrandomized_histograms`` set the privacy ceiling (``math.inf``: none).
    ``clock`` (Unix seconds) and ``monotonic`` are the device's wall and monotonic
    clocks (tests set them): windows follow the server time of the last ``GetConfig``
    plus the monotonic time since (``crowdmix.client.delivery.CachedConfig``).
    ``rand`` is where the encoders' coins come from: the shared CSPRNG unless a test
    injects a seeded ``BitSource`` (with a secret file it wrote in ``app_dir``, the
    device's reports are then deterministic).
    """

    def __init__(
        self,
        app_dir: str | os.PathLike[str],
        target: str,
        token: str | None = None,
        *,
        tls: bool = True,
        root_certificates: bytes | None = None,
        sealing: Sealing = "required",
        bundled_config: str | os.PathLike[str] | None = None,
        max_reports: int = 1000,
        max_bytes: int = 1 << 20,
        timeout: float = 10.0,
        backoff_base: float = 1.0,
        backoff_cap: float = 300.0,
        background: bool = True,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = device_monotonic,
        jitter: random.Random | None = None,
        max_epsilon: float = MAX_EPSILON,
        max_epsilon_inf: float = MAX_EPSILON_INF,
        allow_unrandomized_histograms: bool = False,
        rand: BitSource | None = None,
    ) -> None:
        if sealing not in ("required", "off"):
            raise ValueError(f"sealing must be 'required' or 'off', got {sealing!r}")
        self.target = check_target(target)
        self._ceiling = Ceiling(
            max_epsilon=max_epsilon,
            max_epsilon_inf=max_epsilon_inf,
            allow_unrandomized_histograms=allow_unrandomized_histograms,
        )
        _check_extra(sealing)
        self._clock, self._monotonic = clock, monotonic
        self._bundled = (
            None if bundled_config is None else _load_bundled(bundled_config, self._now())
        )
        self.app_dir = Path(app_dir)
        try:
            self.app_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._secret = _device_secret(self.app_dir / "secret")
        except OSError as exc:
            raise CrowdmixClientError(
                f"cannot use the app directory {self.app_dir}: {exc.strerror or exc}"
            ) from None
        self._outbox = Outbox(
            self.app_dir / "outbox.sqlite3", max_reports=max_reports, max_bytes=max_bytes
        )
        self._token = token
        self._tls = tls
        self._roots = root_certificates
        self.sealing: Sealing = sealing
        self._timeout = timeout
        self._backoff = (backoff_base, backoff_cap)
        # timing jitter only (no privacy depends on it); injectable for tests
        self._jitter = jitter if jitter is not None else random.Random()
        self._rand = rand  # None: each encoder's default, the shared CSPRNG
        self._cached: CachedConfig | None = None
        self._encoders: dict[tuple[str, int], RapporEncoder | BasicEncoder | HistogramEncoder] = {}
        self._window_encoders: dict[str, WindowEncoder] = {}  # heavy hitters: this window's
        self._link: Link | None = None
        self._reset_link = False
        self._send_lock = threading.Lock()
        self._link_lock = threading.Lock()
        self._cond = threading.Condition()
        self._wake = False
        self._closed = False
        self._failures = 0
        self._retry_at = 0.0  # time.monotonic() before which the sender backs off
        self._told: set[str] = set()  # problems logged at WARNING (once each)
        self._at_close: tuple[int, dict[str, int]] | None = None
        self.last_error: str | None = None
        self._background = background
        self._thread: threading.Thread | None = None
        if background and len(self._outbox):
            self._start_sender()  # reports from an earlier run

    # -- config ---------------------------------------------------------------

    def _in_use(self) -> CachedConfig | None:
        """The config in use: the last fetched (this process's, else the outbox's
        cache), else the bundled one; None when there is none."""
        if self._cached is None:
            cached = self._outbox.cached_config()
            if cached is not None:
                from crowdmix.client.device_config import from_proto
                from crowdmix.protos import crowdmix_pb2 as pb

                raw, fetched, offset = cached
                try:
                    self._cached = CachedConfig.restored(
                        from_proto(pb.ConfigResponse.FromString(raw)), fetched, offset, self._now()
                    )
                except Exception as exc:  # a damaged cache is refetched, never trusted
                    log.warning("ignoring the cached config: %s", exc)
        return self._cached if self._cached is not None else self._bundled

    def _fetch(self, timeout: float) -> Answer | None:
        """Fetch, check and cache the shuffler's config; None when done, else why not."""
        from crowdmix.client.device_config import from_proto
        from crowdmix.client.link import LinkError
        from crowdmix.protos import crowdmix_pb2 as pb

        try:
            raw = self._get_link().get_config(timeout)
        except LinkError as exc:
            return classify(exc.code, exc.details)
        received = self._now()
        try:
            answer = pb.ConfigResponse.FromString(raw)
            config, server_time = from_proto(answer), check_server_time(answer.server_time)
        except Exception as exc:  # DecodeError, ParamsError, ValueError: unusable here
            return Answer(Action.FATAL, "bad_config", f"GetConfig: bad answer: {exc}")
        # for a later process: the wall clock's offset (CachedConfig.restored)
        self._outbox.store_config(raw, received.wall, server_time - received.wall)
        self._cached = CachedConfig(config, server_time, received)
        return None

    def _keep_server_time(self) -> None:
        """The wall clock was set since this process learnt the server time, and the
        fetch that would correct it failed: store the offset of the server time this
        process uses (the monotonic one) against the wall clock as it now reads, so a
        restart before the next fetch names the windows this process names, not ones
        the old offset puts a clock-change away."""
        c, now = self._cached, self._now()
        if c is None or not c.learnt() or not c.drifted(now):
            return
        stored = self._outbox.cached_config()
        offset = c.server_now(now) - now.wall
        if stored is not None and abs(stored[2] - offset) > CLOCK_SLACK:
            self._outbox.store_config(stored[0], now.wall - c.held(now), offset)

    def _now(self) -> Reading:
        return Reading(self._clock(), self._monotonic())

    def config(self) -> DeviceConfig | None:
        """The config in use (fetched, cached or bundled; None when there is none)."""
        in_use = self._in_use()
        return None if in_use is None else in_use.config

    # -- making reports -------------------------------------------------------

    def _encoder(
        self, metric: str, mc: MetricConfig
    ) -> RapporEncoder | BasicEncoder | HistogramEncoder:
        enc = self._encoders.get((metric, mc.fingerprint))
        if enc is None:
            if mc.rappor is not None:
                from crowdmix.client.rappor import RapporEncoder

                enc = RapporEncoder(
                    mc.rappor,
                    secret=self._secret,
                    metric=metric,
                    hashing=mc.hashing,
                    rand=self._rand,
                )
            elif mc.histogram is not None:
                from crowdmix.client.histogram import HistogramEncoder

                # the default coins: the shared CSPRNG; report ids from os.urandom
                enc = HistogramEncoder(
                    mc.histogram, metric=metric, domain=mc.domain, rand=self._rand
                )
            else:
                from crowdmix.client.basic import BasicEncoder

                assert mc.basic is not None  # MetricConfig holds one of the three
                enc = BasicEncoder(mc.basic, metric=metric, domain=mc.domain, rand=self._rand)
            self._encoders[(metric, mc.fingerprint)] = enc
        return enc

    def report(self, metric: str, value: str | bytes | int) -> ReportResult:
        """Make this window's report of ``metric`` from ``value``: claim the window,
        encode, store — one transaction — and wake the sender. Never raises and never
        waits for the network: the result says what happened (true when a report was
        claimed); a refusal is counted in ``counters()`` and its ``detail`` says why."""
        try:
            return self._report(metric, value)
        except OutboxError as exc:
            return self._refused(ReportStatus.OUTBOX_UNUSABLE, str(exc))
        except Exception as exc:  # never into the host app
            log.warning("report(%r) failed: %s: %s", metric, type(exc).__name__, exc)
            return self._refused(ReportStatus.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")

    def _report(self, metric: str, value: str | bytes | int) -> ReportResult:
        if self._closed:
            return ReportResult(ReportStatus.CLOSED, "the reporter is closed")
        in_use = self._in_use()
        now = self._now()
        if in_use is None or in_use.expired(now):
            self._poke()  # the sender fetches one; this report uses what is in hand
        if in_use is None:
            return self._refused(
                ReportStatus.NO_CONFIG,
                "the shuffler was never reached and no bundled_config was given"
                + (f" ({self.last_error})" if self.last_error else ""),
            )
        mc = in_use.config.metrics.get(metric)
        if mc is None:
            return self._refused(
                ReportStatus.UNKNOWN_METRIC, f"metric {metric!r} is not in the shuffler's config"
            )
        if mc.histogram is not None and self.sealing != "required":
            return self._refused(
                ReportStatus.REFUSED_UNSEALED,
                f"metric {metric!r} is a shuffled histogram: its reports are sent sealed or "
                "not at all, and this reporter has sealing='off'",
            )
        refusal = self._ceiling.refusal(metric, mc)
        if refusal is not None:
            return self._refused(ReportStatus.REFUSED_BY_CEILING, refusal)
        window = in_use.window(now)
        encoder: RapporEncoder | BasicEncoder | HistogramEncoder | WindowEncoder
        if mc.heavy_hitters is not None:
            made = self._window_encoder(metric, mc, in_use, window, now)
            if isinstance(made, ReportResult):
                return made
            encoder = made
        else:
            encoder = self._encoder(metric, mc)
        problem = _value_problem(encoder, value)
        if problem is not None:
            return self._refused(ReportStatus.INVALID_VALUE, problem)
        claim = self._outbox.claim(
            metric,
            window,
            in_use.config.window_seconds,
            lambda: encoder.encode(value),  # type: ignore[arg-type]
        )
        if claim is Claim.USED:
            return _ALREADY
        if claim is Claim.FULL:  # counted by the outbox
            box = self._outbox
            detail = f"the outbox holds {box.max_reports} reports or {box.max_bytes} bytes"
            log.warning("report of %r refused: %s", metric, detail)
            return ReportResult(ReportStatus.OUTBOX_FULL, detail)
        self._poke()
        return _CLAIMED

    def _window_encoder(
        self, metric: str, mc: MetricConfig, in_use: CachedConfig, window: int, now: Reading
    ) -> WindowEncoder | ReportResult:
        """The encoder of the round served for ``window``; without one, NO_ROUND (and
        the config is fetched again: the round may have been written since)."""
        from crowdmix.client.discovery import WindowEncoder, device_round

        assert mc.heavy_hitters is not None  # the caller's test
        served = in_use.config.round_of(metric, window)
        if served is None:
            if in_use.held(now) >= ROUND_REFETCH_SECONDS and in_use is self._cached:
                self._cached = replace(in_use, age=math.inf)  # the sender refetches
                self._poke()
            return self._refused(
                ReportStatus.NO_ROUND,
                f"metric {metric!r}: no discovery round is served for window {window} yet "
                "(nothing is made: a report is encoded only against its window's round)",
            )
        mine = device_round(
            self._secret, metric, mc.fingerprint, served.opened, mc.heavy_hitters.weights
        )
        if mine != served.round:
            return self._refused(
                ReportStatus.NOT_THIS_ROUND,
                f"metric {metric!r}: this device reports in round {mine} of the discovery, "
                f"not in round {served.round} (window {window}): each device is in one round",
            )
        if not served.epsilon <= self._ceiling.max_epsilon:
            return self._refused(
                ReportStatus.REFUSED_BY_CEILING,
                f"metric {metric!r}: the served round gives ε = {served.epsilon:.6g}, above "
                f"this device's ceiling max_epsilon = {self._ceiling.max_epsilon:g}",
            )
        enc = self._window_encoders.get(metric)
        fingerprint = served.fingerprint(mc.fingerprint)  # the report is bound to its round
        if enc is None or enc.window != window or enc.fingerprint != fingerprint:
            enc = WindowEncoder(
                served.params(mc.heavy_hitters),
                metric=metric,
                fingerprint=fingerprint,
                window=window,
                rand=self._rand,
            )
            self._window_encoders[metric] = enc
        return enc

    def _refused(self, status: ReportStatus, detail: str) -> ReportResult:
        log.info("no report made (%s): %s", status.value, detail)
        with contextlib.suppress(OutboxError):  # the result says it; the count is best effort
            self._outbox.count(status.value)
        return ReportResult(status, detail)

    # -- sending --------------------------------------------------------------

    def _get_link(self) -> Link:
        with self._link_lock:
            if self._link is not None and self._reset_link:
                self._link.close()
                self._link = None
            self._reset_link = False
            if self._link is None:
                from crowdmix.client.link import Link

                self._link = Link(
                    self.target,
                    self._token,
                    tls=self._tls,
                    root_certificates=self._roots,
                    timeout=self._timeout,
                )
            return self._link

    def _send_pass(self, deadline: float, connect_wait: float, backoff: float) -> Wait | Offline:
        """Act on ``decide`` until it says to wait or to stop (see crowdmix.client.delivery)."""
        state = SendState(sealing=self.sealing, ceiling=self._ceiling, backoff=backoff)
        refused: dict[tuple[str, int], Answer] = {}  # this pass's refusals, per group
        # groups whose window has not begun on the server even after a refetch (a clock
        # that was set forward): they wait, and the groups behind them go on
        ahead: dict[tuple[str, int], Offline] = {}
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or (self._closed and threading.current_thread() is self._thread):
                return Offline("out of time" if left <= 0 else "closing")
            rows = self._outbox.next_group(skip=ahead)
            group = (rows[0].report.metric, rows[0].window) if rows else ("", 0)
            action = decide(
                rows, self._in_use(), self._now(), replace(state, answer=refused.get(group))
            )
            if isinstance(action, Send):
                answer = self._deliver(action, deadline, connect_wait)
                if answer is None:
                    self._outbox.acknowledged([r.report.report_id for r in action.rows])
                else:
                    refused[group] = answer
            elif isinstance(action, Drop):
                if action.message:
                    log.warning(
                        "%d reports dropped (%s): %s",
                        len(action.report_ids),
                        action.reason,
                        action.message,
                    )
                if action.reason == "window_ahead":  # never taken: the claim moves back
                    self._outbox.withdraw(action.report_ids)
                else:
                    self._outbox.drop(action.report_ids, action.reason)
            elif (
                isinstance(action, Offline)
                and not action.fatal
                and group in refused
                and refused[group].reason == "window_ahead"
            ):
                ahead[group] = action
            elif isinstance(action, Wait | Offline):
                if not rows and ahead:  # only early reports wait: retry them later
                    return next(iter(ahead.values()))
                return action
            else:  # Refetch: at most once a pass, then send again what was refused
                failure = self._fetch(min(self._timeout, left))
                if failure is not None:
                    self._keep_server_time()
                state = replace(state, refetched=True, fetch_failure=failure)
                refused.clear()

    def _deliver(self, send: Send, deadline: float, connect_wait: float) -> Answer | None:
        """Submit one group; None when acknowledged, else the classified refusal."""
        from crowdmix.client.link import LinkError
        from crowdmix.client.request import submit_request

        link = self._get_link()
        why = link.unreachable(min(connect_wait, max(deadline - time.monotonic(), 0.0)))
        if why is not None:
            return classify(why.code, why.details)
        metric = send.rows[0].report.metric
        request = submit_request(
            [(r.report, r.window) for r in send.rows],
            key=send.key,
            report_bytes={metric: send.report_bytes},
            round_bound=frozenset((metric,) if send.round_bound else ()),
        )
        try:
            self._submit(request, min(self._timeout, max(deadline - time.monotonic(), 0.1)))
        except LinkError as exc:
            return classify(exc.code, exc.details)
        return None

    def _submit(self, request: object, timeout: float) -> int:
        """One Submit (a separate method: the crash tests stop the process around it)."""
        return self._get_link().submit(request, timeout)  # type: ignore[arg-type]

    def _try_send(
        self, timeout: float, connect_wait: float, backoff: float = 0.0
    ) -> Wait | Offline:
        """One pass of the sender, and what the app should hear of it."""
        if not self._send_lock.acquire(timeout=max(timeout, 0.0)):
            return Wait(BACKGROUND_CONNECT_WAIT)  # the other sender is at it
        try:
            result = self._send_pass(time.monotonic() + timeout, connect_wait, backoff)
        finally:
            self._send_lock.release()
        problem = result.reason if isinstance(result, Offline) else result.problem
        if isinstance(result, Offline) and not result.fatal:
            log.info("reports wait: %s", problem)
        elif problem is not None and problem not in self._told:
            self._told.add(problem)  # a setup error retrying cannot fix: said once
            log.warning("crowdmix reports cannot be delivered: %s", problem)
        if problem is not None or backoff == 0.0:
            self.last_error = problem
        return result

    def flush(self, timeout: float = 5.0) -> int:
        """Send what waits, for up to ``timeout`` seconds, in this thread; the number of
        reports still queued (0: all acknowledged). Never raises: what is left is sent
        by the background sender or at the next start."""
        if self._closed:
            return self.queued
        try:
            self._try_send(timeout, connect_wait=timeout)
        except Exception as exc:  # an unusable outbox, or a bug: never into the host app
            log.warning("flush failed: %s: %s", type(exc).__name__, exc)
            self.last_error = f"{type(exc).__name__}: {exc}"
        return self.queued

    @property
    def queued(self) -> int:
        """Reports claimed and not yet acknowledged (-1 when the outbox cannot be read)."""
        if self._at_close is not None:
            return self._at_close[0]
        try:
            return len(self._outbox)
        except OutboxError:
            return -1

    @property
    def failed_attempts(self) -> int:
        """The background sender's failed passes in a row (0 after a success or
        ``network_available``): its backoff grows with this."""
        return self._failures

    def counters(self) -> dict[str, int]:
        """Reports delivered, those that left without delivery and the ``report`` calls
        that made none, by reason (``ReportStatus`` values, ``window_closed``,
        ``params_changed``, ``round_changed``, ``refused``, ``refused_by_ceiling``)."""
        if self._at_close is not None:
            return dict(self._at_close[1])
        try:
            return self._outbox.counters()
        except OutboxError:
            return {}

    def network_available(self) -> None:
        """The platform says the network is back: reconnect and send now, backoff reset."""
        with self._cond:
            self._failures = 0
            self._retry_at = 0.0
            self._reset_link = True
        self._poke()

    # -- the background sender ------------------------------------------------

    def _start_sender(self) -> None:
        with self._cond:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="crowdmix-outbox", daemon=True
                )
                self._thread.start()

    def _poke(self) -> None:
        if not self._background:
            return
        self._start_sender()
        with self._cond:
            self._wake = True
            self._cond.notify_all()

    def _run(self) -> None:
        delay: float | None = 0.0
        while True:
            with self._cond:
                if not self._closed and not self._wake and delay != 0.0:
                    self._cond.wait(delay)
                self._wake = False
                if self._closed:
                    return
            backoff = max(self._retry_at - time.monotonic(), 0.0)
            try:
                result = self._try_send(self._timeout * 3, BACKGROUND_CONNECT_WAIT, backoff)
            except Exception as exc:  # a dead sender would end sending silently
                log.warning(
                    "the sender failed (%s: %s); it tries again later", type(exc).__name__, exc
                )
                self.last_error = f"{type(exc).__name__}: {exc}"
                result = Offline(self.last_error)
            if isinstance(result, Offline):
                self._failures += 1
                delay = backoff_delay(self._failures, *self._backoff, self._jitter)
                self._retry_at = time.monotonic() + delay
            else:
                if backoff == 0.0:
                    self._failures = 0
                delay = result.seconds  # None: idle until a report is made or poked

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        """Stop the sender and close the connection and the outbox (what waits stays
        on disk; call ``flush(timeout)`` first to send it now)."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._send_lock:
            if self._link is not None:
                self._link.close()
            self._at_close = (self.queued, self.counters())
            self._outbox.close()

    def __enter__(self) -> Reporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
