"""crowdmix aggregator: counting, decoding, accounting and the report job."""

from __future__ import annotations

__all__: list[str] = []
