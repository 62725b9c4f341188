"""``crowdmix info``: the local privacy of a RAPPOR parameter set (no extras needed)."""

from __future__ import annotations

import argparse
import json
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("info", help="local privacy of RAPPOR params (ε_1 per report, ε_∞ bound)")
    p.add_argument("-k", type=int, default=16, help="Bloom filter bits (default 16)")
    p.add_argument("--hashes", type=int, default=2, help="hash functions h (default 2)")
    p.add_argument("--cohorts", type=int, default=64, help="cohorts m (default 64)")
    p.add_argument("-f", type=float, default=0.5, help="PRR noise f (default 0.5)")
    p.add_argument("-p", type=float, default=0.5, help="IRR P(1|0) (default 0.5)")
    p.add_argument("-q", type=float, default=0.75, help="IRR P(1|1) (default 0.75)")
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from client import RapporParams, epsilon_inf, epsilon_one
    from client.errors import ParamsError
    from client.privacy import p_star, q_star
    from crowdmix.cli import CliError

    try:
        params = RapporParams(k=args.k, h=args.hashes, m=args.cohorts, f=args.f, p=args.p, q=args.q)
    except ParamsError as exc:
        raise CliError(str(exc)) from None
    out = {
        "params": {
            "k": params.k,
            "h": params.h,
            "m": params.m,
            "f": params.f,
            "p": params.p,
            "q": params.q,
        },
        "p_star": p_star(params),
        "q_star": q_star(params),
        "epsilon_1": epsilon_one(params),
        "epsilon_inf": epsilon_inf(params),
        "fingerprint": f"{params.fingerprint():016x}",
    }
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"RAPPOR k={params.k} h={params.h} m={params.m} f={params.f} p={params.p} q={params.q}"
        )
        print(f"  p* = {out['p_star']:.6f}   q* = {out['q_star']:.6f}")
        print(f"  one report:              ε_1 = {out['epsilon_1']:.6f}")
        print(f"  any number of reports:   ε_∞ = {out['epsilon_inf']:.6f}  (memoised PRR)")
    return 0
