"""The metric registry: one TOML file shared by shuffler and aggregator.

docs/operating.md ("The metric registry") holds a commented example of every kind of
metric and a reference of every field; tests parse that example. Nothing that sets a
privacy figure is filled in: ``encoding``, RAPPOR's ``k``, ``h``, ``m``, ``f``, ``p``,
``q``, a basic mechanism's or histogram's ``domain`` (or ``domain_size``; binary RR's is
2) and every field of a heavy-hitters metric are required. A bad or missing entry raises
``RegistryError`` naming the metric and the field.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from crowdmix.core.basic import MECHANISMS, BasicParams, index_bytes
from crowdmix.core.discovery import ENCODING as HEAVY_HITTERS
from crowdmix.core.discovery import HeavyHittersParams
from crowdmix.core.errors import ParamsError
from crowdmix.core.histogram import ENCODING as HISTOGRAM
from crowdmix.core.histogram import HistogramParams
from crowdmix.core.params import HASHINGS, Hashing, RapporParams
from crowdmix.core.redis_url import redis_url_problem

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_REPORTS",
    "MetricConfig",
    "Registry",
    "RegistryError",
    "ShufflePolicy",
    "check_daemon_settings",
    "check_integer",
    "check_strings",
    "load_daemon_config",
    "load_registry",
    "read_registry_file",
    "window_batch_limit",
]

# Top-level tables that hold daemon settings, not metrics: [shuffler] is read by
# shuffler.config, [aggregator] is reserved for the aggregator's settings.
DAEMON_TABLES = ("shuffler", "aggregator")

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
#: The shortest collection window: finer windows would identify reports by time.
MIN_WINDOW_SECONDS = 3600

#: The most reports the aggregator counts in one batch (in one piece, in memory).
MAX_BATCH_REPORTS = 10_000_000
#: The largest Ingest message the aggregator accepts by default (its gRPC receive limit).
MAX_BATCH_BYTES = 256 << 20
#: Wire bytes a sealed report costs in an Ingest message beyond its sealed value: its
#: key id (a varint, at most 5 bytes) and a margin for the message's framing.
_SEALED_ROW_OVERHEAD = 8
#: How a metric's reports are released: by ``max_batch``/``max_delay_seconds``, or the
#: whole collection window in one batch after it ends (shuffled histograms).
RELEASES = ("max_batch", "window")


def window_batch_limit(report_bytes: int) -> int:
    """The most sealed reports of ``report_bytes`` bytes one aggregator batch carries:
    ``MAX_BATCH_REPORTS``, or fewer when their sealed values would pass
    ``MAX_BATCH_BYTES`` (the ceiling of a window released in one batch)."""
    from crowdmix.core.sealed import sealed_length

    per_report = sealed_length(report_bytes) + _SEALED_ROW_OVERHEAD
    return min(MAX_BATCH_REPORTS, MAX_BATCH_BYTES // per_report)


class RegistryError(ParamsError):
    """The registry file is missing, malformed, or names an invalid value."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShufflePolicy:
    """When and how the shuffler releases a metric's reports."""

    min_batch: int = 1000
    max_batch: int = 100_000
    max_delay_seconds: float = 60.0
    drop_probability: float = 0.0
    disposal_days: float = 30.0
    #: "max_batch": release batches of up to ``max_batch`` (after ``max_delay_seconds``);
    #: "window": release each collection window once, whole, ``release_grace_seconds``
    #: after it ends (shuffled histograms only; their default in a registry file)
    release: str = "max_batch"
    release_grace_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.release not in RELEASES:
            raise ParamsError(f"release must be one of {RELEASES}, got {self.release!r}")
        g = self.release_grace_seconds
        if isinstance(g, bool) or not isinstance(g, int | float) or not 0.0 <= g < math.inf:
            raise ParamsError(f"release_grace_seconds must be a number >= 0, got {g!r}")
        for name in ("min_batch", "max_batch"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ParamsError(f"{name} must be a positive integer, got {v!r}")
        if self.max_batch < self.min_batch:
            raise ParamsError(
                f"max_batch ({self.max_batch}) must be at least min_batch ({self.min_batch})"
            )
        for name in ("max_delay_seconds", "disposal_days"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not (0 < v < math.inf):
                raise ParamsError(f"{name} must be a positive number, got {v!r}")
        d = self.drop_probability
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0.0 <= d < 1.0:
            raise ParamsError(f"drop_probability must be in [0, 1), got {d!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricConfig:
    """One metric: its encoding (RAPPOR, a basic mechanism or a shuffled histogram)
    and its shuffle policy.

    ``honest_fraction`` matters to shuffled histograms only: the share of a window's
    devices the privacy statement assumes honest (the rest may all sit in one batch:
    ``crowdmix.aggregator.accounting.histogram_crowd``).
    """

    name: str
    rappor: RapporParams | None = None
    hashing: Hashing = "mmh3"
    basic: BasicParams | None = None
    histogram: HistogramParams | None = None
    heavy_hitters: HeavyHittersParams | None = None
    domain: tuple[str, ...] | None = None
    shuffle: ShufflePolicy = field(default_factory=ShufflePolicy)
    honest_fraction: float = 1.0
    # computed once: the shuffler compares it on every request (a BLAKE2b of the params)
    _fingerprint: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        set_ = [
            x
            for x in (self.rappor, self.basic, self.histogram, self.heavy_hitters)
            if x is not None
        ]
        if len(set_) != 1:
            raise ParamsError(
                f"metric {self.name!r}: exactly one of rappor/basic/histogram/heavy_hitters "
                "must be set"
            )
        h = self.honest_fraction
        if isinstance(h, bool) or not isinstance(h, int | float) or not 0.0 < h <= 1.0:
            raise ParamsError(f"metric {self.name!r}: honest_fraction must be in (0, 1], got {h!r}")
        object.__setattr__(self, "honest_fraction", float(h))
        if self.shuffle.release == "window" and self.histogram is None and not self.windowed:
            raise ParamsError(
                f"metric {self.name!r}: release = 'window' is for shuffled histograms and "
                "heavy hitters only"
            )
        if self.rappor is not None:
            self.rappor.check_hashing(self.hashing)
            fp = self.rappor.fingerprint(self.hashing)
        elif self.basic is not None:
            fp = self.basic.fingerprint()
        elif self.heavy_hitters is not None:
            fp = self.heavy_hitters.fingerprint()
        else:
            assert self.histogram is not None
            fp = self.histogram.fingerprint()
        object.__setattr__(self, "_fingerprint", fp)

    @property
    def encoding(self) -> str:
        if self.rappor is not None:
            return "rappor"
        if self.basic is not None:
            return self.basic.mechanism
        if self.heavy_hitters is not None:
            return HEAVY_HITTERS
        return HISTOGRAM

    @property
    def windowed(self) -> bool:
        """A heavy-hitters metric: its params change with the window (one round each)."""
        return self.heavy_hitters is not None

    @property
    def requires_sealing(self) -> bool:
        """A shuffled histogram's real and fake reports are told apart only if sealed:
        in the clear the shuffler would see each device's true value beside its sender."""
        return self.histogram is not None

    @property
    def domain_size(self) -> int | None:
        """The known domain's size (basic mechanisms, histograms); None for RAPPOR and
        heavy hitters (each round has its own: ``core.rounds``)."""
        if self.basic is not None:
            return self.basic.domain_size
        if self.histogram is not None:
            return self.histogram.domain_size
        return None

    @property
    def report_bytes(self) -> int:
        if self.rappor is not None:
            return self.rappor.report_bytes
        if self.basic is not None:
            return self.basic.report_bytes
        if self.heavy_hitters is not None:
            return self.heavy_hitters.report_bytes
        assert self.histogram is not None
        return self.histogram.report_bytes

    @property
    def payload_bits(self) -> int:
        """Meaningful bits per report; the rest of the last byte must be zero (the
        shuffler checks clear reports by it, the aggregator opened ones)."""
        if self.rappor is not None:
            return self.rappor.k
        if self.basic is not None and self.basic.mechanism == "oue":
            return self.basic.domain_size
        if self.basic is not None and self.basic.mechanism == "binary-rr":
            return 1
        return 8 * self.report_bytes

    @property
    def num_cohorts(self) -> int:
        return self.rappor.m if self.rappor is not None else 1

    @property
    def fingerprint(self) -> int:
        return self._fingerprint


@dataclass(frozen=True, slots=True)
class Registry:
    metrics: dict[str, MetricConfig]
    window_seconds: int = 86400

    def __getitem__(self, name: str) -> MetricConfig:
        return self.metrics[name]

    def get(self, name: str) -> MetricConfig | None:
        return self.metrics.get(name)

    def window_of(self, unix_seconds: float) -> int:
        """The collection window of a time: coarse by design (a day by default)."""
        return int(unix_seconds // self.window_seconds)


_RAPPOR_PARAMS = ("k", "h", "m", "f", "p", "q")
_RAPPOR_KEYS = {"encoding", "hashing", *_RAPPOR_PARAMS, "shuffle"}
_BASIC_KEYS = {"encoding", "epsilon", "domain", "domain_size", "shuffle"}
_HEAVY_PARAMS = tuple(HeavyHittersParams.__dataclass_fields__)
_HEAVY_KEYS = {"encoding", *_HEAVY_PARAMS, "shuffle"}
_HISTOGRAM_KEYS = {
    "encoding",
    "domain",
    "domain_size",
    "fake_slots",
    "fake_probability",
    "local_epsilon",
    "honest_fraction",
    "shuffle",
}


def _domain_of(
    where: str, table: dict[str, Any], encoding: str
) -> tuple[tuple[str, ...] | None, Any]:
    """The metric's domain values (if named) and size. Nothing is filled in: a domain
    of other than binary randomized response's two values must be named (``domain``) or
    counted (``domain_size``), since its size sets the mechanism's noise."""
    domain = table.get("domain")
    if domain is not None:
        if not isinstance(domain, list) or not all(isinstance(v, str) for v in domain):
            raise RegistryError(f"{where}: domain must be a list of strings")
        if len(set(domain)) != len(domain):
            raise RegistryError(f"{where}: domain values must be distinct")
        if "domain_size" in table and table["domain_size"] != len(domain):
            raise RegistryError(
                f"{where}: domain_size {table['domain_size']!r} disagrees with the "
                f"{len(domain)} values of domain"
            )
        return tuple(domain), len(domain)
    if "domain_size" not in table:
        if encoding == "binary-rr":
            return None, 2
        raise RegistryError(f"{where}: domain (or domain_size) is required for {encoding}")
    return None, table["domain_size"]


_SHUFFLE_KEYS = set(ShufflePolicy.__dataclass_fields__)


def _histogram_shuffle(
    where: str, table: dict[str, Any], shuffle_t: dict[str, Any]
) -> dict[str, Any]:
    """A histogram's (or heavy-hitters metric's) shuffle table with its defaults:
    released per window, and ``max_batch`` (the reports a window may hold) at most, and
    by default, what one aggregator batch carries — a window is never split by
    ``max_batch``."""
    out = dict(shuffle_t)
    release = out.setdefault("release", "window")
    if release != "window":
        if "release_grace_seconds" in out:
            raise RegistryError(f"{where}: release_grace_seconds is for release = 'window'")
        return out
    if table.get("encoding") == HEAVY_HITTERS:
        from crowdmix.core.discovery import REPORT_BYTES

        limit = window_batch_limit(REPORT_BYTES)
    else:
        size = table.get("domain_size", 2)
        domain = table.get("domain")
        if isinstance(domain, list):
            size = len(domain)
        if isinstance(size, bool) or not isinstance(size, int) or size < 2:
            return out  # HistogramParams names the error
        limit = window_batch_limit(index_bytes(size))
    max_batch = out.setdefault("max_batch", max(limit, out.get("min_batch", 1)))
    if isinstance(max_batch, int) and not isinstance(max_batch, bool) and max_batch > limit:
        raise RegistryError(
            f"{where}: max_batch {max_batch} (the reports a window may hold) exceeds "
            f"what one aggregator batch carries ({limit} sealed reports of this metric: "
            f"{MAX_BATCH_REPORTS} reports or {MAX_BATCH_BYTES >> 20} MiB); a window is "
            f"released in one batch, so use a shorter collection window or "
            f'release = "max_batch"'
        )
    return out


def _metric_from_table(name: str, table: dict[str, Any]) -> MetricConfig:
    where = f"metric {name!r}"
    if not isinstance(table, dict):
        raise RegistryError(f"{where}: must be a table")
    if "encoding" not in table:
        raise RegistryError(
            f'{where}: encoding is required ("rappor", {HISTOGRAM!r}, {HEAVY_HITTERS!r} or '
            f"one of {', '.join(MECHANISMS)})"
        )
    encoding = table["encoding"]
    try:
        shuffle_t = table.get("shuffle", {})
        if not isinstance(shuffle_t, dict):
            raise RegistryError(f"{where}: shuffle must be a table")
        unknown = set(shuffle_t) - _SHUFFLE_KEYS
        if unknown:
            raise RegistryError(f"{where}: unknown shuffle field(s) {sorted(unknown)}")
        if encoding in (HISTOGRAM, HEAVY_HITTERS):
            shuffle_t = _histogram_shuffle(where, table, shuffle_t)
        elif "release_grace_seconds" in shuffle_t:
            raise RegistryError(
                f"{where}: release_grace_seconds is for release = 'window' (shuffled histograms)"
            )
        shuffle = ShufflePolicy(**shuffle_t)
        if encoding == "rappor":
            unknown = set(table) - _RAPPOR_KEYS
            if unknown:
                raise RegistryError(f"{where}: unknown field(s) {sorted(unknown)}")
            hashing = table.get("hashing", "mmh3")
            if hashing not in HASHINGS:
                raise RegistryError(f"{where}: hashing must be one of {HASHINGS}, got {hashing!r}")
            missing = [key for key in _RAPPOR_PARAMS if key not in table]
            if missing:  # RapporParams' defaults are google/rappor's demo values: never used
                raise RegistryError(
                    f"{where}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                    f"required for rappor (every privacy parameter is stated, none defaulted)"
                )
            kwargs = {key: table[key] for key in _RAPPOR_PARAMS}
            return MetricConfig(
                name=name, rappor=RapporParams(**kwargs), hashing=hashing, shuffle=shuffle
            )
        if encoding in MECHANISMS:
            unknown = set(table) - _BASIC_KEYS
            if unknown:
                raise RegistryError(f"{where}: unknown field(s) {sorted(unknown)}")
            if "epsilon" not in table:
                raise RegistryError(f"{where}: epsilon is required for {encoding}")
            domain, size = _domain_of(where, table, encoding)
            basic = BasicParams(mechanism=encoding, epsilon=table["epsilon"], domain_size=size)
            return MetricConfig(name=name, basic=basic, domain=domain, shuffle=shuffle)
        if encoding == HISTOGRAM:
            unknown = set(table) - _HISTOGRAM_KEYS
            if unknown:
                raise RegistryError(f"{where}: unknown field(s) {sorted(unknown)}")
            for key in ("fake_slots", "fake_probability"):
                if key not in table:
                    raise RegistryError(f"{where}: {key} is required for {HISTOGRAM}")
            if "domain" not in table and "domain_size" not in table:
                raise RegistryError(f"{where}: domain or domain_size is required for {HISTOGRAM}")
            domain, size = _domain_of(where, table, encoding)
            histogram = HistogramParams(
                domain_size=size,
                fake_slots=table["fake_slots"],
                fake_probability=table["fake_probability"],
                local_epsilon=table.get("local_epsilon"),
            )
            return MetricConfig(
                name=name,
                histogram=histogram,
                domain=domain,
                shuffle=shuffle,
                honest_fraction=table.get("honest_fraction", 1.0),
            )
        if encoding == HEAVY_HITTERS:
            unknown = set(table) - _HEAVY_KEYS
            if unknown:
                raise RegistryError(f"{where}: unknown field(s) {sorted(unknown)}")
            missing = [key for key in _HEAVY_PARAMS if key not in table]
            if missing:
                raise RegistryError(
                    f"{where}: {', '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                    f"required for {HEAVY_HITTERS} (the plan and the privacy target are "
                    "stated, none defaulted)"
                )
            if shuffle.release != "window":
                raise RegistryError(
                    f"{where}: a heavy-hitters round is one shuffle of its window: its "
                    "shuffle release must be 'window'"
                )
            heavy = HeavyHittersParams(**{key: table[key] for key in _HEAVY_PARAMS})
            smallest = max(1, int(heavy.devices * min(heavy.weights)))
            if shuffle.min_batch > smallest:  # every round's ε0 is planned over min_batch
                raise RegistryError(
                    f"{where}: shuffle.min_batch ({shuffle.min_batch}) exceeds the smallest "
                    f"expected round group (devices x min weights = {smallest}): its rounds "
                    "would never be released"
                )
            return MetricConfig(name=name, heavy_hitters=heavy, shuffle=shuffle)
        raise RegistryError(
            f"{where}: encoding must be 'rappor', {HISTOGRAM!r}, {HEAVY_HITTERS!r} or one of "
            f"{', '.join(MECHANISMS)}, got {encoding!r}"
        )
    except RegistryError:
        raise
    except (ParamsError, TypeError) as exc:
        raise RegistryError(f"{where}: {exc}") from None


def parse_registry(data: dict[str, Any]) -> Registry:
    # Daemon settings may share the file; each daemon validates its own table.
    unknown = set(data) - {"metrics", "collection", *DAEMON_TABLES}
    if unknown:
        raise RegistryError(f"unknown top-level table(s) {sorted(unknown)}")
    metrics_t = data.get("metrics")
    if not isinstance(metrics_t, dict) or not metrics_t:
        raise RegistryError("the registry defines no [metrics.NAME] table")
    metrics = {}
    for name, table in metrics_t.items():
        if not _NAME.match(name):
            raise RegistryError(f"metric name {name!r} must match {_NAME.pattern}")
        metrics[name] = _metric_from_table(name, table)
    collection = data.get("collection", {})
    if not isinstance(collection, dict):
        raise RegistryError("collection must be a table")
    unknown = set(collection) - {"window_seconds"}
    if unknown:
        raise RegistryError(f"unknown collection field(s) {sorted(unknown)}")
    window = collection.get("window_seconds", 86400)
    if isinstance(window, bool) or not isinstance(window, int) or window < MIN_WINDOW_SECONDS:
        raise RegistryError(
            f"collection.window_seconds must be an integer of at least {MIN_WINDOW_SECONDS} "
            f"(finer windows would identify reports by time), got {window!r}"
        )
    for metric in metrics.values():
        policy = metric.shuffle
        if policy.release != "window":
            continue
        grace = policy.release_grace_seconds
        if grace >= window:
            raise RegistryError(
                f"metric {metric.name!r}: release_grace_seconds ({grace}) must be shorter "
                f"than the collection window ({window} s)"
            )
        if grace >= policy.disposal_days * 86400:
            raise RegistryError(
                f"metric {metric.name!r}: release_grace_seconds ({grace}) must be shorter "
                f"than the disposal age ({policy.disposal_days} days): else a window is "
                f"disposed of before it is released"
            )
    return Registry(metrics=metrics, window_seconds=window)


def read_registry_file(path: str | Path) -> dict[str, Any]:
    """The TOML tables of a registry file, not yet validated (the daemons take their
    own tables out first); ``RegistryError`` names the file when it cannot be read."""
    path = Path(path)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise RegistryError(f"metric registry {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"metric registry {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise RegistryError(f"metric registry {path} is not UTF-8 text (TOML)") from None
    except OSError as exc:
        raise RegistryError(f"cannot read metric registry {path}: {exc.strerror or exc}") from None


def load_daemon_config(
    path: str | Path,
    table: str,
    fields: Iterable[str],
    overrides: dict[str, Any] | None,
    error: type[Exception],
) -> tuple[Registry, dict[str, Any], bool]:
    """A daemon's registry file: the registry, its ``[table]`` of settings with
    ``overrides`` (flags; None: not given) over them, and whether the file has the table.
    The other daemon's table is left to it. A bad table raises ``error`` naming the
    file; a bad registry ``RegistryError`` naming the file and the field."""
    data = read_registry_file(path)
    for other in DAEMON_TABLES:
        if other != table:
            data.pop(other, None)
    own = data.pop(table, {})
    if not isinstance(own, dict):
        raise error(f"{path}: [{table}] must be a table")
    known = set(fields)
    unknown = sorted(set(own) - known)
    if unknown:
        raise error(
            f"{path}: [{table}]: unknown field(s) {unknown} (known: {', '.join(sorted(known))})"
        )
    try:
        registry = parse_registry(data)
    except RegistryError as exc:
        raise RegistryError(f"{path}: {exc}") from None
    values = own | {k: v for k, v in (overrides or {}).items() if v is not None}
    unknown = sorted(set(values) - known)
    if unknown:  # a caller's mistake, not the user's
        raise ValueError(f"unknown {table} setting(s) {unknown}")
    return registry, values, bool(own)


def check_integer(
    name: str, v: object, error: type[Exception], *, low: int, high: int | None = None
) -> None:
    """Raise ``error`` naming ``name`` unless ``v`` is an int (not a bool) in [low, high]."""
    if isinstance(v, bool) or not isinstance(v, int) or v < low or (high is not None and v > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise error(f"{name} must be an integer {bound}, got {v!r}")


def check_strings(
    settings: Any,
    fields: Iterable[str],
    error: type[Exception],
    name: Callable[[str], str] = str,
) -> None:
    """Raise ``error`` naming the first of ``fields`` that is neither None nor a string
    (a TOML table can hold a number or a boolean where a path or an address belongs)."""
    for f in fields:
        v = getattr(settings, f)
        if v is not None and not isinstance(v, str):
            raise error(f"{name(f)} must be a string, got {v!r}")


def check_daemon_settings(
    settings: Any, error: type[Exception], name: Callable[[str], str] = str
) -> None:
    """The checks of the settings both daemons have (``listen``, ``redis``,
    ``min_replicas_ack``, ``tls_cert``, ``tls_key``, ``tls_client_ca``): ``error`` names
    the field as ``name(field)`` says."""
    check_strings(
        settings, ("listen", "redis", "tls_cert", "tls_key", "tls_client_ca"), error, name
    )
    host, sep, port = settings.listen.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise error(f"{name('listen')} must be HOST:PORT, got {settings.listen!r}")
    # "" is no URL either: not "no Redis" (None), which would then fail at the connection
    problem = settings.redis is not None and redis_url_problem(name("redis"), settings.redis)
    if problem:
        raise error(problem)
    check_integer(name("min_replicas_ack"), settings.min_replicas_ack, error, low=0)
    if settings.min_replicas_ack and settings.redis is None:
        raise error(f"{name('min_replicas_ack')} needs redis (a Redis with replicas)")
    if (settings.tls_cert is None) != (settings.tls_key is None):
        raise error(f"{name('tls_cert')} and {name('tls_key')} go together")
    if settings.tls_client_ca is not None and settings.tls_cert is None:
        raise error(f"{name('tls_client_ca')} needs tls_cert and tls_key")


def load_registry(path: str | Path) -> Registry:
    """Read and validate a registry file; ``RegistryError`` names what is wrong."""
    data = read_registry_file(path)
    try:
        return parse_registry(data)
    except RegistryError as exc:
        raise RegistryError(f"{path}: {exc}") from None
