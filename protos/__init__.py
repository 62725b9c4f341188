"""The wire contract: ``crowdmix.proto`` and its checked-in generated code.

Regenerate with ``scripts/gen-protos``; tests/test_protos.py fails on drift.
"""

from crowdmix.protos import crowdmix_pb2, crowdmix_pb2_grpc

__all__ = ["crowdmix_pb2", "crowdmix_pb2_grpc"]
