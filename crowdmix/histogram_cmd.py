"""``crowdmix privacy histogram``: plan or check a shuffled histogram with fake reports.

    crowdmix privacy histogram --n N --domain D --epsilon E [--delta D] --max-messages M
                               [--honest-fraction H | --dishonest-devices K]
                               [--local-epsilon X|auto] [--json]
        plan: fake slots m and fill probability q for central (ε, δ) within the cap
    crowdmix privacy histogram --n N --domain D --fake-slots m --fake-probability q
                               [--delta D] [--honest-fraction H | --dishonest-devices K]
                               [--local-epsilon X] [--json]
        check: both privacy figures and the expected error of a given configuration

N devices in one batch, at most K = ⌈(1 − H)·N⌉ (or the K given) dishonest, all in the
protected device's batch: N − 1 − K honest others are its cover. Registered by
``crowdmix.privacy``; the math is ``crowdmix.aggregator.accounting.histogram(_plan)``.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from crowdmix.options import positive_count

__all__ = ["register_privacy"]


def _local(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number or 'auto', got {text!r}") from None


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, got {value}")
    return value


def register_privacy(psub: Any) -> None:
    hist = psub.add_parser(
        "histogram",
        help="shuffled histogram with fake reports: plan (m, q) or check a configuration",
    )
    hist.add_argument(
        "--n", type=positive_count, required=True, help="devices reporting per release"
    )
    hist.add_argument("--domain", type=positive_count, required=True, help="domain size d")
    hist.add_argument("--epsilon", type=float, help="target central ε (plan)")
    hist.add_argument("--delta", type=float, default=1e-6, help="δ (default 1e-6)")
    hist.add_argument("--max-messages", type=int, help="cap on reports per device (plan)")
    hist.add_argument("--fake-slots", type=int, help="m: fake slots per device (check)")
    hist.add_argument("--fake-probability", type=float, help="q: fill probability (check)")
    crowd = hist.add_mutually_exclusive_group()
    crowd.add_argument(
        "--honest-fraction",
        type=float,
        default=1.0,
        help="share of the N devices assumed honest: at most ⌈(1 − H)·N⌉ dishonest ones, "
        "all counted in the protected device's batch (default 1)",
    )
    crowd.add_argument(
        "--dishonest-devices",
        type=_non_negative,
        help="at most this many of the N devices dishonest (instead of --honest-fraction)",
    )
    hist.add_argument(
        "--local-epsilon",
        type=_local,
        help="k-RR on the real report with this local ε ('auto' when planning: at most "
        "doubles the variance); default none (no guarantee if shuffler and aggregator collude)",
    )
    hist.add_argument("--json", action="store_true", help="print a JSON object")
    hist.set_defaults(func=_histogram)


def _histogram(args: argparse.Namespace) -> int:
    from crowdmix.cli import CliError

    checking = args.fake_slots is not None or args.fake_probability is not None
    try:
        if checking:
            out, text = _check(args)
        else:
            out, text = _plan(args)
    except ValueError as exc:  # ParamsError and PlanError are ValueErrors
        raise CliError(str(exc)) from None
    print(json.dumps(out, indent=2, allow_nan=False) if args.json else text)
    return 0


def _check(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from crowdmix.aggregator.accounting.histogram import histogram_guarantee
    from crowdmix.aggregator.decode.histogram import count_variance
    from crowdmix.core.histogram import HistogramParams

    if args.fake_slots is None or args.fake_probability is None:
        raise ValueError("checking a configuration needs both --fake-slots and --fake-probability")
    if args.epsilon is not None or args.max_messages is not None:
        raise ValueError("--epsilon/--max-messages plan; --fake-slots/--fake-probability check")
    if args.local_epsilon == "auto":
        raise ValueError("--local-epsilon auto only applies when planning")
    params = HistogramParams(
        domain_size=args.domain,
        fake_slots=args.fake_slots,
        fake_probability=args.fake_probability,
        local_epsilon=args.local_epsilon,
    )
    g = histogram_guarantee(
        params,
        args.n,
        args.delta,
        honest_fraction=args.honest_fraction,
        dishonest_devices=args.dishonest_devices,
    )
    se = math.sqrt(float(count_variance(params, args.n, 0.0)))
    out = g.to_dict()
    out.update(
        expected_messages=params.expected_messages,
        max_messages=params.max_messages,
        expected_fakes_per_value=args.n * params.fake_slots * params.fake_probability / args.domain,
        std_error_count=se,
        std_error=se / args.n,
    )
    text = (
        f"{args.n:,} devices, d = {args.domain:,}, m = {params.fake_slots}, "
        f"q = {params.fake_probability:g}:\n  {g.render()}\n"
        f"  messages per device: {params.expected_messages:.4g} on average, at most "
        f"{params.max_messages}\n  std error of a value's count ≈ {se:.3g} "
        f"(proportion {se / args.n:.3g})"
    )
    return out, text


def _plan(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    from crowdmix.aggregator.accounting.histogram import format_up
    from crowdmix.aggregator.accounting.histogram_plan import plan_histogram

    if args.epsilon is None or args.max_messages is None:
        raise ValueError(
            "planning needs --epsilon and --max-messages "
            "(or check a configuration with --fake-slots and --fake-probability)"
        )
    result = plan_histogram(
        args.epsilon,
        args.delta,
        args.n,
        args.domain,
        max_messages=args.max_messages,
        honest_fraction=args.honest_fraction,
        dishonest_devices=args.dishonest_devices,
        local_epsilon=args.local_epsilon,
    )
    p = result.params
    local = (
        f"{format_up(p.local_epsilon)}-LDP (k-RR)"
        if p.local_epsilon is not None
        else "none (add --local-epsilon for a finite figure)"
    )
    text = (
        f"For central ε ≤ {args.epsilon} (δ = {args.delta}) over {args.n:,} devices, "
        f"d = {args.domain:,}, at most {args.max_messages} reports per device:\n"
        f"  fake slots m = {p.fake_slots}, fill probability q = {p.fake_probability:.6g}\n"
        f"  central ε = {format_up(result.central_epsilon)} ({result.n_honest:,} honest "
        f"devices besides the protected one, at most {result.dishonest:,} dishonest); "
        f"shuffler + aggregator colluding: {local}\n"
        f"  messages per device: {result.expected_messages:.4g} on average, at most "
        f"{result.max_messages} (the shuffler's cap)\n"
        f"  fakes per value ≈ {result.expected_fakes_per_value:.3g}; std error of a value's "
        f"count ≈ {result.std_error_count:.3g} (proportion {result.std_error:.3g})"
    )
    return result.to_dict(), text
