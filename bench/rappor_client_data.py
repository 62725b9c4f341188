"""Decoding cases encoded by google/rappor's own Python client, with its R decoder's answers.

    .venv/bin/python bench/rappor_client_data.py --rappor PATH --out DIR [--split SPLIT|all]

PATH is a google/rappor checkout (or its bare git directory, exported to a temp
directory). Not run by CI: it encodes ~10^6 reports per case in google/rappor's
Python client (~25 µs each) and needs R (``apt-get install r-base-core
r-cran-glmnet r-cran-quadprog r-cran-matrix r-cran-jsonlite``) for the reference; ``--no-r``
skips it. Every case is seeded; rerunning writes the same files.

For each case, DIR/<split>/<case>-s<seed>/ holds google/rappor's three analysis
files (``params.csv``, ``counts.csv``, ``map.csv``), the truth (``truth.csv``:
value,count) and the reference's answer (``r_results.csv`` and ``r_metrics.json``).

How (google/rappor's ``regtest.sh`` pipeline, with its client code imported from
PATH at run time, never copied): true values as ``tests/gen_true_values.R`` draws
them (a multinomial partition, shuffled; client i in cohort i mod m); each report
by ``rappor.Encoder(params, cohort, secret, irr_rand).encode(value)`` as
``tests/rappor_sim.py`` does; counts summed per cohort as ``bin/sum_bits.py`` and
the map as ``bin/hash_candidates.py`` (``rappor.get_bloom_bits``) write them; then
``Decode()`` of ``analysis/R/decode.R`` via bench/rappor_reference_decode.R.

Python 3 shims (rappor.py is Python 2 code; only these, set on the imported module):
``xrange = range``; ``ord`` also accepts an int (a ``bytes`` item is one); values and
secrets are passed as ``bytes``. The instantaneous response's bits come from a seeded
numpy Generator (Bernoulli(p) and Bernoulli(q) per bit, as ``SecureIrrRand``) so that
a case can be regenerated; the permanent response is the client's own HMAC-SHA256.
"""

from __future__ import annotations

import argparse
import builtins
import csv
import importlib.util
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

HERE = Path(__file__).resolve().parent
MISSING = re.compile(r"v[0-9]*9$")  # regtest_spec.py's '10%' map: every 10th value is no candidate


@dataclass(frozen=True)
class Case:
    distribution: str
    values: int
    clients: int
    reports_per_client: int
    k: int
    h: int
    m: int
    p: float
    q: float
    f: float
    extra: int  # candidates that are no value, v<values+1>.. (regtest.sh more-candidates)
    drop: bool  # leave the values matching /v[0-9]*9$/ out of the candidates


def _grid() -> dict[str, Case]:
    """google/rappor tests/regtest_spec.py, distribution size "small" (100 values, 10^6 clients)."""
    configs = {
        "typical": (0.39, 0.61, 0.45, 20, True),
        "sharp": (0.39, 0.61, 0.45, 0, False),
        "loose": (0.225, 0.775, 0.0, 20, True),
        "over_x2": (0.39, 0.61, 0.45, 200, True),
        "over_x10": (0.39, 0.61, 0.45, 1000, True),
    }
    out = {}
    for d in ("unif", "exp", "gauss", "zipf1", "zipf1.5"):
        for name, (p, q, f, extra, drop) in configs.items():
            out[f"grid-{d}-{name}"] = Case(d, 100, 1_000_000, 1, 8, 2, 128, p, q, f, extra, drop)
    return out


GRID = _grid()
#: The case types, on every split.
TYPES = {
    # exponential over 100 values at rappor.Params()'s defaults (k=16, h=2, m=64, p=.5, q=.75, f=.5)
    "exp-defaults": Case("exp", 100, 1_000_000, 1, 16, 2, 64, 0.5, 0.75, 0.5, 20, True),
    # a flat (Gaussian) distribution over 1,000 values: 900 of them + 100 others = 1,000 candidates
    "gauss1000": Case("gauss", 1000, 1_000_000, 1, 32, 2, 64, 0.25, 0.75, 0.5, 100, True),
    # Zipf(1) over 200 values, 1,000 candidates for m·k = 512 equations
    "zipf-overcomplete": Case("zipf1", 200, 1_000_000, 1, 16, 2, 32, 0.25, 0.75, 0.5, 820, True),
    # regtest_spec.py DEMO demo5: Zipf(1.5), 10^5 clients × 10 reports, k=32 h=1 m=64
    "zipf1.5-demo": Case("zipf1.5", 100, 100_000, 10, 32, 1, 64, 0.25, 0.75, 0.5, 100, True),
}
#: Case types of the held-out splits only (the fresh one and the spent ones, see SEEDS).
HELD_OUT_TYPES = {
    # flat over 500 values, 600 candidates for 512 equations
    "unif-overcomplete": Case("unif", 500, 1_000_000, 1, 16, 2, 32, 0.25, 0.75, 0.5, 150, True),
    # Zipf(1) over 1,000 values at rappor.Params()'s defaults
    "zipf1-defaults": Case("zipf1", 1000, 1_000_000, 1, 16, 2, 64, 0.5, 0.75, 0.5, 100, True),
    # exponential with few reports: 10^5 clients, m=16
    "exp-n1e5": Case("exp", 100, 100_000, 1, 16, 2, 16, 0.25, 0.75, 0.5, 20, True),
}
#: Seed bases: no two splits meet (nor bench/accuracy.py's seeds). A held-out split is read
#: once; the next one takes fresh seeds, and the one read becomes development data ("spent").
SEEDS = {"dev": 5_100_000, "spent1": 5_200_000, "spent2": 5_300_000, "held-out": 5_400_000}
#: Splits with the held-out case types: the held-out one and those already read.
HELD_OUT_SPLITS = ("spent1", "spent2", "held-out")


