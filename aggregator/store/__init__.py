"""Where the aggregator keeps counts and applied batch ids: one protocol, memory and Redis."""
