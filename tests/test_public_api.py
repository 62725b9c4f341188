"""``__all__`` of each package is exactly its public surface.

For the SDK, ``crowdmix.client``, the list is pinned. For the other packages the rule is
checked instead of a frozen list: every name in ``__all__`` resolves, and every
public class or function that the package's ``__init__`` binds (imported from
inside the package) is in ``__all__``.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

CLIENT_API = [
    "BasicEncoder",
    "BasicParams",
    "BitSource",
    "CrowdmixClientError",
    "InstantaneousResponse",
    "OutboxError",
    "ParamsError",
    "PermanentResponse",
    "QueueFullError",
    "RapporEncoder",
    "RapporParams",
    "Report",
    "ReportBudget",
    "ReportResult",
    "ReportStatus",
    "Reporter",
    "SecureBits",
    "TransportError",
    "cohort_for_secret",
    "epsilon_inf",
    "epsilon_one",
    "new_secret",
]

PACKAGES = [
    "crowdmix.client",
    "crowdmix.core",
    "crowdmix.shuffler",
    "crowdmix.aggregator",
    "crowdmix.protos",
    "crowdmix",
]


def _bound_public_api(package: str, *also: str) -> set[str]:
    """Public classes/functions bound in the package namespace that come from the package
    (or from the packages in ``also``: the SDK re-exports the shared core's params)."""
    mod = importlib.import_module(package)
    names = set()
    for name, value in vars(mod).items():
        if name.startswith("_") or inspect.ismodule(value):
            continue
        if not (inspect.isclass(value) or inspect.isfunction(value)):
            continue
        origin = getattr(value, "__module__", "") or ""
        if any(origin == p or origin.startswith(p + ".") for p in (package, *also)):
            names.add(name)
    return names


def test_client_all_is_pinned() -> None:
    from crowdmix import client

    assert sorted(client.__all__) == CLIENT_API
    for name in client._LAZY:  # loaded on first use (import client stays light)
        assert getattr(client, name).__module__ == client._LAZY[name]
    assert _bound_public_api("crowdmix.client", "crowdmix.core") == set(CLIENT_API)


@pytest.mark.parametrize("package", PACKAGES)
def test_all_matches_public_names(package: str) -> None:
    mod = importlib.import_module(package)
    exported = mod.__all__
    assert len(exported) == len(set(exported)), "duplicates in __all__"
    for name in exported:
        assert hasattr(mod, name), f"{package}.__all__ names missing {name!r}"
    missing = _bound_public_api(package) - set(exported)
    assert not missing, f"{package} binds public names not in __all__: {sorted(missing)}"


@pytest.mark.parametrize(
    "module", ["crowdmix.client.batch", "crowdmix.client.randomness", "crowdmix.client.rappor"]
)
def test_client_submodules_export_what_they_define(module: str) -> None:
    mod = importlib.import_module(module)
    for name in mod.__all__:
        assert hasattr(mod, name)
    own = {
        n
        for n, v in vars(mod).items()
        if not n.startswith("_")
        and (inspect.isclass(v) or inspect.isfunction(v))
        and v.__module__ == module
    }
    assert own <= set(mod.__all__)
