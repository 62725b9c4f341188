"""Baseline harness: pure-ldp's PEM, TreeHist and SFP on one data set at one local ε.

Not part of crowdmix and never imported by it: pure-ldp 1.2.0 needs numpy<2 and
xxhash<3, so ``bench/heavy_hitters.py --baselines`` runs this file in its own
virtual environment under /tmp (``VENV_PINS``), one method per process:

    python heavy_hitters_baselines.py DATA.json METHOD EPSILON

DATA.json holds {"values": [...], "truth": [...]}: one value per device and
the true top-k. The library's own setup (Apple's count-mean sketch, k = 128,
m = 1024), one character per round, "*" as an alphabet end symbol, top-k search
for all three; TreeHist pads with "#"; SFP's server gets one patch (a set copy
of its alphabet). Why each: bench/README.md. Prints one JSON line.
"""

from __future__ import annotations

import json
import string
import sys
import time

VENV_PINS = [
    "pure-ldp==1.2.0",
    "numpy<2",
    "xxhash<3",
    "scipy<1.14",
    "scikit-learn<1.6",
    "statsmodels<0.15",
    "pandas<2.3",
    "matplotlib<3.10",
    "bitstring",
]


def main() -> None:
    path, method, epsilon = sys.argv[1], sys.argv[2], float(sys.argv[3])
    from pure_ldp.core.fo_creator import create_fo_client_instance, create_fo_server_instance
    from pure_ldp.core.hh_creator import create_hh_client_instance, create_hh_server_instance

    with open(path) as f:
        data = json.load(f)
    values, truth = data["values"], set(data["truth"])
    alphabet = sorted(set(data.get("alphabet", string.ascii_lowercase)))
    cms = {"m": 1024, "k": 128, "epsilon": epsilon}
    server_fo = create_fo_server_instance("cms", dict(cms))
    client_fo = create_fo_client_instance("cms", dict(cms, hash_funcs=server_fo.get_hash_funcs()))
    params = {
        "epsilon": epsilon,
        "max_string_length": 17,
        "fragment_length": 1,
        "start_length": 1,
        "alphabet": [*alphabet, "*"],
        "index_mapper": lambda x: x,
        "padding_char": "#" if method == "TreeHist" else "*",
    }
    client = create_hh_client_instance(method, dict(params, fo_client=client_fo))
    server = create_hh_server_instance(method, dict(params, fo_server=server_fo))
    if method == "SFP":
        server.alphabet = set(server.alphabet)  # pure-ldp 1.2.0 bug: find_heavy_hitters calls .add
    t0 = time.time()
    for v in values:
        server.aggregate(
            client.privatise(v[:16].ljust(17, "*") if method == "TreeHist" else v[:16])
        )
    t1 = time.time()
    k = len(truth)
    found, _ = server.find_heavy_hitters(k=k)
    t2 = time.time()
    clean = {v.split("*")[0].split("#")[0] for v in found}
    hit = len(clean & truth)
    print(
        json.dumps(
            {
                "method": method,
                "epsilon": epsilon,
                "n": len(values),
                "recall": hit / len(truth),
                "precision": hit / len(clean) if clean else 0.0,
                "aggregate_s": round(t1 - t0, 1),
                "find_s": round(t2 - t1, 1),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
