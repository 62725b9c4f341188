"""The SDK's footprint in an app: import, memory, install size, per-report cost.

    .venv/bin/python bench/sdk_footprint.py [--imports 15] [--reports 300] [--no-install]

1. ``import client``: wall time inside a fresh interpreter (``perf_counter`` around the
   import; interpreter start-up excluded), median of N subprocesses; RSS before and
   after (``VmRSS``); then what is loaded and the RSS after creating a ``Reporter``,
   and after its first send (grpc, protobuf and cryptography loaded).
2. Install size: the wheel built from this checkout, installed with ``pip install
   --target`` into an empty directory, once with no extras (the encoders: ``mmh3``)
   and once with ``[transport]`` (what a ``Reporter`` needs); ``du`` of each.
3. Per report, in this process, RAPPOR k=128 and a k-RR metric: ``Reporter.report``
   (encode + claim + store, one SQLite transaction with ``synchronous=FULL``: one
   fsync per report, so the disk sets it), and the seal each report gets when sent
   (HPKE X25519, ``crowdmix.client.request.submit_request``); each figure the median of N reports.
4. Outbox bytes per report: the SQLite file after N reports (WAL checkpointed) minus
   the empty file, divided by N.

The load average is printed: other work on the box slows every wall-clock figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_PROBE = r"""
import json, sys, time
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
r0 = rss(); t0 = time.perf_counter()
from crowdmix import client
t1 = time.perf_counter(); r1 = rss()
out = {"import_s": t1 - t0, "rss_before": r0, "rss_import": r1}
if len(sys.argv) > 1:
    rep = client.Reporter(sys.argv[1], "127.0.0.1:1", background=False)
    out["rss_reporter"] = rss()
    out["reporter_loads_grpc"] = "grpc" in sys.modules
    rep.flush(timeout=0.5)  # fetches the config: loads grpc and protobuf, fails (no server)
    import crowdmix.client.sealing  # what a send to a sealed shuffler loads as well
    out["rss_sending"] = rss()
    rep.close()