def split_of(case_dir: str) -> str | None:
    """The split whose seeds made a case directory (<case>-s<seed>)."""
    seed = int(case_dir.rsplit("-s", 1)[1])
    return next((s for s, base in SEEDS.items() if base <= seed < base + 100_000), None)


def cases_of(split: str, reps: int, grid_reps: int) -> list[tuple[str, Case, int]]:
    """(name, case, seed) of a split; the held-out splits add the held-out case types."""
    types = dict(TYPES)
    if split in HELD_OUT_SPLITS:
        types |= HELD_OUT_TYPES
    base = SEEDS[split]
    out = []
    for rep in range(grid_reps):
        for i, (name, case) in enumerate(GRID.items()):
            out.append((name, case, base + 1000 * rep + i))
    for rep in range(reps):
        for i, (name, case) in enumerate(types.items()):
            out.append((name, case, base + 1000 * rep + 100 + i))
    return out


def pdf(distr: str, n: int) -> np.ndarray:
    """google/rappor tests/gen_counts.R ComputePdf."""
    x = np.arange(1, n + 1, dtype=np.float64)
    if distr == "unif":
        w = np.ones(n)
    elif distr == "exp":
        w = np.exp(-(5 / n) * x)
    elif distr == "gauss":
        w = np.exp(-0.5 * (np.arange(-n / 2 + 1, n / 2 + 1) / (n / 6)) ** 2)
    elif distr.startswith("zipf"):
        w = 1 / x ** float(distr[4:])
    else:
        raise ValueError(distr)
    return w / w.sum()


