"""What ``crowdmix discover``'s commands share: the population of ``--words`` /
``--values``, and the result table with its privacy statement as printed."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["population", "print_result", "result_rows"]


def result_rows(table: Any, top: int) -> list[dict[str, Any]]:
    """The significant discovered values (at most ``top``), as printed."""
    return [
        {
            "value": v,
            "share": float(table.share[i]),
            "ci_low": float(table.ci_low[i]),
            "ci_high": float(table.ci_high[i]),
            "significant": bool(table.significant[i]),
        }
        for i, v in enumerate(table.values)
        if table.significant[i]
    ][:top]


def print_result(
    table: Any,
    guarantee: Any,
    costs: Any,
    *,
    top: int,
    as_json: bool = False,
    ledger: dict[str, Any] | None = None,
) -> None:
    """The discovered values with shares and 95% intervals, and the privacy statement."""
    rows = result_rows(table, top)
    rounds = [{"round": r, "group": g, "reports": n, "epsilon0": e} for r, g, n, e in costs]
    if as_json:
        out: dict[str, Any] = {"values": rows, "rounds": rounds, "privacy": guarantee.to_dict()}
        if ledger is not None:
            out["ledger"] = ledger
        print(json.dumps(out))
        return
    print(f"{'value':<18} {'share':>9}   95% interval")
    for row in rows:
        print(
            f"{row['value']:<18} {row['share']:>9.5f}   [{row['ci_low']:.5f}, {row['ci_high']:.5f}]"
        )
    print(
        f"\nprivacy: central (ε={guarantee.epsilon:.4f}, δ={guarantee.delta:.1e}) over "
        f"{len(rounds)} rounds ({guarantee.argument}); each device reports once, "
        f"local ε0 ≤ {guarantee.local_epsilon:.3f}"
    )
    for r in rounds:
        print(f"  round {r['round']}: over {r['reports']} reports, ε0 = {r['epsilon0']:.3f}")
    if ledger is not None:
        print(
            f"ledger: {ledger['releases']} releases of this metric, total "
            f"(ε={ledger['total_epsilon']:.4f}, δ={ledger['total_delta']:.1e})"
        )


def population(args: argparse.Namespace) -> tuple[list[str], list[float]]:
    """(values, weights) of ``--words N`` or ``--values FILE``."""
    from crowdmix.cli import CliError
    from crowdmix.options import read_input

    if args.words is not None:
        try:
            import wordfreq
        except ImportError:
            raise CliError(
                "--words needs the wordfreq package: pip install 'crowdmix[words]'"
            ) from None

        values = list(wordfreq.top_n_list("en", args.words))
        return values, [wordfreq.word_frequency(v, "en") for v in values]
    text = read_input(args.values, "values file").decode("utf-8", errors="replace")
    values, weights = [], []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        value, _, weight = line.partition("\t")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            raise CliError(f"{args.values}:{i}: weight {weight!r} is not a number") from None
        if not w > 0:
            raise CliError(f"{args.values}:{i}: weight must be positive, got {weight!r}")
        values.append(value)
        weights.append(w)
    if not values:
        raise CliError(f"{args.values}: no values")
    return values, weights
