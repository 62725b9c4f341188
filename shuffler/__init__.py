"""crowdmix shuffler daemon (being built; see issue 4)."""

from __future__ import annotations

__all__: list[str] = []
