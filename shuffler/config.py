"""Daemon settings and the metric registry they point at.

The registry (metrics, encodings, shuffle policies) is ``crowdmix.core.registry``'s
TOML, shared with the aggregator. The daemon's own settings come from, in increasing
precedence: the defaults of ``ShufflerSettings``, an optional ``[shuffler]`` table in the
same file (removed before the registry is parsed, as is an ``[aggregator]`` table), and
command-line flags. Every setting (``listen``, ``redis``, ``aggregator``,
``tokens_file``, TLS, limits, ``public_keys``, window tolerance and clock skew, ...) has a
row in docs/operating.md, "Shuffler settings". A bad value, or a field not listed
there, raises ``ConfigError`` naming the field.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crowdmix.core.registry import (
    Registry,
    RegistryError,
    check_daemon_settings,
    check_integer,
    check_strings,
    load_daemon_config,
)
from crowdmix.shuffler.errors import ConfigError

#: Deadline of one ``Aggregator.Ingest`` call made by the forwarder.
FORWARD_TIMEOUT_SECONDS = 30.0
#: A batch seen in flight this long is re-offered: twice the forward timeout, so a batch
#: whose first send is still within its deadline is not sent a second time.
INFLIGHT_RETRY_SECONDS = 2 * FORWARD_TIMEOUT_SECONDS

__all__ = ["ShufflerSettings", "load_config", "load_tokens"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShufflerSettings:
    """Everything the daemon needs besides the registry. Paths are not opened here."""

    listen: str = "127.0.0.1:7400"
    redis: str | None = None
    # WAIT for this many replicas before acknowledging a write (0: off; see README,
    # "Redis Cluster"): a master lost after acknowledging then loses nothing acknowledged.
    min_replicas_ack: int = 0
    aggregator: str | None = None
    tokens_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    aggregator_ca: str | None = None
    aggregator_cert: str | None = None
    aggregator_key: str | None = None
    max_request_bytes: int = 4 * 1024 * 1024
    max_reports_per_request: int = 100_000
    rate_limit_reports: float = 0.0
    max_buffered_reports: int = 50_000_000
    # Calls in progress at once (read, validating or waiting for their commit); more
    # are refused RESOURCE_EXHAUSTED by gRPC before their request is read, which bounds
    # the memory that requests in flight can hold (at most this × max_request_bytes).
    max_concurrent_rpcs: int = 4096
    # How long a group commit waits for more requests to join its store write; 1 ms
    # took unary calls from 3.9 k to 6.7 k per second here (BENCHMARKS.md).
    commit_max_delay_ms: float = 1.0
    reuse_port: bool = False  # SO_REUSEPORT: several processes serve one port (--processes)
    # The HTTP port (crowdmix.shuffler.connect): the same Submit and GetConfig in the
    # Connect protocol's unary format, on listen's host; 0 = any free port.
    http_port: int | None = None
    # CORS: the web origins (scheme://host[:port]) whose pages may call the HTTP port; "*" any.
    http_allow_origins: tuple[str, ...] = ()
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    # Serving without tokens (or with the public placeholder token) lets anyone who
    # reaches the port submit reports; the command line refuses it unless this is set.
    allow_unauthenticated: bool = False
    port_file: str | None = None
    # The aggregator's public key config (never a private key): with it the shuffler takes
    # sealed reports only and serves the keys in GetConfig; re-read when the file changes.
    public_keys: str | None = None
    # The round file of heavy-hitter discoveries (crowdmix.core.rounds, written by
    # `crowdmix discover`): GetConfig serves each window's round; re-read when it changes.
    rounds_file: str | None = None
    config_cache_seconds: int = 3600
    # A report names its collection window; it is taken iff
    # cur - window_tolerance <= window <= window_of(now + max_clock_skew_seconds)
    # (crowdmix.shuffler.windows.WindowRule), else refused window_closed / window_ahead.
    window_tolerance: int = 1
    max_clock_skew_seconds: float = 60.0
    tick_seconds: float = 0.05
    shutdown_grace_seconds: float = 10.0
    # A batch the aggregator refused outright is offered again this often (and at start-up).
    parked_retry_seconds: float = 600.0
    # A batch found in flight in the store on two sweeps this far apart (its process lost
    # the reply of the move script, or crashed) is forwarded again while the daemon runs;
    # the aggregator applies a batch id once, so a batch still being sent elsewhere is safe,
    # but costs a second send: so it must exceed the forward timeout (default: twice it).
    forward_timeout_seconds: float = FORWARD_TIMEOUT_SECONDS
    inflight_retry_seconds: float = INFLIGHT_RETRY_SECONDS

    def __post_init__(self) -> None:
        check_daemon_settings(self, ConfigError)
        check_strings(
            self,
            (
                "aggregator", "tokens_file", "aggregator_ca", "aggregator_cert",
                "aggregator_key", "metrics_host", "port_file", "public_keys", "rounds_file",
            ),
            ConfigError,
        )  # fmt: skip
        for name in ("reuse_port", "allow_unauthenticated"):
            if not isinstance(getattr(self, name), bool):  # "false" would be true
                raise ConfigError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.aggregator is not None:
            h, s, p = self.aggregator.rpartition(":")
            if not s or not h or not p.isdigit():
                raise ConfigError(f"aggregator must be HOST:PORT, got {self.aggregator!r}")
        if (self.aggregator_cert is None) != (self.aggregator_key is None):
            raise ConfigError("aggregator_cert and aggregator_key must be given together")
        if self.aggregator_cert is not None and self.aggregator_ca is None:
            raise ConfigError("aggregator_cert needs aggregator_ca (mTLS to the aggregator)")
        for name in (
            "max_request_bytes",
            "max_reports_per_request",
            "max_buffered_reports",
            "max_concurrent_rpcs",
        ):
            check_integer(name, getattr(self, name), ConfigError, low=1)
        check_integer("config_cache_seconds", self.config_cache_seconds, ConfigError, low=1)
        check_integer("window_tolerance", self.window_tolerance, ConfigError, low=0)
        for name in ("rate_limit_reports", "commit_max_delay_ms", "max_clock_skew_seconds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < math.inf:
                raise ConfigError(f"{name} must be a non-negative number, got {v!r}")
        for name in (
            "tick_seconds",
            "shutdown_grace_seconds",
            "parked_retry_seconds",
            "inflight_retry_seconds",
            "forward_timeout_seconds",
        ):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
                raise ConfigError(f"{name} must be a positive number, got {v!r}")
        if self.inflight_retry_seconds <= self.forward_timeout_seconds:
            raise ConfigError(
                f"inflight_retry_seconds ({self.inflight_retry_seconds}) must exceed "
                f"forward_timeout_seconds ({self.forward_timeout_seconds}): else a batch "
                "still being forwarded is re-offered and sent twice (default: twice the timeout)"
            )
        for name in ("http_port", "metrics_port"):
            if getattr(self, name) is not None:
                check_integer(name, getattr(self, name), ConfigError, low=0, high=65535)
        origins = self.http_allow_origins
        if isinstance(origins, str) or not all(isinstance(o, str) and o for o in origins):
            raise ConfigError(
                f'http_allow_origins must be a list of origins (or "*"), got {origins!r}'
            )
        object.__setattr__(self, "http_allow_origins", tuple(origins))

    @property
    def commit_delay_seconds(self) -> float:
        return self.commit_max_delay_ms / 1000.0

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None


_FIELDS = {f.name for f in dataclasses.fields(ShufflerSettings)}


def load_config(
    path: str | Path, overrides: dict[str, Any] | None = None
) -> tuple[Registry, ShufflerSettings]:
    """Read the registry file and the daemon settings; ``overrides`` (flags) win.

    Raises ``ConfigError`` naming the bad field (registry errors included).
    """
    try:
        registry, values, _ = load_daemon_config(path, "shuffler", _FIELDS, overrides, ConfigError)
    except RegistryError as exc:
        raise ConfigError(str(exc)) from None
    try:
        settings = ShufflerSettings(**values)
    except TypeError as exc:
        raise ConfigError(f"[shuffler]: {exc}") from None
    if settings.max_clock_skew_seconds >= registry.window_seconds:
        raise ConfigError(
            f"max_clock_skew_seconds ({settings.max_clock_skew_seconds}) must be less than "
            f"the collection window ({registry.window_seconds} s)"
        )
    return registry, settings


# The token of deploy/tokens.example.txt: public, so it authenticates nobody.
PLACEHOLDER_TOKEN = "REPLACE-ME-WITH-A-RANDOM-TOKEN"


def load_tokens(path: str | Path, *, allow_placeholder: bool = False) -> frozenset[str]:
    """Bearer tokens, one a line as ``<app name> <token>`` or just ``<token>``;
    blank lines and ``#`` comments are skipped. The app name is for operators only.

    The placeholder token of ``deploy/tokens.example.txt`` is refused (it is public)
    unless ``allow_placeholder`` (the daemon's ``allow_unauthenticated``)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"tokens_file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"tokens_file {path} is not UTF-8 text") from None
    tokens = frozenset(
        s.split()[-1] for line in lines if (s := line.strip()) and not s.startswith("#")
    )
    if not tokens:
        raise ConfigError(f"tokens_file {path} holds no token")
    if PLACEHOLDER_TOKEN in tokens and not allow_placeholder:
        raise ConfigError(
            f"tokens_file {path} holds the placeholder token {PLACEHOLDER_TOKEN} of "
            "tokens.example.txt, which authenticates nobody: put a random token there "
            '(python3 -c "import secrets; print(secrets.token_hex(32))"), '
            "or allow it with --allow-unauthenticated (or allow_unauthenticated = true in "
            "[shuffler])"
        )
    if any(len(t) < 16 for t in tokens):
        raise ConfigError(f"tokens_file {path}: every token must be at least 16 characters")
    return tokens
