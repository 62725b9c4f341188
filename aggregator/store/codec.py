"""How the count stores serialise what they keep: counts and metric descriptions.

- Counts (an accumulator's ``totals`` and ``ones``) as a compact blob: a small header,
  then the arrays in the narrowest unsigned dtype that holds them. Redis keeps one blob
  per applied batch and one per folded window total; numpy sums blobs in bulk.
- A metric's registry entry (encoding and params) as JSON, stored with its first batch,
  so a report job can decode live counts without the registry file.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from crowdmix.aggregator.errors import ParamsConflict, StoreError
from crowdmix.aggregator.store.base import CountsLike, Int64Array, StoredCounts

if TYPE_CHECKING:
    from crowdmix.core.registry import MetricConfig

__all__ = [
    "decode_counts",
    "describe_metric",
    "encode_counts",
    "metric_from_description",
    "params_difference",
    "sum_blobs",
]

# Blob: magic, version, itemsize of the count dtype, num_cohorts, nbits; then totals (m) and
# ones (m*k) little-endian, in the narrowest dtype that holds the largest count (int64 only
# when needed). A 1000-report batch at m=64, k=128 has counts < 256: 8.3 KB instead of
# 66 KB as int64, and that is what Redis writes to the AOF per batch.
_HEADER = struct.Struct("<4sBBxxII")
_MAGIC = b"CMCT"
_DTYPES: dict[int, np.dtype[np.integer]] = {
    1: np.dtype("<u1"),
    2: np.dtype("<u2"),
    4: np.dtype("<u4"),
    8: np.dtype("<i8"),
}


def encode_counts(counts: CountsLike | StoredCounts) -> bytes:
    """Counts as a compact blob (narrowest unsigned dtype that holds them)."""
    totals = np.asarray(counts.totals)
    ones = np.asarray(counts.ones)
    top = max(int(totals.max(initial=0)), int(ones.max(initial=0)))
    low = min(int(totals.min(initial=0)), int(ones.min(initial=0)))
    if low < 0:
        size = 8
    elif top < 1 << 8:
        size = 1
    elif top < 1 << 16:
        size = 2
    elif top < 1 << 32:
        size = 4
    else:
        size = 8
    dtype = _DTYPES[size]
    m, k = ones.shape
    header = _HEADER.pack(_MAGIC, 1, size, m, k)
    return b"".join((header, totals.astype(dtype).tobytes(), ones.astype(dtype).tobytes()))


def _blob_arrays(blob: bytes) -> tuple[int, int, npt.NDArray[np.integer]]:
    if len(blob) < _HEADER.size:
        raise StoreError("stored counts blob is truncated")
    magic, version, size, m, k = _HEADER.unpack_from(blob)
    if magic != _MAGIC or version != 1 or size not in _DTYPES:
        raise StoreError("stored counts blob has an unknown format")
    dtype = _DTYPES[size]
    if len(blob) != _HEADER.size + size * m * (k + 1):
        raise StoreError("stored counts blob has the wrong length")
    return m, k, np.frombuffer(blob, dtype=dtype, offset=_HEADER.size)


def _split(m: int, k: int, flat: Int64Array) -> StoredCounts:
    return StoredCounts(flat[:m], flat[m:].reshape(m, k))


def decode_counts(blob: bytes) -> StoredCounts:
    """The inverse of :func:`encode_counts` (int64 arrays)."""
    m, k, flat = _blob_arrays(blob)
    return _split(m, k, flat.astype(np.int64))


def sum_blobs(blobs: Sequence[bytes], into: StoredCounts | None = None) -> StoredCounts | None:
    """Add many blobs of one shape (grouped by dtype, summed in numpy), optionally into ``into``."""
    by_shape: dict[tuple[int, int], list[npt.NDArray[np.integer]]] = {}
    for blob in blobs:
        m, k, flat = _blob_arrays(blob)
        by_shape.setdefault((m, k), []).append(flat)
    if into is not None:
        by_shape.setdefault(into.shape, [])
    if len(by_shape) > 1:
        raise ParamsConflict(f"stored counts have different shapes {sorted(by_shape)}")
    if not by_shape:
        return None
    ((m, k), flats) = next(iter(by_shape.items()))
    total = np.zeros(m * (k + 1), dtype=np.int64)
    if into is not None:
        total[:m] = into.totals
        total[m:] = into.ones.ravel()
    by_dtype: dict[np.dtype[np.integer], list[npt.NDArray[np.integer]]] = {}
    for flat in flats:
        by_dtype.setdefault(flat.dtype, []).append(flat)
    for group in by_dtype.values():
        total += np.stack(group).sum(axis=0, dtype=np.int64)
    return _split(m, k, total)


def describe_metric(config: MetricConfig) -> str:
    """A metric's registry entry (encoding and params, not its shuffle policy but a
    heavy-hitters metric's ``min_batch``, which its rounds are planned over) as JSON."""
    table: dict[str, object]
    if config.rappor is not None:
        r = config.rappor
        table = {"encoding": "rappor", "hashing": config.hashing, "k": r.k, "h": r.h, "m": r.m,
                 "f": r.f, "p": r.p, "q": r.q}  # fmt: skip
    elif config.histogram is not None:
        h = config.histogram
        # honest_fraction is not a param of the reports, but a report made from the
        # stored entry alone (no --config) must not assume more honest devices
        table = {"encoding": "shuffled-histogram", "fake_slots": h.fake_slots,
                 "fake_probability": h.fake_probability,
                 "honest_fraction": config.honest_fraction}  # fmt: skip
        if h.local_epsilon is not None:
            table["local_epsilon"] = h.local_epsilon
        if config.domain is not None:
            table["domain"] = list(config.domain)
        else:
            table["domain_size"] = h.domain_size
    elif config.heavy_hitters is not None:
        hh = config.heavy_hitters
        table = {"encoding": "heavy-hitters", "alphabet": hh.alphabet,
                 "max_length": hh.max_length, "spans": list(hh.spans), "keep": hh.keep,
                 "candidates": hh.candidates, "seeds": hh.seeds, "weights": list(hh.weights),
                 "epsilon": hh.epsilon, "delta": hh.delta, "devices": hh.devices,
                 # each round's ε0, so the count vector's length, is planned over it
                 "shuffle": {"min_batch": config.shuffle.min_batch}}  # fmt: skip
    else:
        assert config.basic is not None  # MetricConfig holds exactly one of the two
        b = config.basic
        table = {"encoding": b.mechanism, "epsilon": b.epsilon}
        if config.domain is not None:
            table["domain"] = list(config.domain)
        else:
            table["domain_size"] = b.domain_size
    return json.dumps(table, sort_keys=True)