def load_client(root: Path) -> ModuleType:
    """google/rappor's client/python/rappor.py, imported from the checkout, with the shims."""
    path = root / "client" / "python" / "rappor.py"
    spec = importlib.util.spec_from_file_location("google_rappor_client", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.xrange = range  # type: ignore[attr-defined]
    module.ord = lambda c: c if isinstance(c, int) else builtins.ord(c)  # type: ignore[attr-defined]
    return module


class SeededIrr:
    """The client's ``irr_rand`` interface (``p_gen()``/``q_gen()``: ints whose bits are
    Bernoulli(p)/Bernoulli(q)), drawn from a seeded Generator in blocks."""

    def __init__(self, k: int, p: float, q: float, rng: np.random.Generator) -> None:
        self.p_gen = self._stream(k, p, rng).__next__
        self.q_gen = self._stream(k, q, rng).__next__

    @staticmethod
    def _stream(k: int, prob: float, rng: np.random.Generator) -> Iterator[int]:
        weights = (1 << np.arange(k, dtype=np.uint64)).astype(np.uint64)
        while True:
            block = (rng.random((65_536, k)) < prob).astype(np.uint64) @ weights
            yield from (int(v) for v in block)


def true_values(case: Case, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(value index per report, cohort per report), as gen_true_values.R makes them."""
    n = case.clients * case.reports_per_client
    partition = rng.multinomial(n, pdf(case.distribution, case.values))
    value_idx = rng.permutation(np.repeat(np.arange(case.values), partition))
    client = np.repeat(np.arange(1, case.clients + 1), case.reports_per_client)
    return value_idx, client % case.m


def generate(rappor: ModuleType, case: Case, seed: int, out: Path) -> float:
    """Write params/counts/map/truth for one case; the seconds the client took."""
    rng = np.random.default_rng(seed)
    params = rappor.Params()
    params.num_bloombits, params.num_hashes, params.num_cohorts = case.k, case.h, case.m
    params.prob_p, params.prob_q, params.prob_f = case.p, case.q, case.f
    irr = SeededIrr(case.k, case.p, case.q, rng)
    value_idx, cohorts = true_values(case, rng)
    names = [f"v{i}".encode() for i in range(1, case.values + 1)]
    clients = np.repeat(np.arange(1, case.clients + 1), case.reports_per_client)
    sums = np.zeros((case.m, case.k), dtype=np.int64)
    totals = np.bincount(cohorts, minlength=case.m)
    bit_of = [(1 << b, b) for b in range(case.k)]
    per_cohort: list[list[int]] = [[] for _ in range(case.m)]
    started = time.perf_counter()
    for v, c, client in zip(value_idx.tolist(), cohorts.tolist(), clients.tolist(), strict=True):
        secret = f"c{client}-{seed}".encode()  # rappor_sim.py uses the client's name
        per_cohort[c].append(rappor.Encoder(params, c, secret, irr).encode(names[v]))
    seconds = time.perf_counter() - started
    for c, irrs in enumerate(per_cohort):  # sum_bits.py: bit i of the IRR adds to column i
        arr = np.array(irrs, dtype=np.uint64)
        for mask, b in bit_of:
            sums[c, b] = int(np.count_nonzero(arr & np.uint64(mask)))
    out.mkdir(parents=True, exist_ok=True)
    with (out / "params.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["k", "h", "m", "p", "q", "f"])
        w.writerow([case.k, case.h, case.m, case.p, case.q, case.f])
    with (out / "counts.csv").open("w", newline="") as fh:
        csv.writer(fh).writerows([int(totals[c]), *sums[c].tolist()] for c in range(case.m))
    candidates = [n.decode() for n in names if not (case.drop and MISSING.search(n.decode()))] + [
        f"v{i}" for i in range(case.values + 1, case.values + case.extra + 1)
    ]
    with (out / "map.csv").open("w", newline="") as fh:  # hash_candidates.py's rows
        w = csv.writer(fh)
        for word in candidates:
            row: list[object] = [word]
            for cohort in range(case.m):
                bits = rappor.get_bloom_bits(word.encode(), cohort, case.h, case.k)
                row.extend(cohort * case.k + b + 1 for b in bits)
            w.writerow(row)
    counts = np.bincount(value_idx, minlength=case.values)
    with (out / "truth.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["value", "count"])
        w.writerows((f"v{i + 1}", int(n)) for i, n in enumerate(counts) if n > 0)
    (out / "case.json").write_text(
        json.dumps({"case": case.__dict__, "seed": seed, "client_seconds": seconds}, indent=1)
    )
    return seconds


def checkout(path: Path, tmp: Path) -> Path:
    """A work tree of google/rappor: PATH itself, or HEAD of a bare git directory exported."""
    if (path / "client" / "python" / "rappor.py").exists():
        return path
    archive = tmp / "rappor.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "--git-dir", str(path), "archive", "HEAD"], stdout=fh, check=True)
    root = tmp / "rappor"
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="data")
    return root


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rappor", type=Path, required=True, help="google/rappor checkout or git dir")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--split", choices=(*SEEDS, "all"), default="all")
    ap.add_argument("--reps", type=int, default=2, help="seeds per case type (2)")
    ap.add_argument(
        "--grid-reps",
        type=int,
        help="seeds per grid case (default: 1 for dev, 0 for the splits of case types)",
    )
    ap.add_argument("--only", help="regex: only cases whose name matches")
    ap.add_argument("--no-r", action="store_true", help="skip google/rappor's R decoder")
    ap.add_argument("--force", action="store_true", help="regenerate cases already written")
    args = ap.parse_args()
    splits = tuple(SEEDS) if args.split == "all" else (args.split,)
    with tempfile.TemporaryDirectory() as tmp:
        root = checkout(args.rappor.resolve(), Path(tmp))
        rappor = load_client(root)
        todo: list[Path] = []
        for split in splits:
            grid_reps = args.grid_reps if args.grid_reps is not None else int(split == "dev")
            for name, case, seed in cases_of(split, args.reps, grid_reps):
                if args.only and not re.search(args.only, name):
                    continue
                out = args.out / split / f"{name}-s{seed}"
                todo.append(out)
                if (out / "truth.csv").exists() and not args.force:
                    continue
                sec = generate(rappor, case, seed, out)
                print(f"{split:8} {out.name:40} client {sec:6.1f} s", flush=True)
        if not args.no_r:
            script = HERE / "rappor_reference_decode.R"
            pending = [str(d) for d in todo if args.force or not (d / "r_metrics.json").exists()]
            if pending:
                subprocess.run(["Rscript", str(script), str(root), *pending], check=True)


if __name__ == "__main__":
    sys.exit(main())
