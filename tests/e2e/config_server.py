"""A real gRPC server on loopback that answers ``GetConfig`` with a given answer.

For the answers a real shuffler never gives (a window below an hour, a server time
in the year 3000, params that send the value in the clear). ``Submit`` is refused
UNAVAILABLE: nothing is stored.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent import futures

import grpc

from crowdmix.core.device_config import DeviceConfig, to_proto
from crowdmix.core.sealed import PublicKeySet
from crowdmix.protos import crowdmix_pb2 as pb
from crowdmix.protos import crowdmix_pb2_grpc
from tests.shuffler.helpers import make_registry

TOKEN = "app-token-123"


class ConfigServer(crowdmix_pb2_grpc.ShufflerServicer):  # type: ignore[misc]
    def __init__(self, answer: pb.ConfigResponse) -> None:
        self.answer = answer

    def GetConfig(self, request: pb.GetConfigRequest, context: grpc.ServicerContext) -> object:
        answer = pb.ConfigResponse()
        answer.CopyFrom(self.answer)
        if not answer.server_time:
            answer.server_time = time.time()  # unless the test set one
        return answer

    def Submit(self, request: pb.SubmitRequest, context: grpc.ServicerContext) -> object:
        context.abort(grpc.StatusCode.UNAVAILABLE, "store_unavailable: store down")


def good_answer() -> pb.ConfigResponse:
    """What a plaintext shuffler with ``make_registry()`` answers (no time yet)."""
    return to_proto(DeviceConfig.of(make_registry(), PublicKeySet(())))


@contextlib.contextmanager
def serve_config(answer: pb.ConfigResponse) -> Iterator[str]:
    """The server's target while the block runs."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    crowdmix_pb2_grpc.add_ShufflerServicer_to_server(ConfigServer(answer), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(None)
