"""Memory and CPU of one shuffled-histogram figure (``central_epsilon``, which evaluates
δ(ε) at ε = 0, at ε_L and along the root search) for one configuration.

    PYTHONPATH=. nice .venv/bin/python bench/histogram_memory.py --n-honest 30000

Run it with PYTHONPATH at two checkouts to compare them: the figure, CPU seconds
(user + sys) and max RSS are printed. Defaults: d = 4, m = 4, q = 0.5, ε_L = 1, δ = 1e-6.
"""

from __future__ import annotations

import argparse
import resource
import time

from crowdmix.aggregator.accounting.histogram import central_epsilon
from crowdmix.core.histogram import HistogramParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-honest", type=int, default=30_000)
    ap.add_argument("--domain-size", type=int, default=4)
    ap.add_argument("--fake-slots", type=int, default=4)
    ap.add_argument("--fake-probability", type=float, default=0.5)
    ap.add_argument("--local-epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    args = ap.parse_args()
    params = HistogramParams(
        domain_size=args.domain_size,
        fake_slots=args.fake_slots,
        fake_probability=args.fake_probability,
        local_epsilon=args.local_epsilon,
    )
    eps = central_epsilon(params, args.delta, n_honest=args.n_honest)
    use = resource.getrusage(resource.RUSAGE_SELF)
    with open("/proc/loadavg") as f:
        load = f.read()[:14]
    print(
        f"{params} n_h={args.n_honest:,} δ={args.delta:g}: ε = {eps!r}; "
        f"CPU {use.ru_utime + use.ru_stime:.1f} s (sys {use.ru_stime:.1f}); "
        f"max RSS {use.ru_maxrss / 2**20:.2f} GiB; {time.strftime('%Y-%m-%d %H:%M')}, load {load}"
    )


if __name__ == "__main__":
    main()
