"""The aggregator daemon's settings and the metric registry they sit beside.

In increasing precedence: the defaults of ``AggregatorSettings``, an optional
``[aggregator]`` table in the registry file (the shuffler's ``[shuffler]`` table may sit
there too and is left to it), and command-line flags. The settings (``listen``,
``redis``, ``min_replicas_ack``, TLS and mTLS, ``keys``, ``rounds_file``, ``workers``,
``open_workers``, metrics, ``port_file``, ``shutdown_grace_seconds``) each have a row in
docs/operating.md, "Aggregator settings". Without ``redis`` the store is in memory (lost at exit).
An unknown field, or a value of the wrong kind, raises ``ConfigError`` naming it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from crowdmix.aggregator.errors import ConfigError
from crowdmix.core.registry import (
    Registry,
    check_daemon_settings,
    check_integer,
    check_strings,
    load_daemon_config,
)

__all__ = ["AggregatorSettings", "load_config"]

#: field -> its command-line flag, for messages (an error names both spellings)
FLAGS = {
    "listen": "--listen",
    "redis": "--redis",
    "min_replicas_ack": "--min-replicas-ack",
    "tls_cert": "--tls-cert",
    "tls_key": "--tls-key",
    "tls_client_ca": "--tls-client-ca",
    "keys": "--keys",
    "rounds_file": "--rounds-file",
    "workers": "--workers",
    "open_workers": "--open-workers",
    "metrics_port": "--metrics-port",
    "metrics_host": "--metrics-host",
    "port_file": "--port-file",
    "shutdown_grace_seconds": "--grace",
}


def _name(field: str) -> str:
    return f"{field} ({FLAGS[field]})"


@dataclass(frozen=True, slots=True, kw_only=True)
class AggregatorSettings:
    """Everything the daemon needs besides the registry. Paths are not opened here."""

    listen: str = "127.0.0.1:7500"
    redis: str | None = None  # None: the in-memory store, lost when the process exits
    min_replicas_ack: int = 0
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_ca: str | None = None
    keys: str | None = None
    rounds_file: str | None = None  # the heavy-hitter round file (crowdmix discover)
    workers: int = 8
    open_workers: int = 0
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    port_file: str | None = None
    shutdown_grace_seconds: float = 10.0

    def __post_init__(self) -> None:
        check_daemon_settings(self, ConfigError, _name)
        check_strings(
            self, ("keys", "rounds_file", "metrics_host", "port_file"), ConfigError, _name
        )
        check_integer(_name("workers"), self.workers, ConfigError, low=1)
        check_integer(_name("open_workers"), self.open_workers, ConfigError, low=0)
        if self.metrics_port is not None:
            check_integer(_name("metrics_port"), self.metrics_port, ConfigError, low=0, high=65535)
        g = self.shutdown_grace_seconds
        if isinstance(g, bool) or not isinstance(g, int | float) or not 0 <= g < math.inf:
            raise ConfigError(f"{_name('shutdown_grace_seconds')} must be >= 0, got {g!r}")


_FIELDS = {f.name for f in dataclasses.fields(AggregatorSettings)}


def load_config(
    path: str | Path, overrides: dict[str, Any] | None = None
) -> tuple[Registry, AggregatorSettings]:
    """The registry of ``path`` and the daemon's settings: its ``[aggregator]`` table
    over the defaults, ``overrides`` (flags; None: not given) over both.

    Raises ``ConfigError`` for a bad table or value, ``RegistryError`` (both name the
    file and the field) for a bad registry."""
    registry, values, from_file = load_daemon_config(
        path, "aggregator", _FIELDS, overrides, ConfigError
    )
    try:
        return registry, AggregatorSettings(**values)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}" if from_file else str(exc)) from None
