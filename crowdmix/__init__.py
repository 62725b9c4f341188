"""crowdmix: the command line and the one-process demo that tie the components together."""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["__version__"]
