"""crowdmix client SDK: encode values under local differential privacy.

    >>> import client
    >>> params = client.RapporParams(k=128, h=2, m=64, f=0.5, p=0.5, q=0.75)
    >>> secret = client.new_secret()        # made once per device and stored
    >>> encoder = client.RapporEncoder(params, secret=secret, metric="home_page")
    >>> report = encoder.encode("example.com")  # a client.Report, ε_1-LDP
    >>> len(report.bits) == params.k // 8
    True
    >>> round(client.epsilon_one(params), 4)
    1.0743

The core loads neither grpc, numpy nor redis. ``client.transport`` (grpc) and
``client.batch`` (numpy) are imported only when used.

This namespace is the SDK an app uses. What the daemons and analysts share with
it lives in modules they import by name: ``client.registry`` (the metric
registry), ``client.privacy`` (p*, q*) and ``client.hashing`` (Bloom bits).
"""

from __future__ import annotations

from client.basic import BasicEncoder, BasicParams
from client.budget import ReportBudget
from client.errors import CrowdmixClientError, ParamsError, QueueFullError, TransportError
from client.params import RapporParams
from client.privacy import epsilon_inf, epsilon_one
from client.randomness import BitSource, SecureBits
from client.rappor import (
    InstantaneousResponse,
    PermanentResponse,
    RapporEncoder,
    cohort_for_secret,
    new_secret,
)
from client.report import Report

__all__ = [
    "BasicEncoder",
    "BasicParams",
    "BitSource",
    "CrowdmixClientError",
    "InstantaneousResponse",
    "ParamsError",
    "PermanentResponse",
    "QueueFullError",
    "RapporEncoder",
    "RapporParams",
    "Report",
    "ReportBudget",
    "SecureBits",
    "TransportError",
    "cohort_for_secret",
    "epsilon_inf",
    "epsilon_one",
    "new_secret",
]
