"""The round plan of a discovery and its state between rounds. Pure (numpy only).

A discovery is ``len(spans)`` prefix rounds and one value round, each over its
own group of devices (a share ``weights[r]`` of them). Prefix round r extends
the kept prefixes from ``spans[r−1]`` to ``spans[r]`` symbols; the ``keep``
largest children become the next round's parents. Every kept child that is
complete (it holds END, or it is a truncated value of full length) is *harvested*
with its estimate. The value round estimates the ``candidates`` harvested values
with the largest combined share, and the result lists them.

Shares are combined over rounds by inverse-variance weighting of n̂_r/N_r; the
value round's own estimate (from devices that chose nothing) is what the table
reports with its interval, since the harvest selected the candidates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.discovery.prefixes import PrefixEstimates, child_symbols
from crowdmix.aggregator.discovery.values import ValueEstimates
from crowdmix.core.discovery import PrefixRound, SymbolMap, ValueRound

__all__ = ["DiscoveredValues", "DiscoveryPlan", "DiscoveryState", "advance", "discovered"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryPlan:
    """What a discovery does: symbols, round spans, how much it keeps, group shares."""

    symbols: SymbolMap
    spans: tuple[int, ...]
    keep: int
    candidates: int
    seeds: int
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        spans = tuple(self.spans)
        object.__setattr__(self, "spans", spans)
        L = self.symbols.length
        if not spans or any(b <= a for a, b in zip((0, *spans), spans, strict=False)):
            raise ValueError(f"spans must be increasing and positive, got {spans!r}")
        if spans[-1] != L:
            raise ValueError(f"the last span must be {L} (max_length + 1), got {spans[-1]}")
        for name in ("keep", "candidates", "seeds"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive integer, got {v!r}")
        w = tuple(float(x) for x in self.weights)
        object.__setattr__(self, "weights", w)
        if len(w) != len(spans) + 1:
            raise ValueError(f"weights needs {len(spans) + 1} shares (one per round), got {len(w)}")
        if any(not x > 0 for x in w) or not math.isclose(sum(w), 1.0, rel_tol=1e-9):
            raise ValueError(f"weights must be positive and sum to 1, got {w!r}")

    @property
    def rounds(self) -> int:
        return len(self.spans) + 1

    def prefix_round(self, r: int, epsilon: float) -> PrefixRound:
        if not 0 <= r < len(self.spans):
            raise ValueError(f"prefix rounds are 0..{len(self.spans) - 1}, got {r}")
        start = self.spans[r - 1] if r else 0
        return PrefixRound(
            symbols=self.symbols, start=start, stop=self.spans[r], epsilon=epsilon, seeds=self.seeds
        )

    def value_round(self, epsilon: float, candidates: tuple[str, ...]) -> ValueRound:
        return ValueRound(symbols=self.symbols, epsilon=epsilon, candidates=candidates)


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveryState:
    """Between rounds: the next round's index and parents, the harvest
    (symbols → [(round, share, variance of share)]) and each finished round's
    (round, group, reports, ε0) for the privacy statement."""

    next_round: int = 0
    parents: tuple[bytes, ...] = (b"",)
    harvest: dict[bytes, tuple[tuple[int, float, float], ...]] = field(default_factory=dict)
    costs: tuple[tuple[int, int, int, float], ...] = ()

    def parent_array(self) -> npt.NDArray[np.uint8]:
        width = len(self.parents[0]) if self.parents else 0
        if width == 0:
            return np.zeros((len(self.parents), 0), dtype=np.uint8)
        return np.frombuffer(b"".join(self.parents), dtype=np.uint8).reshape(-1, width)

    def combined(self) -> dict[bytes, tuple[float, float]]:
        """Each harvested value's inverse-variance weighted share and its variance."""
        out = {}
        for v, obs in self.harvest.items():
            w = [1.0 / max(var, 1e-300) for _, _, var in obs]
            share = math.fsum(wi * s for wi, (_, s, _) in zip(w, obs, strict=True)) / math.fsum(w)
            out[v] = (share, 1.0 / math.fsum(w))
        return out

    def final_candidates(self, plan: DiscoveryPlan) -> tuple[str, ...]:
        """The ``plan.candidates`` harvested values with the largest combined share."""
        ranked = sorted(self.combined().items(), key=lambda kv: -kv[1][0])
        return tuple(plan.symbols.text(v)[0] for v, _ in ranked[: plan.candidates])

    def to_dict(self) -> dict[str, object]:
        return {
            "next_round": self.next_round,
            "parents": [p.hex() for p in self.parents],
            "harvest": {v.hex(): [list(o) for o in obs] for v, obs in self.harvest.items()},
            "costs": [list(c) for c in self.costs],
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> DiscoveryState:
        try:
            parents = tuple(bytes.fromhex(str(p)) for p in data["parents"])  # type: ignore[attr-defined]
            harvest = {
                bytes.fromhex(v): tuple((int(r), float(s), float(var)) for r, s, var in obs)
                for v, obs in data["harvest"].items()  # type: ignore[attr-defined]
            }
            costs = tuple(
                (int(r), int(g), int(n), float(e))
                for r, g, n, e in data.get("costs", [])  # type: ignore[attr-defined]
            )
            return cls(
                next_round=int(data["next_round"]),  # type: ignore[call-overload]
                parents=parents,
                harvest=harvest,
                costs=costs,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"not a discovery state: {exc}") from None


def advance(plan: DiscoveryPlan, state: DiscoveryState, est: PrefixEstimates) -> DiscoveryState:
    """The state after prefix round ``state.next_round``: its ``keep`` largest children
    become the parents, and the complete ones among them are harvested."""
    r = est.round
    n = est.num_reports
    kk, ee = est.top(plan.keep)
    kk, ee = kk[est.count[kk, ee] > 0], ee[est.count[kk, ee] > 0]
    parents = []
    harvest = dict(state.harvest)
    for k, e in zip(kk.tolist(), ee.tolist(), strict=True):
        sym = child_symbols(r, est.parents, k, e)
        parents.append(sym)
        if plan.symbols.text(sym)[1] and n:
            full = sym + bytes([plan.symbols.end]) * (plan.symbols.length - len(sym))
            if sym[-1] == plan.symbols.other and len(sym) == plan.symbols.length:
                full = sym
            share = float(est.count[k, e]) / n
            var = float(est.std_error[k, e]) ** 2 / n**2
            harvest[full] = (*harvest.get(full, ()), (state.next_round, share, var))
    return DiscoveryState(
        next_round=state.next_round + 1, parents=tuple(parents), harvest=harvest, costs=state.costs
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscoveredValues:
    """The result table: one row per final candidate, sorted by combined share."""

    values: tuple[str, ...]
    share: npt.NDArray[np.float64]
    std_error: npt.NDArray[np.float64]
    ci_low: npt.NDArray[np.float64]
    ci_high: npt.NDArray[np.float64]
    p_value: npt.NDArray[np.float64]
    significant: npt.NDArray[np.bool_]
    combined_share: npt.NDArray[np.float64]
    num_reports: int

    def top(self, k: int) -> tuple[str, ...]:
        """The first ``k`` significant values (by combined share)."""
        return tuple(v for v, s in zip(self.values, self.significant, strict=True) if s)[:k]


def discovered(
    plan: DiscoveryPlan, state: DiscoveryState, est: ValueEstimates, *, alpha: float = 0.05
) -> DiscoveredValues:
    """The final table: the value round's shares with 95% intervals and one-sided
    p-values (Benjamini–Hochberg at ``alpha`` over the candidates), ordered by the
    share combined over every round that estimated the value."""
    from scipy import stats

    n = est.num_reports
    cands = est.round.candidates
    share = est.count / max(n, 1)
    se = est.std_error / max(n, 1)
    z = stats.norm.ppf(0.975)
    p = stats.norm.sf(np.where(se > 0, share / np.where(se > 0, se, 1.0), 0.0))
    order_p = np.argsort(p, kind="stable")
    m = len(cands)
    passed = p[order_p] <= alpha * np.arange(1, m + 1) / m
    cutoff = int(np.max(np.nonzero(passed)[0])) + 1 if passed.any() else 0
    significant = np.zeros(m, dtype=bool)
    significant[order_p[:cutoff]] = True
    combined = state.combined()
    comb = np.empty(m)
    for i, v in enumerate(cands):
        sym = plan.symbols.symbols(v)
        prior = combined.get(sym)
        w_final = 1.0 / max(se[i] ** 2, 1e-300)
        if prior is None:
            comb[i] = share[i]
        else:
            w_prior = 1.0 / max(prior[1], 1e-300)
            comb[i] = (w_final * share[i] + w_prior * prior[0]) / (w_final + w_prior)
    order = np.argsort(-comb, kind="stable")
    return DiscoveredValues(
        values=tuple(cands[i] for i in order),
        share=share[order],
        std_error=se[order],
        ci_low=(share - z * se)[order],
        ci_high=(share + z * se)[order],
        p_value=p[order],
        significant=significant[order],
        combined_share=comb[order],
        num_reports=n,
    )
