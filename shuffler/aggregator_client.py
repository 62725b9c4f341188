"""The shuffler's gRPC client of ``Aggregator.Ingest``: the ``Sender`` the releaser
(``crowdmix.shuffler.forwarding``) uses in production. Status codes become ``ForwardError``
here, with whether a retry can help."""

from __future__ import annotations

import grpc

from crowdmix.protos import crowdmix_pb2_grpc
from crowdmix.shuffler.config import FORWARD_TIMEOUT_SECONDS
from crowdmix.shuffler.errors import ForwardError
from crowdmix.shuffler.serde import batch_to_proto
from crowdmix.shuffler.store import InFlightBatch

__all__ = ["AggregatorSender"]


class AggregatorSender:
    """Sends batches to ``Aggregator.Ingest``; optional (m)TLS. Raises ForwardError."""

    def __init__(
        self,
        target: str,
        *,
        ca: bytes | None = None,
        cert: bytes | None = None,
        key: bytes | None = None,
        timeout: float = FORWARD_TIMEOUT_SECONDS,
    ) -> None:
        options = [
            ("grpc.max_send_message_length", -1),
            ("grpc.max_receive_message_length", -1),
            # gRPC's default reconnect backoff grows to 120 s: after a short aggregator
            # outage batches would wait minutes. Releases already retry with their own
            # backoff, so the channel should come back within seconds.
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", 3000),
        ]
        if ca is not None:
            creds = grpc.ssl_channel_credentials(
                root_certificates=ca, private_key=key, certificate_chain=cert
            )
            self._channel = grpc.secure_channel(target, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._stub = crowdmix_pb2_grpc.AggregatorStub(self._channel)
        self._timeout = timeout

    @property
    def timeout(self) -> float:
        """The deadline of one Ingest call (the Releaser re-offers only older batches)."""
        return self._timeout

    def __call__(self, batch: InFlightBatch) -> None:
        try:
            self._stub.Ingest(batch_to_proto(batch), timeout=self._timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            details = exc.details() if isinstance(exc, grpc.Call) else ""
            raise ForwardError(
                f"Ingest failed: {code}: {details}",
                retryable=code
                not in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION),
            ) from None

    def close(self) -> None:
        self._channel.close()
