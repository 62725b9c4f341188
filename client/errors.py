"""Exceptions raised by the client SDK.

CrowdmixClientError (crowdmix.core.errors.CrowdmixError)
├── ParamsError (also ValueError)      invalid params / mechanism / registry entry (core)
├── OutboxError (client.outbox)        the outbox file cannot be used, or has another schema
└── TransportError                     the shuffler could not take the reports
    └── QueueFullError                 the bounded in-memory queue dropped reports
"""

from __future__ import annotations

from crowdmix.core.errors import CrowdmixError, ParamsError

__all__ = ["CrowdmixClientError", "ParamsError", "QueueFullError", "TransportError"]

#: The SDK's name for the base of every error crowdmix raises on purpose: catching it
#: catches the core's ``ParamsError`` too.
CrowdmixClientError = CrowdmixError


class TransportError(CrowdmixClientError):
    """Reports could not be delivered to the shuffler."""


class QueueFullError(TransportError):
    """The transport's bounded queue is full."""
