"""``crowdmix privacy ...`` and ``crowdmix plan``: thin wrappers over the accounting math.

    crowdmix privacy amplify --epsilon0 E --n N --delta D [--bound B] [--json]
    crowdmix privacy compose --epsilon E --delta D --releases R --target-delta D2 --method M
                             [--json]
    crowdmix privacy rounds  --epsilon0 E --n N --rounds R --delta D [--json]
    crowdmix privacy metric  --config FILE --metric NAME --n N [--rounds R]
                             [--cohort-share S] [--batch-sizes B1,B2,..] [--json]
    crowdmix privacy ledger  FILE [--metric NAME] [--json]
    crowdmix privacy histogram ...   (crowdmix.histogram_cmd: fake-report histograms)
    crowdmix plan --epsilon E --delta D --n N --candidates C [--rounds R] [--json]

Only argparse/stdlib at module level; the math is imported inside each command.
"""

from __future__ import annotations

import argparse
import json
import math
import tomllib
from typing import Any

from crowdmix.options import add_rappor_options, plural, positive_count

__all__ = ["register"]

# Binary RR's exact lower bound sums all n+1 counts: fast up to a few million.
_BINARY_RR_MAX_N = 2_000_000


def register(sub: Any) -> None:
    privacy = sub.add_parser(
        "privacy", help="local, amplified and composed privacy guarantees (ε, δ)"
    )
    psub = privacy.add_subparsers(dest="privacy_command", metavar="WHAT")
    privacy.set_defaults(func=lambda args: _usage(privacy))

    amp = psub.add_parser("amplify", help="central (ε, δ) of n shuffled ε0-LDP reports")
    amp.add_argument("--epsilon0", type=float, help="local ε of one report (default: ε_1 of -k..)")
    amp.add_argument(
        "--n", type=positive_count, required=True, help="reports shuffled together (1e8 ok)"
    )
    amp.add_argument("--delta", type=float, default=1e-6, help="target δ (default 1e-6)")
    amp.add_argument(
        "--bound",
        default="generic",
        choices=("generic", "rappor", "fmt21", "fmt21-closed"),
        help="generic stronger clone (default), FMT21 exact or closed form; 'rappor' is "
        "refused (the (p,β,q) variation-ratio pair understates ε)",
    )
    amp.add_argument("--beta", type=float, help=argparse.SUPPRESS)  # refused, see --bound
    amp.add_argument(
        "--mechanism",
        choices=("any", "krr", "binary-rr", "oue", "olh", "rappor"),
        default="any",
        help="the local randomizer: any ε0-LDP one (default: the generic bound only), or a "
        "known one whose privacy-blanket bound (and, for binary RR, its own bound over "
        "every data set) is also tried (the smallest ε is printed); "
        "rappor: one report of the -k.. params",
    )
    amp.add_argument("--domain", type=int, help="values of krr/oue/olh (default 2 for krr)")
    _rappor_args(amp)
    amp.add_argument(
        "--lower",
        action="store_true",
        help="also print the largest known lower bound (shuffled 3-RR and binary RR, or the "
        "mechanism's own: k-RR, OUE and RAPPOR)",
    )
    amp.add_argument("--json", action="store_true", help="print a JSON object")
    amp.set_defaults(func=_amplify)

    comp = psub.add_parser("compose", help="k-fold composition of an (ε, δ) mechanism")
    comp.add_argument("--epsilon", type=float, required=True)
    comp.add_argument("--delta", type=float, default=0.0)
    comp.add_argument("--releases", type=int, help="number of releases composed (required)")
    comp.add_argument("--target-delta", type=float, default=1e-6)
    comp.add_argument("--method", default="optimal", choices=("basic", "advanced", "optimal"))
    comp.add_argument("--json", action="store_true")
    comp.set_defaults(func=_compose)

    rounds = psub.add_parser(
        "rounds", help="R shuffled rounds with fresh randomness: PLD vs per-round composition"
    )
    rounds.add_argument("--epsilon0", type=float, required=True)
    rounds.add_argument("--n", type=positive_count, required=True)
    rounds.add_argument("--rounds", type=int, required=True)
    rounds.add_argument("--delta", type=float, default=1e-6)
    rounds.add_argument("--json", action="store_true")
    rounds.set_defaults(func=_rounds)

    metric = psub.add_parser("metric", help="the privacy statement of a registry metric")
    metric.add_argument("--config", required=True, help="metric registry TOML")
    metric.add_argument("--metric", required=True)
    metric.add_argument("--n", type=positive_count, required=True, help="reports in the release")
    metric.add_argument("--rounds", type=int, default=1, help="releases from the same clients")
    metric.add_argument("--delta", type=float, default=1e-6)
    metric.add_argument(
        "--cohort-share", type=float, help="smallest cohort's share (default: estimated)"
    )
    metric.add_argument("--cohort-per-report", action="store_true")
    metric.add_argument(
        "--batch-sizes",
        help="comma-separated sizes of the shuffled batches (default: one batch of --n)",
    )
    metric.add_argument("--json", action="store_true")
    metric.set_defaults(func=_metric)

    ledger = psub.add_parser(
        "ledger",
        help="releases recorded in a JSON ledger file, each with the running total",
        description="Per release: window, rounds, crowd, its own ε, and the metric's total "
        "after it (heterogeneous composition; never decreasing). A missing file is an error.",
    )
    ledger.add_argument("file", nargs="?", metavar="FILE", help="the JSON ledger")
    ledger.add_argument("--file", dest="file_option", help=argparse.SUPPRESS)
    ledger.add_argument("--metric", help="one metric (default: every metric in the file)")
    ledger.add_argument("--json", action="store_true")
    ledger.set_defaults(func=_ledger)

    from crowdmix.histogram_cmd import register_privacy as register_histogram

    register_histogram(psub)  # shuffled histograms with fake reports

    plan = sub.add_parser("plan", help="RAPPOR parameters for a target central (ε, δ)")
    plan.add_argument("--epsilon", type=float, required=True, help="target central ε")
    plan.add_argument("--delta", type=float, default=1e-6)
    plan.add_argument(
        "--n", type=positive_count, required=True, help="expected reports per release"
    )
    plan.add_argument("--candidates", type=int, required=True, help="candidate values")
    plan.add_argument("--rounds", type=int, default=1, help="releases the target must cover")
    plan.add_argument("--cohorts", type=int, default=4)
    plan.add_argument("--max-local-epsilon", type=float, help="cap on ε_1 of one report")
    plan.add_argument("--max-epsilon-inf", type=float, help="cap on ε_∞ (PRR bound)")
    plan.add_argument(
        "--metric",
        default="my_metric",
        metavar="NAME",
        help="the metric's name in the registry block it prints (default my_metric)",
    )
    plan.add_argument("--json", action="store_true")
    plan.set_defaults(func=_plan)


