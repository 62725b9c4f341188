"""The public surface of aggregator.accounting is exactly its __all__."""

from __future__ import annotations

import inspect
import subprocess
import sys

import crowdmix.aggregator.accounting as accounting


def test_all_names_resolve_and_cover_bound_api() -> None:
    for name in accounting.__all__:
        assert hasattr(accounting, name), name
    bound = {
        name
        for name, value in vars(accounting).items()
        if not name.startswith("_")
        and (inspect.isclass(value) or inspect.isfunction(value))
        and (getattr(value, "__module__", "") or "").startswith("crowdmix.aggregator.accounting")
    }
    assert bound <= set(accounting.__all__)


def test_importing_the_package_and_cli_stays_light() -> None:
    # Heavy math (numpy, scipy, dp_accounting) loads only when a bound is computed.
    code = (
        "import sys, aggregator.accounting, crowdmix.privacy; "
        "print(sorted(m for m in ('numpy', 'scipy', 'dp_accounting', 'redis') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()
    assert out == "[]"
