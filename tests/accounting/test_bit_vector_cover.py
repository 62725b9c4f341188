"""Why a bit-vector report's shuffle bound counts cover on whole reports, exhaustively.

One RAPPOR report (one release; the PRR is memoised, so releases are not independent)
is, to whoever lacks the client's secret, k independent bits: Bern(q*) on the value's
Bloom bits, Bern(p*) elsewhere (Erlingsson, Pihur, Korolova, CCS 2014, §4). The victim's
two values give laws that differ only on D = B0 Δ B1 (≤ 2h bits), so it is tempting to
count cover on D alone. Two such bounds are refuted here by exact enumeration of the real
shuffled mechanism (k = 3, h = 1, victim {0} vs {1}, every other user {2}):

- a blanket on D: every other user whose Bloom bits avoid D draws exactly W on D, so
  count it as cover (γ = 1 instead of ((1 − q*)/(1 − p*))^h);
- clones on D (Feldman, McMillan, Talwar, SODA 2023, stronger clones, with the largest
  r such that each other user's law on D is ≥ r·R(x0) + r·R(x1) there).

The step that fails in both: an other user's bits outside D (its own Bloom bits,
Bern(q*) where the victim's are Bern(p*)) tell the adversary which reports are not the
victim's, so domination on D does not make a report cover. Domination of whole reports
by one law common to every value is the blanket's γ = r0^h (up to the mass of patterns
with fewer than h zeros), and no decomposition does better than the blanket (Su, Cheng,
Wang 2025, "Decomposition-based optimal bounds for privacy amplification via
shuffling"). A bound past the blanket must also hold beyond the labelled lower bound's
data set, which is not always the worst (the last test). Deterministic (no sampling): no
false failures.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from crowdmix.aggregator.accounting.blanket import bit_vector_given, mixture
from crowdmix.aggregator.accounting.pairs import ClonePair
from crowdmix.aggregator.accounting.randomizers import BitVector
from tests.accounting.test_blanket_exact import Randomizer, bloom, hockey_stick, victim_laws

# Float rounding of the enumeration (sums of ~1e4 products); every gap asserted is ≥ 1e-2.
ROUNDING = 1e-12


def exact_delta(
    mech: Randomizer, pair: tuple[int, int], others: Sequence[int], eps: Sequence[float]
) -> list[float]:
    """The exact δ(ε) (the larger of both directions) of one data set: the victim
    holds pair[0] or pair[1], the others hold ``others``; the output is the
    histogram of the n reports."""
    rows = {x: np.asarray(mech(x), dtype=np.float64) for x in {*pair, *others}}
    laws = victim_laws(rows, others, pair)
    a, b = laws[pair[0]], laws[pair[1]]
    return [float(d) for d in np.maximum(hockey_stick(a, b, eps), hockey_stick(b, a, eps))]


def laws_on_d(p: float, q: float) -> dict[str, dict[tuple[int, ...], float]]:
    """The laws on D = bits {0, 1} of values {0}, {1} and {2} (the last avoids D)."""

    def law(hot: set[int]) -> dict[tuple[int, ...], float]:
        return {
            d: math.prod(
                (q if j in hot else p) if bit else 1.0 - (q if j in hot else p)
                for j, bit in enumerate(d)
            )
            for d in itertools.product((0, 1), repeat=2)
        }

    return {"x0": law({0}), "x1": law({1}), "avoids": law(set())}


def test_cover_counted_on_the_differing_bits_alone_understates_delta() -> None:
    p, q, n = 0.3125, 0.6875, 2  # the demo's p*, q*; one other user
    eps = [0.0, 0.5, 1.0]
    exact = exact_delta(bloom(3, [[0], [1], [2]], p, q), (0, 1), [2] * (n - 1), eps)
    on_d = mixture(n - 1, 1.0, lambda m: bit_vector_given(p, q, (1, 1), m, 1e-3, {}), 1e-3)
    blanket = BitVector(p=p, q=q, bits=1).profile(n, 1e-3)
    assert blanket is not None
    for e, ex in zip(eps, exact, strict=True):
        assert on_d.delta(e) < ex - 1e-2, (e, on_d.delta(e), ex)  # the D-only blanket fails
        assert blanket.delta(e) >= ex - ROUNDING, (e, blanket.delta(e), ex)  # ours holds


def test_clones_on_the_differing_bits_alone_understate_delta() -> None:
    p, q, n = 0.1, 0.9, 12
    d = laws_on_d(p, q)
    r = min(d["avoids"][y] / (d["x0"][y] + d["x1"][y]) for y in d["avoids"])
    assert math.isclose(r, 1 / 18)  # p/(2q): both bits 1
    eps0 = math.log((q / p) * (1.0 - p) / (1.0 - q))
    clones = ClonePair(p=math.exp(eps0), alpha=1.0 / (math.exp(eps0) + 1.0), r=r)
    evaluated = clones.evaluate(n, 1e-3)
    (exact,) = exact_delta(bloom(3, [[0], [1], [2]], p, q), (0, 1), [2] * (n - 1), [1.0])
    assert exact > 0.6
    assert evaluated.delta(1.0) - evaluated.tail < exact - 5e-2  # 0.513 against 0.612
    blanket = BitVector(p=p, q=q, bits=1).profile(n, 1e-3)
    assert blanket is not None
    assert blanket.delta(1.0) >= exact - ROUNDING


def test_rappor_worst_data_set_is_not_always_the_labelled_one() -> None:
    # k = 6, h = 2, n = 3, victim {0,1} vs {2,3}: the labelled lower bound's data set
    # (others {4,5}: bits avoiding D) has the largest δ at ε = 0, but at ε = 2 others
    # holding {3,5} (one bit in D, one label) have more: a bound that reads only the
    # labelled data set is no bound.
    p, q = 0.3125, 0.6875  # the demo's p*, q*
    sets = [list(c) for c in itertools.combinations(range(6), 2)]
    mech = bloom(6, sets, p, q)
    pair = (sets.index([0, 1]), sets.index([2, 3]))
    labelled = exact_delta(mech, pair, [sets.index([4, 5])] * 2, [0.0, 2.0])
    meeting = exact_delta(mech, pair, [sets.index([3, 5])] * 2, [0.0, 2.0])
    assert labelled[0] > meeting[0]
    assert meeting[1] > 1.2 * labelled[1] > 1e-2, (meeting, labelled)
