"""What a sender does with a shuffler's refusal: one table for every sender.

``classify(code, details)`` reads a gRPC status (its name, e.g. ``"UNAVAILABLE"``, and
its details, which start with the shuffler's reason: ``"stale_key: ..."``) and answers
with an ``Answer``. Both senders — ``Reporter`` and ``ShufflerClient`` — act on it, so
they never disagree: RETRY for UNAVAILABLE, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED,
ABORTED, ... (the same report id makes a repeat harmless); DROP for ``window_closed``;
REFETCH (the config once) for ``window_ahead``, ``stale_key``, any other
FAILED_PRECONDITION and any other INVALID_ARGUMENT (after the refetch: DROP); FATAL for
``protocol_unsupported``, UNAUTHENTICATED, PERMISSION_DENIED, UNIMPLEMENTED and a failed
TLS handshake. A FATAL answer keeps the reports (an app update can fix the setting) and
says why. Pure: no grpc import. The table with reasons: docs/design.md, "Client".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["RETRY_CODES", "Action", "Answer", "classify"]


class Action(enum.Enum):
    """What to do with the reports of a refused request."""

    RETRY = "retry"  # keep them, back off, try again with the same ids
    REFETCH = "refetch"  # fetch the config once, then act as ``Answer.after_refetch``
    DROP = "drop"  # never deliverable: drop them, counted under ``Answer.reason``
    FATAL = "fatal"  # a setup error: keep them, back off, and tell the app


@dataclass(frozen=True, slots=True)
class Answer:
    """A classified refusal: the action, a short reason label and the full message."""

    action: Action
    reason: str
    message: str
    #: for REFETCH: what the same answer means once the config was fetched again
    #: (RETRY: keep the reports; DROP: drop them as ``refused``; FATAL)
    after_refetch: Action = Action.RETRY


#: Status codes after which the same request may succeed later.
RETRY_CODES = frozenset(
    {
        "UNAVAILABLE",
        "RESOURCE_EXHAUSTED",
        "DEADLINE_EXCEEDED",
        "ABORTED",
        "UNKNOWN",
        "INTERNAL",
        "CANCELLED",
    }
)
_FATAL = {
    "UNAUTHENTICATED": "the shuffler refused the app's token",
    "PERMISSION_DENIED": "the shuffler refused the app's token",
    "UNIMPLEMENTED": "the target is not a crowdmix shuffler (or one without this protocol)",
}
#: What gRPC's details say when TLS meets a plaintext port, or a certificate is refused.
_TLS_FAILURES = ("Tls handshake failed", "Ssl handshake failed", "CERTIFICATE_VERIFY_FAILED")


def _reason(details: str) -> str:
    """The shuffler's reason label, the details' first word before a colon."""
    head, sep, _ = details.partition(":")
    return head.strip() if sep and head.strip().isidentifier() else ""


def classify(code: str, details: str) -> Answer:
    """The action for a call that failed with status ``code`` and ``details``."""
    reason = _reason(details)
    message = f"{code}: {details}" if details else code
    if code == "FAILED_PRECONDITION":
        if reason == "window_closed":
            return Answer(Action.DROP, "window_closed", message)
        return Answer(Action.REFETCH, reason or "failed_precondition", message)
    if code == "INVALID_ARGUMENT":
        if reason == "protocol_unsupported":
            return Answer(Action.FATAL, reason, message)
        return Answer(Action.REFETCH, reason or "invalid_argument", message, Action.DROP)
    if code in _FATAL:
        return Answer(Action.FATAL, code.lower(), f"{_FATAL[code]} ({message})")
    if any(marker in details for marker in _TLS_FAILURES):
        return Answer(
            Action.FATAL,
            "tls",
            f"the TLS handshake failed: does the port speak plaintext (tls=False), or are "
            f"root_certificates missing? ({message})",
        )
    return Answer(
        Action.RETRY, code.lower() if code in RETRY_CODES else "unexpected_status", message
    )
