"""``crowdmix info``: the local privacy of a RAPPOR parameter set (no extras needed)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from crowdmix.options import add_rappor_options, rappor_params

__all__ = ["register"]


def register(sub: Any) -> None:
    p = sub.add_parser("info", help="local privacy of RAPPOR params (ε_1 per report, ε_∞ bound)")
    add_rappor_options(p, k=16, m=64, f=0.5, p=0.5, q=0.75)
    p.add_argument("--json", action="store_true", help="print a JSON object")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from crowdmix.client import epsilon_inf, epsilon_one
    from crowdmix.core.privacy import p_star, q_star

    params = rappor_params(args)
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
