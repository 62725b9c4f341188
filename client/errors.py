"""Exceptions raised by the client SDK.

CrowdmixClientError
├── ParamsError (also ValueError)      invalid RapporParams / mechanism / registry entry
├── OutboxError (client.outbox)        the outbox file cannot be used, or has another schema
└── TransportError                     the shuffler could not take the reports
    └── QueueFullError                 the bounded in-memory queue dropped reports
"""

from __future__ import annotations

__all__ = ["CrowdmixClientError", "ParamsError", "QueueFullError", "TransportError"]


class CrowdmixClientError(Exception):
    """Base class of every error the client SDK raises on purpose."""


class ParamsError(CrowdmixClientError, ValueError):
    """A parameter is out of range; the message names the field and the value."""


class TransportError(CrowdmixClientError):
    """Reports could not be delivered to the shuffler."""


class QueueFullError(TransportError):
    """The transport's bounded queue is full."""