def _usage(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def _rappor_args(p: argparse.ArgumentParser) -> None:
    add_rappor_options(p, k=16, m=None, f=0.5, p=0.5, q=0.75)


def _print(args: argparse.Namespace, out: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(out, indent=2, allow_nan=False))
    else:
        print(text)


def _up(x: float, digits: int = 4) -> str:
    """``x`` to ``digits`` significant digits, rounded up (a privacy figure is never
    printed smaller than it is)."""
    if x == 0.0 or not math.isfinite(x):
        return f"{x:g}"
    scale = 10.0 ** (digits - 1 - math.floor(math.log10(abs(x))))
    return f"{math.ceil(x * scale - 1e-9) / scale:.{digits}g}"


def _fail(exc: Exception) -> Exception:
    from crowdmix.cli import CliError

    return CliError(str(exc))


def _amplify(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.accounting.amplification import (
        VARIATION_RATIO_REFUSAL,
        amplify,
        best_amplification,
        shuffled_rr_lower_bound,
    )
    from crowdmix.aggregator.accounting.local import epsilon_one
    from crowdmix.client.errors import ParamsError
    from crowdmix.core.params import RapporParams

    try:
        if args.bound == "rappor" or args.beta is not None:
            raise ValueError(f"--bound rappor / --beta: {VARIATION_RATIO_REFUSAL}")
        randomizer = _randomizer(args)
        eps0 = args.epsilon0 if randomizer is None else randomizer.epsilon0
        if eps0 is None:
            params = RapporParams(k=args.k, h=args.hashes, f=args.f, p=args.p, q=args.q)
            eps0 = epsilon_one(params)
        candidates: dict[str, float] = {}
        if randomizer is None:
            result = amplify(eps0, args.n, args.delta, bound=args.bound)
        else:
            if args.bound != "generic":
                raise ValueError("--bound applies to --mechanism any only")
            best = best_amplification(eps0, args.n, args.delta, randomizer)
            result, candidates = best.result, best.candidates
        lowers: dict[str, float] = {}
        if args.lower:
            lowers = _lower_bounds(args, randomizer, eps0)
            if randomizer is None:
                lowers["krr3"] = shuffled_rr_lower_bound(eps0, args.n, args.delta)
                if args.n <= _BINARY_RR_MAX_N:  # summed over all n+1 counts
                    lowers["binary-rr"] = shuffled_rr_lower_bound(
                        eps0, args.n, args.delta, domain=2
                    )
        lower = max(lowers.values()) if lowers else None
    except (ValueError, ParamsError) as exc:
        raise _fail(exc) from None
    out = result.to_dict()
    if randomizer is not None:
        out["mechanism"] = randomizer.name
        out["candidates"] = candidates
    if lower is not None:
        out["rr_lower_bound"] = lower  # the largest of the known lower bounds
        out["lower_bounds"] = lowers
    what = "randomizer" if randomizer is None else randomizer.name
    text = (
        f"{args.n:,} shuffled reports of an ε0 = {eps0:.6g} {what}: "
        + (
            f"(ε = {result.epsilon:.6g}, δ = {result.delta:.3g}) by the {result.bound} bound"
            if result.amplified
            else f"no amplification (ε = ε0 = {eps0:.6g})"
        )
        + (
            f"\n  candidates: {', '.join(f'{k} {v:.6g}' for k, v in candidates.items())}"
            if candidates
            else ""
        )
        + (
            f"\n  {'randomized response' if randomizer is None else randomizer.name} "
            f"shuffled needs at least ε = {lower:.6g}"
            if lower
            else ""
        )
    )
    _print(args, out, text)
    return 0


def _randomizer(args: argparse.Namespace) -> Any:
    """The ``--mechanism`` as an accounting randomizer (None for ``any``)."""
    from crowdmix.aggregator.accounting.randomizers import randomizer_of
    from crowdmix.core.basic import BasicParams
    from crowdmix.core.params import RapporParams

    if args.mechanism == "any":
        if args.domain is not None:
            raise ValueError("--domain needs --mechanism krr, oue or olh")
        return None
    if args.mechanism == "rappor":
        if args.epsilon0 is not None or args.domain is not None:
            raise ValueError(
                "--mechanism rappor takes -k/--hashes/-f/-p/-q, not --epsilon0/--domain"
            )
        params = RapporParams(k=args.k, h=args.hashes, f=args.f, p=args.p, q=args.q)
        return randomizer_of(rappor=params)
    if args.epsilon0 is None:
        raise ValueError(f"--mechanism {args.mechanism} needs --epsilon0")
    domain = args.domain if args.domain is not None else 2
    if args.mechanism == "binary-rr" and domain != 2:
        raise ValueError(f"binary-rr has 2 values, got --domain {domain}")
    basic = BasicParams(mechanism=args.mechanism, epsilon=args.epsilon0, domain_size=domain)
    return randomizer_of(basic=basic)


def _lower_bounds(args: argparse.Namespace, randomizer: Any, eps0: float) -> dict[str, float]:
    """Mechanism-specific lower bounds (``lower_bounds``) for ``--lower``."""
    from crowdmix.aggregator.accounting.lower_bounds import bit_vector_lower, krr_lower
    from crowdmix.aggregator.accounting.randomizers import BitVector, KaryRR

    if isinstance(randomizer, KaryRR):
        return {f"{randomizer.domain}-rr": krr_lower(eps0, randomizer.domain, args.n, args.delta)}
    if isinstance(randomizer, BitVector) and randomizer.bits <= 2:
        found = bit_vector_lower(randomizer.p, randomizer.q, randomizer.bits, args.n, args.delta)
        return {f"bit-vector-{k}": v for k, v in found.items()}
    return {}


def _compose(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.accounting.composition import compose
    from crowdmix.cli import CliError

    releases = args.releases
    if releases is None:
        raise CliError("the following argument is required: --releases")
    if releases < 1:
        raise CliError(f"--releases must be a positive integer, got {releases}")
    try:
        eps, delta = compose(args.epsilon, args.delta, releases, args.target_delta, args.method)
    except ValueError as exc:
        raise _fail(exc) from None
    out = {
        "epsilon": eps,
        "delta": delta,
        "method": args.method,
        "releases": releases,
        "per_release": {"epsilon": args.epsilon, "delta": args.delta},
    }
    _print(
        args,
        out,
        f"{releases} × (ε={args.epsilon}, δ={args.delta}) → "
        f"(ε = {eps:.6g}, δ = {delta:.3g}) [{args.method}]",
    )
    return 0


def _rounds(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.accounting.amplification import amplify
    from crowdmix.aggregator.accounting.composition import compose_basic, compose_optimal
    from crowdmix.aggregator.accounting.pairs import ClonePair
    from crowdmix.aggregator.accounting.pld import pld_epsilon

    try:
        pld = pld_epsilon(ClonePair.stronger_clone(args.epsilon0), args.n, args.rounds, args.delta)
        per_delta = args.delta / (2.0 * args.rounds)
        per_round = amplify(args.epsilon0, args.n, per_delta).epsilon
        optimal = compose_optimal(per_round, per_delta, args.rounds, args.delta)
        basic = compose_basic(per_round, per_delta, args.rounds)[0]
    except ValueError as exc:
        raise _fail(exc) from None
    out = {
        "epsilon": pld,
        "delta": args.delta,
        "method": "pld",
        "per_round": {"epsilon": per_round, "delta": per_delta},
        "optimal_composition": optimal,
        "basic_composition": basic,
    }
    _print(
        args,
        out,
        f"{args.rounds} rounds of {args.n:,} shuffled ε0={args.epsilon0} reports, δ={args.delta}:"
        f"\n  PLD of the per-round pair: ε = {pld:.6g}"
        f"\n  optimal composition of per-round (ε={per_round:.4g}, δ={per_delta:.2g}): "
        f"ε = {optimal:.6g}\n  basic composition: ε = {basic:.6g}",
    )
    return 0


def _metric(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.accounting.statement import privacy_statement
    from crowdmix.client.errors import ParamsError
    from crowdmix.core.registry import load_registry

    try:
        batches = None
        if args.batch_sizes:
            try:
                batches = [int(b) for b in args.batch_sizes.split(",")]
            except ValueError:
                raise ValueError(
                    f"--batch-sizes must be comma-separated integers, got {args.batch_sizes!r}"
                ) from None
        registry = load_registry(args.config)
        metric = registry.get(args.metric)
        if metric is None:
            raise ValueError(f"metric {args.metric!r} is not in {args.config}")
        if metric.heavy_hitters is not None:
            raise ValueError(
                f"metric {args.metric!r} is a heavy-hitters metric: its statement comes with "
                "`crowdmix discover step` (each round's ε0 is planned from its target)"
            )
        # The question asked is "this release of --n reports": one batch unless told
        # otherwise; said below the statement, since the figure depends on it.
        assumed = batches is None
        if assumed:
            batches = [args.n]
        stmt: Any
        if metric.histogram is not None:  # both figures, at a device bound from --n reports
            from crowdmix.aggregator.accounting.histogram_release import histogram_release

            stmt = histogram_release(
                metric.name,
                metric.histogram,
                args.n,
                delta=args.delta,
                honest_fraction=metric.honest_fraction,
                rounds=args.rounds,
                batch_sizes=tuple(batches or ()) or None,
            )
        else:
            stmt = privacy_statement(
                metric,
                args.n,
                delta=args.delta,
                cohort_sizes=args.cohort_share,
                cohort_per_report=args.cohort_per_report,
                batch_sizes=batches,
                rounds=args.rounds,
            )
    except (ValueError, ParamsError) as exc:
        raise _fail(exc) from None
    out = stmt.to_dict()
    text = stmt.render()
    if assumed:
        out["assumed_batch_sizes"] = batches
        text += (
            f"\n(assumed: all {plural(args.n, 'report')} were shuffled in one batch; "
            "give --batch-sizes if they were not)"
        )
    _print(args, out, text)
    return 0


def _ledger(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.accounting.ledger import (
        TOTAL_ASSUMPTION,
        AccountingError,
        PrivacyLedger,
        Release,
    )
    from crowdmix.aggregator.accounting.ledger_stores import JsonFileLedgerStore
    from crowdmix.cli import CliError

    path = args.file or args.file_option
    if not path:
        raise CliError("privacy ledger needs FILE")
    if args.file and args.file_option:
        raise CliError("give the ledger FILE once")
    store = JsonFileLedgerStore(path, create=False)
    try:
        ledger = PrivacyLedger(store)
        names = [args.metric] if args.metric else store.metrics()
        shown = {name: ledger.running_totals(name) for name in names}
    except AccountingError as exc:
        raise _fail(exc) from None

    def crowd(r: Release) -> int | None:
        if r.segment is not None:
            return int(r.segment["n_amplify"])
        n = r.extra.get("n_amplify")
        return int(n) if isinstance(n, int) else None

    def metric_out(name: str) -> dict[str, Any]:
        rows = shown[name]
        total = rows[-1][1] if rows else (0.0, 0.0)
        return {
            "metric": name,
            "releases": [
                {
                    **r.to_dict(),
                    "crowd": crowd(r),
                    "running_total": {"epsilon": eps, "delta": delta},
                }
                for r, (eps, delta) in rows
            ],
            "cumulative": {"epsilon": total[0], "delta": total[1]},
            "notes": [TOTAL_ASSUMPTION],
        }

    if args.metric:
        out: dict[str, Any] = metric_out(args.metric)
    else:
        out = {"file": str(path), "metrics": {name: metric_out(name) for name in names}}
    lines: list[str] = []
    if not names:
        lines.append(f"{path}: no metric has a release yet")
    for name in names:
        rows = shown[name]
        lines.append(f"{name}: {plural(len(rows), 'release')}")
        width = max([7, *(len(r.release_id) for r, _ in rows)])
        if rows:
            lines.append(
                f"  {'release':<{width}} {'window':>8} {'rounds':>6} {'crowd':>10} "
                f"{'ε alone':>9} {'total ε':>9} {'total δ':>9}"
            )
        for r, (eps, delta) in rows:
            n = crowd(r)
            lines.append(
                f"  {r.release_id:<{width}} {r.window:>8} {r.rounds:>6} "
                f"{'?' if n is None else f'{n:,}':>10} {_up(r.epsilon):>9} {_up(eps):>9} "
                f"{_up(delta, 3):>9}"
            )
        total = rows[-1][1] if rows else (0.0, 0.0)
        lines.append(f"  total: (ε = {_up(total[0], 6)}, δ = {_up(total[1], 3)})")
        lines.append(f"  note: {TOTAL_ASSUMPTION}")
    _print(args, out, "\n".join(lines))
    return 0


def _plan(args: argparse.Namespace) -> int:
    from crowdmix.aggregator.accounting.planner import plan

    try:
        result = plan(
            args.epsilon,
            args.delta,
            args.n,
            args.candidates,
            rounds=args.rounds,
            cohorts=args.cohorts,
            max_local_epsilon=args.max_local_epsilon,
            max_epsilon_inf=args.max_epsilon_inf,
        )
    except ValueError as exc:
        raise _fail(exc) from None
    from crowdmix.core.registry import RegistryError, parse_registry

    p = result.params
    block = registry_block(args.metric, p)
    try:  # the block must load as it is printed (a name the registry refuses, say)
        parse_registry(tomllib.loads(block))
    except (RegistryError, tomllib.TOMLDecodeError) as exc:
        raise _fail(ValueError(f"--metric {args.metric!r}: {exc}")) from None
    out = result.to_dict()
    out["registry"] = block
    if not math.isfinite(result.epsilon_inf):
        out["epsilon_inf"] = None
    text = (
        f"For central ε ≤ {args.epsilon} (δ = {args.delta}) over "
        f"{plural(args.rounds, 'release')} of "
        f"~{args.n:,} reports and {args.candidates} candidates:\n"
        f"  k={p.k} h={p.h} m={p.m} f={p.f} p={p.p:.4f} q={p.q:.4f}\n"
        f"  local ε_1 = {result.epsilon_1:.4g}, ε_∞ = {result.epsilon_inf:.4g}\n"
        f"  central ε = {result.central_epsilon:.4g} per release ({result.central_bound}), "
        f"{result.longitudinal_epsilon:.4g} over all ({result.longitudinal_argument})\n"
        f"  std error of a frequency ≈ {result.std_error:.3g}; smallest detectable "
        f"frequency ≈ {result.detectable_frequency:.3g} "
        f"(α={result.alpha}, power {result.power}, Bonferroni over candidates)\n"
        "\nThe metric's entry for the registry (metrics.toml), exact values:\n\n" + block
    )
    _print(args, out, text.rstrip("\n"))
    return 0


def registry_block(name: str, params: Any) -> str:
    """A ``[metrics.NAME]`` table for the registry with exactly these RAPPOR params
    (floats written in full: a rounded p or q would be another mechanism)."""
    return (
        f"[metrics.{name}]\n"
        'encoding = "rappor"\n'
        'hashing = "mmh3"\n'
        f"k = {params.k}\n"
        f"h = {params.h}\n"
        f"m = {params.m}\n"
        f"f = {params.f!r}\n"
        f"p = {params.p!r}\n"
        f"q = {params.q!r}\n"
    )
