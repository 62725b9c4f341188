"""The SDK an app embeds: ``Reporter`` — a report claimed is a report delivered.

    from crowdmix import client
    reporter = client.Reporter(app_dir, "shuffler.example:7400", token=APP_TOKEN)
    reporter.report("theme", "dark")     # True: this window's report is made and queued
    ...
    reporter.flush(timeout=2.0)          # at exit: the number still queued (sent next start)
    reporter.close()

The app names the metric and the value, nothing else:

- **Config from the server.** Each metric's encoding and params, the collection
  window and the aggregator's public keys come from the shuffler (``GetConfig``).
  The answer is cached in the outbox with its lifetime (``cache_seconds``), so an
  app that starts offline uses the last one; once it expires, the sender fetches a
  new one before sending. An answer that says the config is outdated — a
  ``stale_key`` refusal, or an ``INVALID_ARGUMENT`` such as a params mismatch —
  makes the sender refetch it once and retry.
- **One report per metric per window, durable** (``crowdmix.client.outbox``): claiming the
  window and storing the encoded report are one SQLite transaction, in
  ``app_dir/outbox.sqlite3``; a report leaves it only when the shuffler
  acknowledged it, and keeps its report id through every retry, across restarts.
  A process killed at any moment loses no claimed report and never makes a second
  one for a window.
- **Shuffled histograms** (``crowdmix.client.histogram``): the real report and its
  Binomial(m, q) fakes (coins from the CSPRNG) are one claim — made, stored,
  sent in ONE Submit call (the shuffler's per-call cap of 1 + m and the device
  bound assume one call per device), and deleted on its acknowledgement
  together, each with its own report id through every retry. A metric never has
  two claims waiting, so its rows in the outbox are its group. Such a metric
  must be sealed: with ``sealing="off"`` ``report`` raises ``ParamsError``.
- **The device secret** (which keys the permanent randomized response and picks
  the cohort) is made once, in ``app_dir/secret`` (0600).
- **A background sender** tries when a report is made, then with exponential
  backoff and full jitter (uniform in [0, min(cap, base·2^n)]) while the shuffler
  cannot be reached; ``network_available()`` (call it from the platform's
  connectivity callback) resets the backoff and tries now. ``flush(timeout)``
  sends in the caller's thread and returns the number of reports still queued —
  it never raises for the network; they go out at the next start.

Sealing. ``sealing="required"`` (the default) seals every report to the
aggregator's public key (``crowdmix.client.sealing``, RFC 9180 HPKE) when it is *sent*,
with the newest key usable then; a shuffler that publishes no key gets nothing
(the reports wait), so a server cannot downgrade the SDK to clear reports.
``sealing="off"`` is the explicit opt-out (plaintext setups). Sealing at send
time, not at enqueue, means a key that expires or rotates while the device is
offline never strands a report (a sealed blob cannot be resealed without its
plaintext). The price: the outbox holds the *encoded* report in the clear on the
device. Those bits are already randomized on the device (ε₁-LDP for one report,
see ``crowdmix.client.privacy``), never the value; and whoever can read the app's storage
can read ``app_dir/secret`` and the app's own data (the setting itself) anyway.
Rows are deleted with SQLite's ``secure_delete`` once acknowledged.

Not sent again: a report whose first send attempt lies in an earlier collection
window, or whose repeat would reach the server after that window ends (the
aggregator recognises a repeated id only within its window and the adjacent ones,
on the server's clock, so copies must not be filed two windows apart: copies sent
within one window of the device's clock land in at most two adjacent server windows,
whatever the clocks' offset), and a
report of a window older than the metric's disposal age; both are dropped and
counted (``counters()``: ``unconfirmed``, ``expired``).
Refused for good (an ``INVALID_ARGUMENT`` that a fresh config does not cure):
dropped and counted as ``refused``. Encoded under params the server no longer
has: ``params_changed``.

Held, not sent yet (``crowdmix.client.skew``): the shuffler files a report under the window
of *its* clock when the report arrives, so a metric's new report leaves only when
the server's clock is surely past every window a copy of the metric's previous
report may have arrived in. ``GetConfig`` answers with the server's time; the
device bounds its clock's offset from the request's send and receive times and
renews the estimate before it sends when it is an hour old, made by an earlier
process, or the wall clock was set since (no report leaves without one). What was
sent is marked in the outbox before the request leaves, so a restart keeps the
rule. An older shuffler that sends no time gets the gap rule: a new report leaves
one window (device clock) after the previous one's last deadline. A held report
is queued (``flush`` counts it); the background sender wakes when it may go.

Privacy ceiling: the device refuses a served config less private than
``max_epsilon`` per report (RAPPOR's ε_1, a basic mechanism's ε, a shuffled
histogram's ε_L) or, for RAPPOR, ``max_epsilon_inf`` (ε_∞, any number of reports
of one value): ``report`` raises ``ParamsError`` naming the metric, the figure and
the ceiling, and claims nothing; a stored report whose params exceed it (made
under a looser ceiling, by an earlier run) is not sent: dropped, counted as
``refused``. A histogram without local randomization (ε_L =
∞, the value hidden only by the seal and the shuffle) is refused unless the app
passes ``allow_unrandomized_histograms=True``.

Importing this module loads neither grpc nor protobuf; the config (protobuf) is
read on the first ``report``, grpc (``crowdmix.client.link``) only to fetch or to send.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Literal

from crowdmix.client.errors import CrowdmixClientError, ParamsError, TransportError
from crowdmix.client.outbox import Claim, Outbox
from crowdmix.client.report import Report
from crowdmix.client.skew import (
    SERVER_TIME_RANGE,
    ClockEstimate,
    hold_seconds,
    last_arrival_window,
    plausible_server_time,
)

if TYPE_CHECKING:
    from crowdmix.client.basic import BasicEncoder
    from crowdmix.client.device_config import DeviceConfig
    from crowdmix.client.histogram import HistogramEncoder
    from crowdmix.client.link import Link
    from crowdmix.client.rappor import RapporEncoder
    from crowdmix.client.registry import MetricConfig

__all__ = ["Reporter"]

log = logging.getLogger("crowdmix.client")

Sealing = Literal["required", "off"]
SECRET_BYTES = 32
#: How long ``report`` waits for a config when it has none or its own expired.
CONFIG_WAIT = 2.0
#: How long the background sender waits for a connection before it backs off.
BACKGROUND_CONNECT_WAIT = 1.0
#: The default privacy ceiling: a served metric whose one report is less private than
#: this (RAPPOR ε_1, a basic mechanism's ε, a histogram's ε_L) makes no report.
MAX_EPSILON = 10.0
#: The default ceiling on RAPPOR's ε_∞ (any number of reports of one value).
MAX_EPSILON_INF = 20.0
#: The background sender looks again at reports held for the server's next window at
#: least this often (seconds): the device clock it computed the wait on may move.
HOLD_RECHECK = 300.0
#: Status codes after which the request may succeed later: keep the reports, back off.
_TRY_LATER = frozenset(
    {
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "DEADLINE_EXCEEDED",
        "ABORTED",
        "UNKNOWN",
        "INTERNAL",
        "CANCELLED",
        "UNAUTHENTICATED",  # a token the app may still renew: keep the reports
        "PERMISSION_DENIED",
        "UNIMPLEMENTED",  # an older shuffler without GetConfig
    }
)


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


def _check_ceiling(
    metric: str,
    mc: MetricConfig,
    *,
    max_epsilon: float,
    max_epsilon_inf: float,
    allow_unrandomized_histograms: bool,
) -> None:
    """``ParamsError`` when the served config of ``metric`` is less private than this
    device allows: the server cannot switch the local randomization off."""
    figures: list[tuple[str, float, str, float]] = []
    if mc.rappor is not None:
        from crowdmix.client.privacy import epsilon_inf, epsilon_one

        figures.append(("ε_1", epsilon_one(mc.rappor), "max_epsilon", max_epsilon))
        figures.append(("ε_∞", epsilon_inf(mc.rappor), "max_epsilon_inf", max_epsilon_inf))
    elif mc.basic is not None:
        figures.append(("ε", mc.basic.epsilon, "max_epsilon", max_epsilon))
    elif mc.histogram is not None:
        eps = mc.histogram.local_epsilon
        if eps is not None:
            figures.append(("ε_L", eps, "max_epsilon", max_epsilon))
        elif not allow_unrandomized_histograms:
            # the real value leaves the device, hidden only by the seal (a histogram is
            # sealed or not sent at all) and the shuffle
            raise ParamsError(
                f"metric {metric!r}: the served histogram sends the value without local "
                "randomization (ε_L = inf); this device allows that only with "
                "allow_unrandomized_histograms=True; no report made"
            )
    for name, value, knob, ceiling in figures:
        if not value <= ceiling:  # inf and nan too
            raise ParamsError(
                f"metric {metric!r}: the served params give {name} = {value:.6g}, above this "
                f"device's ceiling {knob} = {ceiling:g}; no report made"
            )


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


def _check_value(encoder: RapporEncoder | BasicEncoder | HistogramEncoder, value: object) -> None:
    from crowdmix.client.basic import BasicEncoder
    from crowdmix.client.histogram import HistogramEncoder

    if isinstance(encoder, BasicEncoder | HistogramEncoder):
        if isinstance(value, bool) or not isinstance(value, str | int):
            raise ValueError(
                f"metric {encoder.metric!r}: a value is a str or an int, got {value!r}"
            )
        encoder.index_of(value)  # ValueError outside the domain
    elif not isinstance(value, str | bytes):
        raise ValueError(f"metric {encoder.metric!r}: a value is a str or bytes, got {value!r}")


class _Offline(Exception):
    """Nothing more can be sent now: back off and try later."""


class Reporter:
    """Claims, encodes, stores and delivers an app's reports (see the module docstring).

    ``app_dir`` holds the outbox and the device secret (created 0700). ``target`` and
    ``token`` name the shuffler; ``tls`` (default) uses the system roots unless
    ``root_certificates`` are given. ``max_reports`` and ``max_bytes`` bound the
    outbox: a report that would pass either is refused (``report`` returns False).
    ``max_epsilon``, ``max_epsilon_inf`` and ``allow_unrandomized_histograms`` set
    the privacy ceiling (see the module docstring; ``math.inf``: none).
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
        max_reports: int = 1000,
        max_bytes: int = 1 << 20,
        timeout: float = 10.0,
        backoff_base: float = 1.0,
        backoff_cap: float = 300.0,
        background: bool = True,
        clock: Callable[[], float] = time.time,
        jitter: random.Random | None = None,
        max_epsilon: float = MAX_EPSILON,
        max_epsilon_inf: float = MAX_EPSILON_INF,
        allow_unrandomized_histograms: bool = False,
    ) -> None:
        if sealing not in ("required", "off"):
            raise ValueError(f"sealing must be 'required' or 'off', got {sealing!r}")
        for knob, v in (("max_epsilon", max_epsilon), ("max_epsilon_inf", max_epsilon_inf)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not v > 0:
                raise ValueError(f"{knob} must be a positive number (inf: no ceiling), got {v!r}")
        _check_extra(sealing)
        self.app_dir = Path(app_dir)
        try:
            self.app_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._secret = _device_secret(self.app_dir / "secret")
        except OSError as exc:
            raise CrowdmixClientError(
                f"cannot use the app directory {self.app_dir}: {exc.strerror or exc}"
            ) from None
        self._outbox = Outbox(
            self.app_dir / "outbox.sqlite3",
            max_reports=max_reports,
            max_bytes=max_bytes,
            clock=clock,
        )
        self.target = target
        self._token = token
        self._tls = tls
        self._roots = root_certificates
        self.sealing: Sealing = sealing
        self._timeout = timeout
        self._backoff = (backoff_base, backoff_cap)
        self._clock = clock
        # timing jitter only (no privacy depends on it); injectable for tests
        self._jitter = jitter if jitter is not None else random.Random()
        self._config: DeviceConfig | None = None
        self._config_fetched = 0.0
        self._encoders: dict[tuple[str, int], RapporEncoder | BasicEncoder | HistogramEncoder] = {}
        self._link: Link | None = None
        self._reset_link = False
        self._send_lock = threading.Lock()
        self._link_lock = threading.Lock()
        self._cond = threading.Condition()
        self._wake = False
        self._closed = False
        self._failures = 0
        self.last_error: str | None = None
        # the server's clock as of the last GetConfig in this process (crowdmix.client.skew)
        self._estimate: ClockEstimate | None = None
        self._hold: float | None = None  # seconds until a held report may go
        self._ceiling = (float(max_epsilon), float(max_epsilon_inf), allow_unrandomized_histograms)
        self._within_ceiling: set[tuple[str, int]] = set()
        self._background = background
        self._thread: threading.Thread | None = None
        if background and len(self._outbox):
            self._start_sender()  # reports from an earlier run

    # -- config ---------------------------------------------------------------

    def _load_cached(self) -> DeviceConfig | None:
        cached = self._outbox.cached_config()
        if cached is None:
            return None
        from crowdmix.client.device_config import from_proto
        from crowdmix.protos import crowdmix_pb2 as pb

        try:
            config = from_proto(pb.ConfigResponse.FromString(cached[0]))
        except Exception as exc:  # a damaged cache is refetched, never trusted
            log.warning("ignoring the cached config: %s", exc)
            return None
        self._config, self._config_fetched = config, cached[1]
        return config

    def _fetch_config(self, timeout: float | None = None) -> DeviceConfig:
        """Fetch, check and cache the shuffler's config; ``_Offline`` when it cannot."""
        from crowdmix.client.device_config import DEFAULT_WINDOW_SECONDS, from_proto
        from crowdmix.client.link import LinkError
        from crowdmix.protos import crowdmix_pb2 as pb

        link = self._get_link()
        try:
            mono_send, t_send = time.monotonic(), self._clock()
            raw = link.get_config(timeout)
            t_recv, mono_recv = self._clock(), time.monotonic()
            served = pb.ConfigResponse.FromString(raw)
            config = from_proto(served)
        except LinkError as exc:
            raise _Offline(f"GetConfig: {exc}") from None
        except CrowdmixClientError as exc:  # an answer this SDK cannot use
            raise _Offline(f"GetConfig: bad answer: {exc}") from None
        if not plausible_server_time(served.server_time):  # a broken server clock
            raise _Offline(
                f"GetConfig: bad answer: server_time {served.server_time!r} is not a "
                f"plausible time (Unix seconds {SERVER_TIME_RANGE[0]:.0f} to "
                f"{SERVER_TIME_RANGE[1]:.0f}, or 0 for none)"
            )
        now = self._clock()
        cached = self._outbox.cached_config()
        previous = None
        if cached is not None:  # an outbox from before the window length was recorded
            try:
                answer = pb.ConfigResponse.FromString(cached[0])
                previous = answer.window_seconds or DEFAULT_WINDOW_SECONDS
            except Exception:  # a damaged cache tells nothing
                previous = None
        self._outbox.store_config(
            raw, now, window_seconds=config.window_seconds, previous_window_seconds=previous
        )
        self._config, self._config_fetched = config, now
        self._estimate = ClockEstimate.of(served.server_time, t_send, t_recv, mono_send, mono_recv)
        self._encoders.clear()
        return config

    def config(self) -> DeviceConfig | None:
        """The config in use (cached; None before the shuffler was ever reached)."""
        return self._config if self._config is not None else self._load_cached()

    def _config_expired(self) -> bool:
        c = self._config
        return c is None or self._clock() >= self._config_fetched + c.cache_seconds

    # -- making reports -------------------------------------------------------

    def _encoder(
        self, metric: str, config: DeviceConfig
    ) -> RapporEncoder | BasicEncoder | HistogramEncoder:
        mc = config.metrics.get(metric)
        if mc is None:
            raise ParamsError(f"metric {metric!r} is not in the shuffler's config")
        if mc.histogram is not None and self.sealing != "required":
            raise ParamsError(
                f"metric {metric!r} is a shuffled histogram: its reports must be sealed "
                f"(in the clear the shuffler would see the real value beside its sender), "
                f"and this reporter has sealing='off'"
            )
        enc = self._encoders.get((metric, mc.fingerprint))
        if enc is None:
            if mc.rappor is not None:
                from crowdmix.client.rappor import RapporEncoder

                enc = RapporEncoder(
                    mc.rappor, secret=self._secret, metric=metric, hashing=mc.hashing
                )
            elif mc.histogram is not None:
                from crowdmix.client.histogram import HistogramEncoder

                # the default coins: the shared CSPRNG; report ids from os.urandom
                enc = HistogramEncoder(mc.histogram, metric=metric, domain=mc.domain)
            else:
                from crowdmix.client.basic import BasicEncoder

                assert mc.basic is not None  # MetricConfig holds one of the two
                enc = BasicEncoder(mc.basic, metric=metric, domain=mc.domain)
            self._encoders[(metric, mc.fingerprint)] = enc
        return enc

    def _check_ceiling(self, metric: str, config: DeviceConfig) -> None:
        mc = config.metrics.get(metric)
        if mc is None or (metric, mc.fingerprint) in self._within_ceiling:
            return  # an unknown metric is refused by _encoder
        max_eps, max_inf, unrandomized = self._ceiling
        _check_ceiling(
            metric,
            mc,
            max_epsilon=max_eps,
            max_epsilon_inf=max_inf,
            allow_unrandomized_histograms=unrandomized,
        )
        self._within_ceiling.add((metric, mc.fingerprint))

    def report(self, metric: str, value: str | bytes | int) -> bool:
        """Make this window's report of ``metric``: claim the window, encode ``value``,
        store the report — one transaction — and wake the sender. True when made;
        False when nothing was made: this window's report was made already, an earlier
        one is still waiting to be sent, the outbox is full, or the shuffler was never
        reached (no config yet; call again later). ``ParamsError`` for a metric the
        server does not know, ``ValueError`` for a value its encoding refuses,
        ``OutboxError`` when the outbox cannot be written (a full disk, a damaged
        file): then nothing was claimed. ``ParamsError`` too when the served config
        of ``metric`` exceeds this device's privacy ceiling (nothing claimed).

        It uses the cached config; only when there is none, or it has outlived its
        ``cache_seconds``, does it ask the shuffler first (for up to ``CONFIG_WAIT``
        seconds; offline, the expired cache is used)."""
        self._check_open()
        config = self.config()
        if config is None or self._config_expired():
            # first use, or the cached answer outlived its cache_seconds: ask the server
            # (an outdated config would encode under params it no longer has)
            try:
                config = self._fetch_config(min(self._timeout, CONFIG_WAIT))
            except _Offline as exc:
                self.last_error = str(exc)
                if config is None:
                    log.info("no config yet, no report made: %s", exc)
                    return False
        self._check_ceiling(metric, config)
        encoder = self._encoder(metric, config)
        _check_value(encoder, value)  # a bad value is an error in every window
        self._drop_old(config)
        window = int(self._clock() // config.window_seconds)

        def make() -> Report | list[Report]:
            # a shuffled histogram: the real report and its fakes, claimed as one group
            return encoder.encode(value)  # type: ignore[arg-type]

        outcome = self._outbox.claim(metric, window, make)
        if outcome is Claim.FULL:
            log.warning(
                "outbox full (%d reports or %d bytes): report refused",
                self._outbox.max_reports,
                self._outbox.max_bytes,
            )
        if outcome is not Claim.MADE:
            return False
        if self._background:
            self._start_sender()
            self._poke()
        return True

    def _window(self, config: DeviceConfig) -> int:
        return int(self._clock() // config.window_seconds)

    def _drop_old(self, config: DeviceConfig) -> None:
        """Drop rows that must not be sent any more (see the module docstring)."""
        now = self._clock()
        ws = config.window_seconds
        current = int(now // ws)
        youngest_age = min(config.disposal_seconds.values(), default=0)
        # every row that can have expired was claimed in this window or before
        bound = int((now - youngest_age) // ws) if youngest_age else -1
        expired, unconfirmed = [], []
        for row in self._outbox.older(bound, current):
            age = config.disposal_seconds.get(row.report.metric)
            if age and (row.window + 1) * ws + age <= now:
                expired.append(row.report.report_id)
            elif row.first_attempt_window is not None and row.first_attempt_window != current:
                # tried in another (device) window: a copy may have reached the server
                # in a window the aggregator no longer checks against (see client.outbox)
                unconfirmed.append(row.report.report_id)
        self._outbox.drop(expired, "expired", current)
        self._outbox.drop(unconfirmed, "unconfirmed", current)

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

    def _send_all(self, deadline: float, connect_wait: float) -> float | None:
        """Send every waiting report; ``_Offline`` when the rest must wait. A connection
        is waited for up to ``connect_wait`` seconds (the background sender waits
        briefly and backs off instead, so ``flush`` and ``close`` never wait behind it).
        Returns the device seconds until the first report held for a later server
        window may go (``crowdmix.client.skew``), or None when none is held."""
        from crowdmix.client.link import LinkError, clear_request, sealed_request

        refetched = False
        held: dict[str, float] = {}  # metric -> seconds until its new report may go
        while True:
            if self._closed and threading.current_thread() is self._thread:
                raise _Offline("closing")  # close() does not wait for a long backlog
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise _Offline("out of time")
            if self._config_expired() or self._config is None:
                try:
                    self._fetch_config(min(self._timeout, remaining))
                    refetched = True
                except _Offline:
                    if self.config() is None:
                        raise
            config = self._config
            assert config is not None
            self._drop_old(config)
            first = self._outbox.pending(1, exclude=held)
            if not first:
                return min(held.values(), default=None)
            metric = first[0].report.metric
            # one metric per request, and all of its rows: its one claim's report, or a
            # shuffled histogram's group (real report and fakes), never split across calls
            rows = self._outbox.rows_of(metric)
            mc = config.metrics.get(metric)
            if mc is not None and mc.histogram is not None and self.sealing != "required":
                log.warning(
                    "%d reports of the shuffled histogram %r are never sent in the clear "
                    "(sealing='off'): dropped",
                    len(rows),
                    metric,
                )
                self._outbox.drop([r.report.report_id for r in rows], "refused")
                continue
            stale = [r for r in rows if mc is None or r.report.params_fingerprint != mc.fingerprint]
            if stale:
                if not refetched:  # maybe our config is the outdated one
                    self._fetch_config(min(self._timeout, remaining))
                    refetched = True
                    continue
                self._outbox.drop(
                    [r.report.report_id for r in stale], "params_changed", self._window(config)
                )
                continue
            assert mc is not None  # no stale row: the metric is served
            try:  # reports made under a looser ceiling (an earlier run) do not leave either
                self._check_ceiling(metric, config)
            except ParamsError as exc:
                log.warning("%d stored reports not sent: %s", len(rows), exc)
                self._outbox.drop(
                    [r.report.report_id for r in rows], "refused", self._window(config)
                )
                continue
            if self.sealing == "required" and not config.sealed:
                raise _Offline(f"shuffler {self.target} publishes no aggregator key")
            if not self._get_link().ready(min(connect_wait, remaining)):
                raise _Offline(f"shuffler {self.target} cannot be reached")
            estimate = self._estimate
            if estimate is None or not estimate.fresh(self._clock(), time.monotonic()):
                # none made in this process, an hour old, or the wall clock was set: no
                # report leaves before the server's clock is known again (crowdmix.client.skew)
                self._fetch_config(min(self._timeout, remaining))  # _Offline: they wait
                continue
            new = [r.window for r in rows if r.first_attempt_window is None]
            if new:
                marks = self._outbox.marks(metric, min(new))
                wait = hold_seconds(self._clock(), config.window_seconds, estimate, marks)
                if wait > 0:  # an earlier report may be in the server's current window
                    held[metric] = wait
                    continue
            try:
                request = (
                    clear_request(rows)
                    if self.sealing == "off"
                    else sealed_request(rows, config.keys.keys, {metric: mc.report_bytes})  # type: ignore[union-attr]
                )
            except TransportError as exc:  # no key usable now: a fresh config may have one
                if not refetched:
                    self._fetch_config(min(self._timeout, remaining))
                    refetched = True
                    continue
                raise _Offline(str(exc)) from None
            ids = [r.report.report_id for r in rows]
            submit_timeout = min(self._timeout, max(deadline - time.monotonic(), 0.1))
            now = self._clock()
            window = int(now // config.window_seconds)
            # a repeat goes out only if it reaches the server within the window of its
            # first attempt, deadline included (the wait for a connection came after
            # _drop_old's look): every copy of a report then lies less than one window
            # apart, where the aggregator dedupes it whatever the clocks' offset
            late = [
                r.report.report_id
                for r in rows
                if r.first_attempt_window is not None
                and not (
                    r.first_attempt_window
                    == window
                    == int((now + submit_timeout) // config.window_seconds)
                )
            ]
            if late:
                self._outbox.drop(late, "unconfirmed", window)
                continue
            end, mono_end = now + submit_timeout, time.monotonic() + submit_timeout
            if not self._outbox.begin_send(
                ids,
                window,
                deadline=end,
                server_window=None
                if estimate.high is None
                else last_arrival_window(end, estimate.high, config.window_seconds),
                window_seconds=config.window_seconds,
            ):
                # another process on the app dir delivered or dropped them, or another
                # fetch brought a new window length: the config in use is the cached one
                self._load_cached()
                continue
            # the request must end by the deadline its mark records: begin_send may have
            # waited (another process's write lock, a slow fsync), so what is left of it
            # is the request's timeout; nothing left, nothing sent (the attempt's mark
            # covers a copy that never left)
            left = mono_end - time.monotonic()
            if left <= 0:
                raise _Offline("the outbox was busy past the request's deadline")
            try:
                self._submit(request, left)
            except LinkError as exc:
                outdated = exc.code == "FAILED_PRECONDITION" or exc.code == "INVALID_ARGUMENT"
                if outdated and not refetched:
                    self._fetch_config(min(self._timeout, remaining))  # stale key or params
                    refetched = True
                    continue
                if exc.code in _TRY_LATER or exc.code == "FAILED_PRECONDITION":
                    raise _Offline(f"shuffler {self.target}: {exc}") from None
                log.warning(
                    "shuffler %s refused %d reports for good: %s", self.target, len(rows), exc
                )
                self._outbox.drop(ids, "refused", self._window(config))
                continue
            self._outbox.acknowledged(ids, int(self._clock() // config.window_seconds))

    def _submit(self, request: object, timeout: float) -> int:
        """One Submit (a separate method: the crash tests stop the process around it)."""
        return self._get_link().submit(request, timeout)  # type: ignore[arg-type]

    def _try_send(self, timeout: float, connect_wait: float) -> bool:
        """Send what waits; True when nothing failed: the outbox is empty, or holds only
        reports held for a later server window (``self._hold`` seconds)."""
        if not self._send_lock.acquire(timeout=max(timeout, 0.0)):
            return False  # the other sender holds it (at most one request's timeout)
        try:
            if not len(self._outbox):
                self._hold = None
                return True
            try:
                self._hold = self._send_all(time.monotonic() + timeout, connect_wait)
            except _Offline as exc:
                self.last_error = str(exc)
                log.info("%d reports wait: %s", len(self._outbox), exc)
                return False
            self.last_error = None
            if self._hold is not None:
                log.info("reports held for %.0f s: the server's window is not over", self._hold)
            return True
        finally:
            self._send_lock.release()

    def flush(self, timeout: float = 5.0) -> int:
        """Send what waits, for up to ``timeout`` seconds, in this thread; the number of
        reports still queued (0: all acknowledged; a report held for the server's next
        window is queued). Never raises for the network: what is left is sent by the
        sender or at the next start."""
        self._check_open()
        self._try_send(timeout, connect_wait=timeout)
        return len(self._outbox)

    @property
    def queued(self) -> int:
        """Reports claimed and not yet acknowledged."""
        return len(self._outbox)

    @property
    def failed_attempts(self) -> int:
        """The background sender's failed attempts in a row (0 after a success or
        ``network_available``): its backoff grows with this."""
        return self._failures

    def counters(self) -> dict[str, int]:
        """Reports delivered, and those that left without delivery, by reason."""
        return self._outbox.counters()

    def network_available(self) -> None:
        """The platform says the network is back: reconnect and send now, backoff reset."""
        with self._cond:
            self._failures = 0
            self._reset_link = True
        if self._background and len(self._outbox):
            self._start_sender()
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
            try:
                done = self._try_send(self._timeout * 3, connect_wait=BACKGROUND_CONNECT_WAIT)
            except CrowdmixClientError as exc:  # the outbox cannot be written: keep trying
                log.warning("the sender could not use the outbox: %s", exc)
                self.last_error, done = str(exc), False
            except Exception as exc:  # a dead sender would end sending silently
                log.warning(
                    "the sender failed (%s: %s); it tries again later", type(exc).__name__, exc
                )
                self.last_error, done = f"{type(exc).__name__}: {exc}", False
            if done:
                self._failures = 0
                hold = self._hold
                # idle until a report is made or the network returns, or a held one may go
                delay = None if hold is None else min(hold + 1.0, HOLD_RECHECK)
            else:
                self._failures += 1
                delay = backoff_delay(self._failures, *self._backoff, self._jitter)

    # -- lifecycle ------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise CrowdmixClientError("the reporter is closed")

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
