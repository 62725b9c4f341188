"""What a sender does with each refusal (crowdmix.client.answers), one table for all senders."""

from __future__ import annotations

import pytest

from crowdmix.client.answers import Action, classify
from crowdmix.client.target import check_target

TLS_AGAINST_PLAINTEXT = (
    "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:36511: Tls "
    "handshake failed (TSI_PROTOCOL_FAILURE): SSL_ERROR_SSL: error:100000f7:SSL "
    "routines:OPENSSL_internal:WRONG_VERSION_NUMBER"
)  # what grpc says, verbatim

TABLE = [
    # status, details, action, reason, after a refetch
    ("UNAVAILABLE", "failed to connect to all addresses", Action.RETRY, "unavailable", None),
    ("DEADLINE_EXCEEDED", "store_outcome_unknown: x", Action.RETRY, "deadline_exceeded", None),
    ("RESOURCE_EXHAUSTED", "rate_limited: x", Action.RETRY, "resource_exhausted", None),
    ("ABORTED", "", Action.RETRY, "aborted", None),
    ("FAILED_PRECONDITION", "window_closed: window 3", Action.DROP, "window_closed", None),
    ("FAILED_PRECONDITION", "window_ahead: window 9 lies ahead", Action.REFETCH, "window_ahead",
     Action.RETRY),
    ("FAILED_PRECONDITION", "stale_key: key 5 is not accepted", Action.REFETCH, "stale_key",
     Action.RETRY),
    ("INVALID_ARGUMENT", "fingerprint_mismatch: x", Action.REFETCH, "fingerprint_mismatch",
     Action.DROP),
    ("INVALID_ARGUMENT", "unknown_metric: 'x'", Action.REFETCH, "unknown_metric", Action.DROP),
    ("INVALID_ARGUMENT", "protocol_unsupported: 1", Action.FATAL, "protocol_unsupported", None),
    ("UNAUTHENTICATED", "bad_token: the bearer token is not valid", Action.FATAL,
     "unauthenticated", None),
    ("PERMISSION_DENIED", "", Action.FATAL, "permission_denied", None),
    ("UNIMPLEMENTED", "Method not found", Action.FATAL, "unimplemented", None),
    ("UNAVAILABLE", TLS_AGAINST_PLAINTEXT, Action.FATAL, "tls", None),
    ("NOT_FOUND", "", Action.RETRY, "unexpected_status", None),
]  # fmt: skip


@pytest.mark.parametrize(("code", "details", "action", "reason", "after"), TABLE)
def test_every_refusal_has_one_action(
    code: str, details: str, action: Action, reason: str, after: Action | None
) -> None:
    answer = classify(code, details)
    assert (answer.action, answer.reason) == (action, reason)
    assert code in answer.message
    if after is not None:
        assert answer.after_refetch is after


def test_a_tls_failure_says_what_to_check() -> None:
    assert "tls=False" in classify("UNAVAILABLE", TLS_AGAINST_PLAINTEXT).message


@pytest.mark.parametrize(
    "target", ["shuffler.example:7400", "127.0.0.1:1", "[::1]:7400", "dns:///x.example:443",
               "unix:/run/crowdmix.sock", "ipv4:10.0.0.1:7400"],
)  # fmt: skip
def test_a_target_with_a_port_is_taken(target: str) -> None:
    assert check_target(target) == target


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("http://shuffler.example:7400", "without a scheme"),
        ("https://shuffler.example", "without a scheme"),
        ("shuffler.example", "has no port: write 'host:port', e.g. 'shuffler.example:7400'"),
        ("[::1]", "has no port"),
        ("::1", "in brackets"),
        ("shuffler.example:http", "port 'http' is not a port number"),
        ("shuffler.example:70000", "port '70000'"),
        ("", "host:port"),
    ],
)
def test_a_target_that_cannot_work_is_refused_naming_why(target: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace("[", r"\[")):
        check_target(target)
