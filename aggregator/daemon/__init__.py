"""The aggregator daemon: gRPC server, the Ingest servicer, exactly-once ingest, metrics."""
