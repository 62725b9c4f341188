"""An empirical privacy audit: does any output's likelihood ratio exceed e^ε?

For neighbouring inputs x, y and a mechanism M with a small (or projected)
output space, sample M(x) and M(y) n times each and bound every output's
probability with exact Clopper–Pearson intervals. The audit reports the
largest *lower confidence bound* of ln(P[M(x) = o] / P[M(y) = o]) over outputs
o and both directions. For an ε-LDP mechanism it exceeds ε with probability
at most 4·alpha·(number of outputs) (each of the 2·outputs ratios needs one of
its two bounds to fail), so a mechanism that is not ε-LDP by a visible margin
is caught while a correct one passes. Any function of the output (a
projection) may be audited instead of the output: post-processing never
increases the ratio.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from tests.client.stats import log_ratio_lower_bound

AUDIT_ALPHA = 2.5e-10


def audit_log_ratio(
    sample: Callable[[int], int], x: int, y: int, n: int, num_outputs: int
) -> float:
    """max lower confidence bound of |ln P(o|x)/P(o|y)| over outputs o in [0, num_outputs)."""
    counts_x = np.bincount([sample(x) for _ in range(n)], minlength=num_outputs)
    counts_y = np.bincount([sample(y) for _ in range(n)], minlength=num_outputs)
    if counts_x.size != num_outputs or counts_y.size != num_outputs:
        raise ValueError("sample returned an output outside [0, num_outputs)")
    return max(
        log_ratio_lower_bound(counts_x, n, counts_y, n, AUDIT_ALPHA),
        log_ratio_lower_bound(counts_y, n, counts_x, n, AUDIT_ALPHA),
    )