print(json.dumps(out))
"""


def _imports(n: int) -> dict[str, float]:
    runs = []
    for i in range(n):
        with tempfile.TemporaryDirectory() as d:
            args = [sys.executable, "-c", _PROBE] + ([d] if i == 0 else [])
            runs.append(
                json.loads(subprocess.run(args, capture_output=True, text=True, check=True).stdout)
            )
    first = runs[0]
    return {
        "import_ms_median": 1e3 * statistics.median(r["import_s"] for r in runs),
        "import_ms_min": 1e3 * min(r["import_s"] for r in runs),
        "rss_import_delta_mb": statistics.median(r["rss_import"] - r["rss_before"] for r in runs)
        / 2**20,
        "rss_after_import_mb": statistics.median(r["rss_import"] for r in runs) / 2**20,
        "rss_with_reporter_mb": first["rss_reporter"] / 2**20,
        "reporter_loads_grpc": first["reporter_loads_grpc"],
        "rss_when_sending_mb": first["rss_sending"] / 2**20,
    }


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _install_sizes() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        src = t / "src"
        skip = (".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "out")
        shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(*skip))
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        subprocess.run([*pip, "wheel", "--no-deps", "-w", str(t / "w"), str(src)], check=True)
        (wheel,) = (t / "w").glob("crowdmix-*.whl")
        out = {"wheel_kb": wheel.stat().st_size / 1024}
        for label, spec in (("core", str(wheel)), ("transport", f"{wheel}[transport]")):
            target = t / label
            subprocess.run([*pip, "install", "--target", str(target), spec], check=True)
            out[f"install_{label}_mb"] = _du(target) / 2**20
            out[f"install_{label}_packages"] = sorted(
                p.name.split("-")[0] for p in target.glob("*.dist-info")
            )  # type: ignore[assignment]
        return out


def _per_report(n: int) -> dict[str, float]:
    from crowdmix import client
    from crowdmix.aggregator.sealing.keys import KeySet
    from crowdmix.client.outbox import Outbox
    from crowdmix.client.request import submit_request
    from crowdmix.core.device_config import DeviceConfig, to_proto
    from crowdmix.core.registry import parse_registry
    from crowdmix.core.sealed import choose_key

    metrics = {}
    for i in range(n):
        metrics[f"r{i}"] = {"encoding": "rappor", "k": 128, "h": 2, "m": 64,
                            "f": 0.5, "p": 0.5, "q": 0.75}  # fmt: skip
        metrics[f"b{i}"] = {
            "encoding": "krr",
            "epsilon": 2.0,
            "domain": ["light", "dark", "system"],
        }
    registry = parse_registry({"metrics": metrics})
    keys, _ = KeySet().with_new_key(int(time.time()) - 10)
    config = DeviceConfig.of(registry, keys.public_config(time.time()))
    out: dict[str, float] = {}
    with tempfile.TemporaryDirectory(dir=ROOT) as d:  # the checkout's disk, as an app's would be
        for kind, value in (("r", "https://example.com/"), ("b", "dark")):
            app = Path(d) / kind
            app.mkdir()
            box = Outbox(app / "outbox.sqlite3")
            box.store_config(to_proto(config).SerializeToString(), time.time(), 0.0)
            box.close()
            rep = client.Reporter(app, "127.0.0.1:1", background=False)
            db = app / "outbox.sqlite3"
            rep._outbox._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            empty = db.stat().st_size
            times = []
            for i in range(n):
                t0 = time.perf_counter()
                assert rep.report(f"{kind}{i}", value)
                times.append(time.perf_counter() - t0)
            rows = rep._outbox.pending()
            seal = []
            for row in rows:
                t0 = time.perf_counter()
                submit_request(
                    [(row.report, row.window)],
                    key=choose_key(config.keys.keys, time.time()),
                    report_bytes={row.report.metric: 16 if kind == "r" else 1},
                )
                seal.append(time.perf_counter() - t0)
            rep._outbox._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            full = db.stat().st_size
            enc = rep._encoder(f"{kind}0", config.metrics[f"{kind}0"])
            t0 = time.perf_counter()
            for _ in range(n):
                enc.encode(value)
            enc_s = (time.perf_counter() - t0) / n
            rep.close()
            # the same without fsync (a fresh outbox): the CPU's share of a report
            nosync = Path(d) / f"{kind}-nosync"
            shutil.copytree(app, nosync, ignore=shutil.ignore_patterns("outbox.sqlite3*"))
            box = Outbox(nosync / "outbox.sqlite3")
            box.store_config(to_proto(config).SerializeToString(), time.time(), 0.0)
            box.close()
            rep = client.Reporter(nosync, "127.0.0.1:1", background=False)
            rep._outbox._db.execute("PRAGMA synchronous=OFF")
            cpu = []
            for i in range(n):
                t0 = time.perf_counter()
                assert rep.report(f"{kind}{i}", value)
                cpu.append(time.perf_counter() - t0)
            rep.close()
            name = "rappor_k128" if kind == "r" else "krr_d3"
            out[f"{name}_report_nofsync_us_median"] = 1e6 * statistics.median(cpu)
            out[f"{name}_report_us_median"] = 1e6 * statistics.median(times)
            out[f"{name}_report_us_p90"] = 1e6 * statistics.quantiles(times, n=10)[-1]
            out[f"{name}_encode_us"] = 1e6 * enc_s
            out[f"{name}_seal_us_median"] = 1e6 * statistics.median(seal)
            out[f"{name}_outbox_bytes_per_report"] = (full - empty) / n
            out[f"{name}_outbox_payload_bytes"] = len(rows[0].report.bits)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--imports", type=int, default=15)
    ap.add_argument("--reports", type=int, default=300)
    ap.add_argument("--no-install", action="store_true", help="skip the install sizes")
    args = ap.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.2f}; python {sys.version.split()[0]}")
    results: dict[str, object] = {}
    results.update(_imports(args.imports))
    if not args.no_install:
        results.update(_install_sizes())
    results.update(_per_report(args.reports))
    for k, v in results.items():
        print(f"{k:40s} {v:.2f}" if isinstance(v, float) else f"{k:40s} {v}")
    print(f"load average at end: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
