"""The shared core's exceptions (params, registry, sealed-report format).

CrowdmixError                          the base of every error crowdmix raises on purpose
├── ParamsError (also ValueError)      a parameter is out of range; names field and value
│   └── RegistryError (core.registry)  the metric registry file is missing or invalid
└── SealingError (core.sealed)         a report cannot be sealed (no usable key, bad key)

The app SDK names the base ``crowdmix.client.CrowdmixClientError``; the daemons add
their own hierarchies (``crowdmix.shuffler.errors``, ``crowdmix.aggregator.errors``).
"""

from __future__ import annotations

__all__ = ["CrowdmixError", "ParamsError"]


class CrowdmixError(Exception):
    """Base class of every error the SDK and the shared core raise on purpose."""


class ParamsError(CrowdmixError, ValueError):
    """A parameter is out of range; the message names the field and the value."""
