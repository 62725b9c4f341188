"""Simulated populations for the demo, the simulator and the benchmarks.

The five distributions of google/rappor's regression grid over values
v1..vN (``tests/regtest_spec.py`` there): ``unif``; ``exp`` (rate 5/N);
``gauss`` (centred, sd N/6); ``zipf1`` (∝ 1/x); ``zipf1.5`` (∝ 1/x^1.5).
Drawing clients' values is simulation, so numpy's seeded Generator is right
here; everything the privacy guarantee rests on (PRR, IRR, shuffling) stays
on the CSPRNG in client/ and shuffler/.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["DISTRIBUTIONS", "Population", "distribution_weights", "draw_population"]

DISTRIBUTIONS: tuple[str, ...] = ("zipf1", "zipf1.5", "exp", "gauss", "unif")


def distribution_weights(name: str, num_values: int) -> npt.NDArray[np.float64]:
    """Probabilities of v1..vN under ``name``; raises ValueError for an unknown name."""
    if num_values < 1:
        raise ValueError(f"num_values must be positive, got {num_values}")
    x = np.arange(1, num_values + 1, dtype=np.float64)
    if name == "unif":
        w = np.ones_like(x)
    elif name == "exp":
        w = np.exp(-(5.0 / num_values) * x)
    elif name == "gauss":
        mid = (num_values + 1) / 2.0
        w = np.exp(-0.5 * ((x - mid) / (num_values / 6.0)) ** 2)
    elif name == "zipf1":
        w = 1.0 / x
    elif name == "zipf1.5":
        w = x**-1.5
    else:
        raise ValueError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {name!r}")
    out: npt.NDArray[np.float64] = w / w.sum()
    return out


@dataclass(frozen=True, slots=True)
class Population:
    """``values[i]`` is the name of value index i; ``choice[c]`` the index client c reports."""

    values: tuple[str, ...]
    choice: npt.NDArray[np.int64]

    @property
    def size(self) -> int:
        return int(self.choice.size)

    def true_counts(self) -> npt.NDArray[np.int64]:
        return np.bincount(self.choice, minlength=len(self.values)).astype(np.int64)

    def true_frequencies(self) -> dict[str, float]:
        counts = self.true_counts()
        return {v: float(c) / self.size for v, c in zip(self.values, counts, strict=True) if c}


def draw_population(
    clients: int, num_values: int = 100, distribution: str = "zipf1", seed: int | None = None
) -> Population:
    """``clients`` clients, each holding one of v1..v``num_values`` drawn from ``distribution``."""
    if clients < 1:
        raise ValueError(f"clients must be positive, got {clients}")
    weights = distribution_weights(distribution, num_values)
    rng = np.random.default_rng(seed)
    choice = rng.choice(num_values, size=clients, p=weights).astype(np.int64)
    return Population(values=tuple(f"v{i}" for i in range(1, num_values + 1)), choice=choice)
