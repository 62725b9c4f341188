"""crowdmix's decoder against google/rappor's R decoder on reports from google/rappor's client.

    .venv/bin/python bench/accuracy_rappor_client.py --data DIR [--split SPLIT|development|all]

DIR is what bench/rappor_client_data.py wrote. Each case is decoded from its
google/rappor files exactly as ``crowdmix report --rappor-counts/--rappor-map/
--rappor-params`` reads them, with ``DecodeOptions()`` (or the knobs given), and
scored against the truth together with the reference's answer on the same files
(r_results.csv). Scores per case type (grid cases: per configuration, summed
over the five distributions):

- FP / FN: detected values that no report holds / values some report holds that
  were not detected (counts, summed over the type's cases);
- TV: ½·L1 between the true shares and an answer (missing = 0) — "TV list" scores
  the detected list, "TV dist" the ``distribution`` column (every candidate); the
  reference has one answer, its detected list;
- coverage: detected true values inside their 95% interval; mass: the detected
  list's total; decode seconds (the files already read, as the reference is timed).

Cases made with ``--no-r`` have no r_results.csv: the reference's FP per type and FN
per split are then those recorded in rappor_reference_recorded.json (bench/README.md's
table), and the targets are checked against them.

Development splits choose knobs (dev, and the spent held-out splits, already
read); the held-out split is read once to report (rappor_client_data.py says
which seeds each split takes); a case is scored only in the split of its seed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path

import numpy as np
import sklearn.linear_model  # noqa: F401  # imported once here: decode times exclude the import

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from crowdmix.aggregator.decode import DecodeOptions, DecodeWarning, decode_rappor
from crowdmix.aggregator.report.rappor_files import (
    read_counts_csv,
    read_map_csv,
    read_params_csv,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rappor_client_data import SEEDS, split_of

Score = dict[str, float]
#: google/rappor's FP and FN per split and case type, as recorded when R last ran on them.
RECORDED = json.loads(
    (Path(__file__).resolve().parent / "rappor_reference_recorded.json").read_text()
)


def _truth(path: Path) -> dict[str, int]:
    with path.open(newline="") as fh:
        return {row["value"]: int(row["count"]) for row in csv.DictReader(fh)}


def _tv(true: dict[str, int], est: dict[str, float], n: int) -> float:
    union = set(true) | set(est)
    return 0.5 * sum(abs(true.get(v, 0) / n - est.get(v, 0.0)) for v in union)


def score_case(case_dir: Path, options: DecodeOptions) -> tuple[Score, Score]:
    """(crowdmix's scores, the reference's) for one case directory."""
    params = read_params_csv(case_dir / "params.csv")
    totals, ones = read_counts_csv(case_dir / "counts.csv", params)
    values, design = read_map_csv(case_dir / "map.csv", params)
    true = _truth(case_dir / "truth.csv")
    n = sum(true.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DecodeWarning)
        t0, c0 = time.perf_counter(), time.process_time()
        res = decode_rappor(totals, ones, params, design, values, options)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    detected = {v for v, s in zip(res.values, res.significant, strict=True) if s}
    listed = {
        v: float(x)
        for v, x, s in zip(res.values, res.proportion, res.significant, strict=True)
        if s
    }
    assert res.distribution is not None and res.distribution_low is not None
    assert res.distribution_high is not None
    dist = dict(zip(res.values, res.distribution.tolist(), strict=True))
    cov_hits = cov_total = dcov_hits = dcov_total = 0
    for i, v in enumerate(res.values):
        if v not in true:
            continue
        share = true[v] / n
        dcov_total += 1
        dcov_hits += bool(res.distribution_low[i] <= share <= res.distribution_high[i])
        if res.significant[i]:
            cov_total += 1
            cov_hits += bool(res.ci_low[i] <= share <= res.ci_high[i])
    ours = {
        "fp": len(detected - set(true)),
        "fn": len(set(true) - detected),
        "detected": len(detected),
        "tv_list": _tv(true, listed, n),
        "tv_dist": _tv(true, dist, n),
        "mass": sum(listed.values()),
        "dist_mass": float(res.distribution.sum()),
        "cov_hits": cov_hits,
        "cov_total": cov_total,
        "dcov_hits": dcov_hits,
        "dcov_total": dcov_total,
        "seconds": seconds,
        "cpu": cpu,
    }
    ref: Score = {}
    if (case_dir / "r_results.csv").exists():
        with (case_dir / "r_results.csv").open(newline="") as fh:
            rows = list(csv.DictReader(fh))
        r_est = {r["string"]: float(r["proportion"]) for r in rows}
        r_cov = [
            float(r["prop_low_95"]) <= true[r["string"]] / n <= float(r["prop_high_95"])
            for r in rows
            if r["string"] in true
        ]
        metrics = json.loads((case_dir / "r_metrics.json").read_text())
        ref = {
            "fp": len(set(r_est) - set(true)),
            "fn": len(set(true) - set(r_est)),
            "detected": len(r_est),
            "tv_list": _tv(true, r_est, n),
            "mass": sum(r_est.values()),
            "cov_hits": sum(r_cov),
            "cov_total": len(r_cov),
            "seconds": float(metrics["seconds"]),
        }
    return ours, ref


def case_type(name: str) -> str:
    """grid-<distribution>-<config>-s<seed> → grid:<config>; <type>-s<seed> → <type>."""
    base = re.sub(r"-s\d+$", "", name)
    if base.startswith("grid-"):
        return "grid:" + base.rsplit("-", 1)[1]
    return base


def summarise(label: str, rows: list[tuple[str, Score, Score]]) -> dict[str, object]:
    by_type: dict[str, list[tuple[Score, Score]]] = defaultdict(list)
    for name, ours, ref in rows:
        by_type[case_type(name)].append((ours, ref))
    print(f"\n{label}: {len(rows)} cases")
    head = (
        f"{'case type':22} {'n':>3} | {'FP':>4} {'FN':>5} {'TVlist':>7} {'TVdist':>7} "
        f"{'mass':>5} {'dmass':>5} {'cov':>9} {'sec':>6} | {'rFP':>4} {'rFN':>5} {'rTV':>7} "
        f"{'rmass':>5} {'rcov':>9} {'rsec':>5} | {'TV/rTV':>6}"
    )
    print(head)
    fails = []
    summary: dict[str, object] = {}
    all_ours = [o for _, o, _ in rows]
    all_ref = [r for _, _, r in rows if r]
    for t in sorted(by_type):
        pairs = by_type[t]
        o = [p[0] for p in pairs]
        r = [p[1] for p in pairs if p[1]]

        def tot(xs: list[Score], key: str) -> float:
            return float(sum(x[key] for x in xs))

        def mean(xs: list[Score], key: str) -> float:
            return float(np.mean([x[key] for x in xs])) if xs else float("nan")

        line = (
            f"{t:22} {len(o):3d} | {tot(o, 'fp'):4.0f} {tot(o, 'fn'):5.0f} "
            f"{mean(o, 'tv_list'):7.4f} {mean(o, 'tv_dist'):7.4f} {mean(o, 'mass'):5.3f} "
            f"{mean(o, 'dist_mass'):5.3f} "
            f"{int(tot(o, 'cov_hits'))}/{int(tot(o, 'cov_total')):<5d}".rjust(0)
            + f" {max(x['seconds'] for x in o):6.3f} | "
        )
        if r:
            ratio = mean(o, "tv_dist") / max(mean(r, "tv_list"), 1e-12)
            line += (
                f"{tot(r, 'fp'):4.0f} {tot(r, 'fn'):5.0f} {mean(r, 'tv_list'):7.4f} "
                f"{mean(r, 'mass'):5.3f} {int(tot(r, 'cov_hits'))}/{int(tot(r, 'cov_total')):<5d}"
                f" {mean(r, 'seconds'):5.2f} | {ratio:6.3f}"
            )
            if tot(o, "fp") > tot(r, "fp"):
                fails.append(f"FP on {t}: {tot(o, 'fp'):.0f} > {tot(r, 'fp'):.0f}")
        print(line)
        summary[t] = {"ours": o, "ref": r}
    cov_h = sum(x["cov_hits"] for x in all_ours)
    cov_t = sum(x["cov_total"] for x in all_ours)
    dcov_h = sum(x["dcov_hits"] for x in all_ours)
    dcov_t = sum(x["dcov_total"] for x in all_ours)
    tv_d = float(np.mean([x["tv_dist"] for x in all_ours]))
    tv_l = float(np.mean([x["tv_list"] for x in all_ours]))
    print(
        f"  ours: FP {sum(x['fp'] for x in all_ours):.0f}  FN {sum(x['fn'] for x in all_ours):.0f}"
        f"  TV dist {tv_d:.4f}  TV list {tv_l:.4f}  CI cover {100 * cov_h / max(1, cov_t):.2f}%"
        f"  dist cover {100 * dcov_h / max(1, dcov_t):.2f}%"
        f"  decode mean {np.mean([x['seconds'] for x in all_ours]):.3f} s"
        f" max {max(x['seconds'] for x in all_ours):.3f} s"
        f" (CPU mean {np.mean([x['cpu'] for x in all_ours]):.3f} s"
        f" max {max(x['cpu'] for x in all_ours):.3f} s)"
    )
    recorded = RECORDED.get(label)
    if not all_ref and recorded is not None:
        ofn = sum(x["fn"] for x in all_ours)
        for t in sorted(by_type):
            ref_fp = recorded["types"].get(t, {}).get("fp")
            ours_fp = sum(p[0]["fp"] for p in by_type[t])
            if ref_fp is not None and ours_fp > ref_fp:
                fails.append(f"FP on {t}: {ours_fp:.0f} > {ref_fp}")
        rfn = recorded["fn_all"]
        print(
            "  reference as recorded (no r_results.csv): FP per type "
            + ", ".join(f"{t} {v['fp']}" for t, v in sorted(recorded["types"].items()))
            + f"; FN {rfn}"
        )
        print(
            f"  targets: FN {ofn} vs {rfn} recorded ({100 * (ofn / rfn - 1):+.1f} %,"
            f" {'met' if ofn <= rfn else 'NOT met'});"
            f" FP per type ({'met' if not fails else 'NOT met: ' + '; '.join(fails)});"
            f" CI cover ({'met' if cov_h >= 0.93 * cov_t else 'NOT met'})"
        )
    if all_ref:
        rtv = float(np.mean([x["tv_list"] for x in all_ref]))
        rfn = sum(x["fn"] for x in all_ref)
        ofn = sum(x["fn"] for x in all_ours)
        rc = sum(x["cov_hits"] for x in all_ref) / max(1, sum(x["cov_total"] for x in all_ref))
        print(
            f"  ref:  FP {sum(x['fp'] for x in all_ref):.0f}  FN {rfn:.0f}  TV {rtv:.4f}"
            f"  CI cover {100 * rc:.2f}%  decode mean "
            f"{np.mean([x['seconds'] for x in all_ref]):.2f} s"
        )
        print(
            f"  targets: TV dist {tv_d / rtv:.3f}x ref"
            f" (<= 0.85: {'met' if tv_d <= 0.85 * rtv else 'NOT met'});"
            f" FN {ofn} vs {rfn} ({'met' if ofn <= rfn else 'NOT met'});"
            f" FP per type ({'met' if not fails else 'NOT met: ' + '; '.join(fails)});"
            f" CI cover ({'met' if cov_h >= 0.93 * cov_t else 'NOT met'})"
        )
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument(
        "--split",
        choices=(*SEEDS, "development", "all"),
        default="development",
        help="a split, development (every split but held-out) or all",
    )
    ap.add_argument("--only", help="regex on case directory names")
    ap.add_argument("--cases", action="store_true", help="print every case")
    d = DecodeOptions()
    ap.add_argument("--correction", default=d.correction, choices=("bonferroni", "bh", "none"))
    ap.add_argument("--alpha", type=float, default=d.alpha)
    ap.add_argument("--interval", default=d.interval, choices=("selective", "wald"))
    ap.add_argument(
        "--set", action="append", default=[], metavar="FIELD=VALUE", help="other DecodeOptions"
    )
    args = ap.parse_args()
    extra: dict[str, object] = {}
    for item in args.set:
        key, _, text = item.partition("=")
        current = getattr(d, key)
        extra[key] = (
            text == "true" if isinstance(current, bool) else type(current)(text)  # type: ignore[call-arg]
        )
    options = DecodeOptions(
        alpha=args.alpha, correction=args.correction, interval=args.interval, **extra
    )
    print(f"decoder options: {options}")
    print(
        f"load average at start: {os.getloadavg()[0]:.1f} (2 cores; decode times are wall and CPU)"
    )
    splits = {
        "all": tuple(SEEDS),
        "development": tuple(s for s in SEEDS if s != "held-out"),
    }.get(args.split, (args.split,))
    for split in splits:
        rows = []
        for case_dir in sorted((args.data / split).glob("*")):
            if not (case_dir / "truth.csv").exists() or split_of(case_dir.name) != split:
                continue  # also: cases of a held-out split already read (spent seeds)
            if args.only and not re.search(args.only, case_dir.name):
                continue
            ours, ref = score_case(case_dir, options)
            rows.append((case_dir.name, ours, ref))
            if args.cases:
                print(
                    f"  {case_dir.name:40} det {ours['detected']:4.0f} FP {ours['fp']:3.0f} "
                    f"FN {ours['fn']:4.0f} TVl {ours['tv_list']:.3f} TVd {ours['tv_dist']:.3f}"
                    + (
                        f" | ref det {ref['detected']:4.0f} FP {ref['fp']:3.0f} FN {ref['fn']:4.0f}"
                        f" TV {ref['tv_list']:.3f}"
                        if ref
                        else ""
                    ),
                    flush=True,
                )
        if rows:
            summarise(split, rows)
    print(f"load average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
