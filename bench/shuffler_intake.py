"""The shuffler's CPU per request without gRPC or a store: parse → admit → prepare.

    .venv/bin/python bench/shuffler_intake.py [--other DIR] [--rounds 5] [--seconds 2]

What a Submit costs the shuffler's own code (``request_to_columns``, ``Intake.admit``:
window rule, registry checks, limits; ``GroupCommitter.prepare``: the store write's
blob) for the payloads of bench/shuffler_load.py: one report per request (device
style) and 1000-report columns (bulk). CPU time (``time.process_time``), so a
loaded box slows both sides alike. ``--other DIR``: a checkout of another commit
(``git archive <commit> | tar -x -C DIR``), measured in a subprocess of its own with
``PYTHONPATH=DIR``, in alternating rounds with this tree; prints each side's µs per
request and the ratio this / other per round and its median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def measure(tree: Path, seconds: float) -> dict[str, float]:
    """µs of CPU per request in this process, with ``tree``'s code on the path."""
    sys.path.insert(0, str(tree / "bench"))
    sys.path.insert(0, str(tree))
    import tomllib

    from shuffler_load import METRIC, REGISTRY  # type: ignore[import-not-found]
    from shuffler_loadgen import build_payload  # type: ignore[import-not-found]

    from crowdmix.core.registry import parse_registry
    from crowdmix.protos import crowdmix_pb2 as pb
    from crowdmix.shuffler.commit import GroupCommitter
    from crowdmix.shuffler.intake import Intake
    from crowdmix.shuffler.memory_store import MemoryStore
    from crowdmix.shuffler.serde import request_to_columns

    registry = parse_registry(tomllib.loads(REGISTRY))
    m = registry[METRIC]
    intake = Intake(registry, max_buffered_reports=1 << 62)
    committer = GroupCommitter(MemoryStore(), registry)
    out = {}
    for name, per_request in (("unary", 1), ("bulk", 1000)):
        raw = build_payload(METRIC, m.fingerprint, m.report_bytes, 64, per_request, seed=1)
        n, t0 = 0, time.process_time()
        while time.process_time() - t0 < seconds:
            for _ in range(50):
                request = pb.SubmitRequest.FromString(raw)
                chunks, _count = intake.admit(request_to_columns(request), connection="")
                committer.prepare([chunks])
            n += 50
        out[name] = 1e6 * (time.process_time() - t0) / n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--other", type=Path)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--tree", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.tree is not None:
        print(json.dumps(measure(args.tree, args.seconds)))
        return 0

    def run(tree: Path) -> dict[str, float]:
        env = dict(os.environ, PYTHONPATH=str(tree))
        cmd = [sys.executable, __file__, "--tree", str(tree), "--seconds", str(args.seconds)]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        return dict(json.loads(done.stdout.strip().splitlines()[-1]))

    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    ratios: dict[str, list[float]] = {"unary": [], "bulk": []}
    for r in range(args.rounds):
        this = run(HERE)
        line = f"round {r + 1}: this unary {this['unary']:.1f} µs, bulk {this['bulk']:.0f} µs"
        if args.other is not None:
            other = run(args.other)
            line += f"; other unary {other['unary']:.1f} µs, bulk {other['bulk']:.0f} µs"
            for k in ratios:
                ratios[k].append(this[k] / other[k])
            line += f"; this/other {ratios['unary'][-1]:.3f}, {ratios['bulk'][-1]:.3f}"
        print(line, flush=True)
    if args.other is not None:
        print(
            f"median this/other: unary {statistics.median(ratios['unary']):.3f}, "
            f"bulk {statistics.median(ratios['bulk']):.3f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
