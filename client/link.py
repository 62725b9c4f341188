"""The reporter's connection to a shuffler: ``GetConfig`` and ``Submit`` over gRPC.

``crowdmix.client.reporter`` imports this module only when it has something to send or a
config to fetch, so ``import crowdmix.client`` and an app that only claims
reports never load grpc. Errors come back as ``LinkError`` with the status code's
name and the details, so the policy (``crowdmix.client.answers``) reads without
grpc types.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

try:
    import grpc
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the install
    raise ModuleNotFoundError(
        "sending reports needs grpc: pip install 'crowdmix[transport]'", name=exc.name
    ) from None

from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc

__all__ = ["Link", "LinkError", "make_channel"]

# Reconnect quickly once the network is back (grpc's default backoff grows to 120 s);
# the reporter's own backoff paces the attempts.
_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 500),
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 5000),
)


_POLL_SECONDS = 0.25
#: How long the call that asks why a channel does not connect may take.
_PROBE_SECONDS = 0.2


def make_channel(
    target: str,
    *,
    tls: bool,
    root_certificates: bytes | None = None,
    options: Sequence[tuple[str, int]] = (),
) -> grpc.Channel:
    """A TLS channel (``tls`` or root certificates given) or a plaintext one."""
    if tls or root_certificates is not None:
        creds = grpc.ssl_channel_credentials(root_certificates=root_certificates)
        return grpc.secure_channel(target, creds, options=list(options))
    return grpc.insecure_channel(target, options=list(options))


@dataclass(frozen=True, slots=True)
class LinkError(Exception):
    """A call failed: ``code`` is the gRPC status name (``"UNAVAILABLE"``, ...)."""

    code: str
    details: str

    def __str__(self) -> str:
        return f"{self.code}: {self.details}"


class Link:
    """One channel to one shuffler, with the app's bearer token."""

    def __init__(
        self,
        target: str,
        token: str | None,
        *,
        tls: bool,
        root_certificates: bytes | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.target = target
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout
        self._channel = make_channel(
            target, tls=tls, root_certificates=root_certificates, options=_CHANNEL_OPTIONS
        )
        self._stub = crowdmix_pb2_grpc.ShufflerStub(self._channel)
        self._probed = -_POLL_SECONDS

    def unreachable(self, timeout: float) -> LinkError | None:
        """None when the channel connects within ``timeout`` seconds; else why not: the
        status of a fail-fast call, whose details carry gRPC's last connection error (a
        refused connection, or a TLS handshake against a plaintext port). The sender
        waits for a connection no longer than this, so ``close`` never waits long
        behind it on a network that drops packets."""
        ready = grpc.channel_ready_future(self._channel)
        self._probed = time.monotonic()
        try:
            ready.result(timeout=max(timeout, 0.0))
            return None
        except grpc.FutureTimeoutError:
            pass
        finally:
            ready.cancel()  # stops its polling thread before the channel may close
        try:
            self.get_config(_PROBE_SECONDS)
        except LinkError as exc:
            return exc
        return None

    def _call_error(self, exc: grpc.RpcError) -> LinkError:
        if isinstance(exc, grpc.Call):
            return LinkError(exc.code().name, exc.details() or "")
        return LinkError("UNKNOWN", str(exc))

    def get_config(self, timeout: float | None = None) -> bytes:
        """The GetConfig answer, serialized (what the outbox caches)."""
        try:
            answer = self._stub.GetConfig(
                pb.GetConfigRequest(),
                metadata=self._metadata,
                timeout=self._timeout if timeout is None else timeout,
            )
        except grpc.RpcError as exc:
            raise self._call_error(exc) from None
        return bytes(answer.SerializeToString())

    def submit(self, request: pb.SubmitRequest, timeout: float | None = None) -> int:
        """Send one request; the number of reports the shuffler acknowledged."""
        try:
            resp = self._stub.Submit(
                request,
                metadata=self._metadata,
                timeout=self._timeout if timeout is None else timeout,
            )
        except grpc.RpcError as exc:
            raise self._call_error(exc) from None
        return int(resp.accepted)

    def close(self) -> None:
        # grpc's connectivity poller (behind ready()) checks the channel every 0.2 s until
        # it sees no subscriber; closing the channel under it prints a traceback. Wait it out.
        wait = self._probed + _POLL_SECONDS - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._channel.close()
