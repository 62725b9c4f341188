"""crowdmix client SDK: encode values under local differential privacy.

    >>> from crowdmix import client
    >>> params = client.RapporParams(k=128, h=2, m=64, f=0.5, p=0.5, q=0.75)
    >>> secret = client.new_secret()        # made once per device and stored
    >>> encoder = client.RapporEncoder(params, secret=secret, metric="home_page")
    >>> report = encoder.encode("example.com")  # a client.Report, ε_1-LDP
    >>> len(report.bits) == params.k // 8
    True
    >>> round(client.epsilon_one(params), 4)
    1.0743

An app embeds ``client.Reporter`` (``crowdmix.client.reporter``). The core loads neither
grpc, numpy nor redis (``transport``, ``link``, ``batch`` load them when imported). What
daemons share with the SDK lives in ``crowdmix.core`` (registry, privacy, hashing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from crowdmix.client.basic import BasicEncoder
from crowdmix.client.budget import ReportBudget
from crowdmix.client.errors import CrowdmixClientError, ParamsError, QueueFullError, TransportError
from crowdmix.client.randomness import BitSource, SecureBits
from crowdmix.client.rappor import (
    InstantaneousResponse,
    PermanentResponse,
    RapporEncoder,
    cohort_for_secret,
    new_secret,
)
from crowdmix.client.report import Report
from crowdmix.core.basic import BasicParams
from crowdmix.core.params import RapporParams
from crowdmix.core.privacy import epsilon_inf, epsilon_one

if TYPE_CHECKING:
    from crowdmix.client.outbox import OutboxError
    from crowdmix.client.reporter import Reporter, ReportResult, ReportStatus

__all__ = [
    "BasicEncoder",
    "BasicParams",
    "BitSource",
    "CrowdmixClientError",
    "InstantaneousResponse",
    "OutboxError",
    "ParamsError",
    "PermanentResponse",
    "QueueFullError",
    "RapporEncoder",
    "RapporParams",
    "Report",
    "ReportBudget",
    "ReportResult",
    "ReportStatus",
    "Reporter",
    "SecureBits",
    "TransportError",
    "cohort_for_secret",
    "epsilon_inf",
    "epsilon_one",
    "new_secret",
]


# The app layer (SQLite, threads, logging) loads on first use: an app that only
# encodes, and ``import client`` itself, do not pay for it.
_LAZY = {
    "OutboxError": "crowdmix.client.outbox",
    "Reporter": "crowdmix.client.reporter",
    "ReportResult": "crowdmix.client.reporter",
    "ReportStatus": "crowdmix.client.reporter",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'client' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