def params_difference(
    recorded: str, config: MetricConfig, *, ours: str = "the stored counts"
) -> str:
    """The fields in which ``config`` differs from a recorded :func:`describe_metric`
    text, e.g. ``"f: 0.25 in the registry, 0.5 in the stored counts"``: what a params
    mismatch says instead of two fingerprints."""
    try:
        theirs = json.loads(recorded)
    except json.JSONDecodeError:
        theirs = None
    if not isinstance(theirs, dict):
        return f"the recorded params cannot be read ({recorded[:60]!r})"
    mine = json.loads(describe_metric(config))
    differ = [
        f"{key}: {_shown(mine.get(key))} in the registry, {_shown(theirs.get(key))} in {ours}"
        for key in sorted(set(mine) | set(theirs))
        if mine.get(key) != theirs.get(key)
    ]
    return "; ".join(differ) or "the same fields (the fingerprint differs all the same)"


def _shown(value: object) -> str:
    if value is None:
        return "(none)"
    if isinstance(value, list) and len(value) > 6:
        return f"{len(value)} values {value[:3]}..."
    return json.dumps(value)


def metric_from_description(name: str, description: str) -> MetricConfig:
    """The MetricConfig a :func:`describe_metric` text stands for (validated like a registry)."""
    from crowdmix.core.registry import RegistryError, parse_registry

    try:
        table = json.loads(description)
    except json.JSONDecodeError as exc:
        raise RegistryError(f"stored description of {name!r} is not JSON: {exc}") from None
    return parse_registry({"metrics": {name: table}})[name]
