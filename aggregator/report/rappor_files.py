"""google/rappor's analysis files, read and written so its users can switch.

- ``params.csv``: header ``k,h,m,p,q,f``, then one row of values.
- ``counts.csv``: no header; one row per cohort: N, then the counts of bits 0..k-1. A
  multiple of m rows is summed per cohort (row r adds to cohort r mod m, as
  ``AdjustCounts``). Counts are whole numbers ("12" or "12.0"); "12.5" is refused.
- ``map.csv``: no header (a first row of non-numbers is skipped); one row per candidate:
  the value, then m·h 1-based row numbers ``cohort·k + bit + 1`` (cohort-major, h per
  cohort; two hashes on one bit repeat it). As in ``ReadMapFile``, a repeated value keeps
  its first row and an empty value reads as "Empty".

Errors: ``RapporFileError`` (a ValueError): a file is missing or does not fit the params
(names file and line).
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import scipy.sparse as sp

from crowdmix.aggregator.report.rappor_hashing import (
    CLIENT_HASHINGS,
    ClientHashing,
    check_client_hashing,
    client_bloom_bits,
)
from crowdmix.core.hashing import bloom_bits
from crowdmix.core.params import Hashing, RapporParams

__all__ = [
    "RapporFileError",
    "read_counts_csv",
    "read_map_csv",
    "read_params_csv",
    "write_counts_csv",
    "write_map_csv",
    "write_params_csv",
]

_PARAM_FIELDS = ("k", "h", "m", "p", "q", "f")


class RapporFileError(ValueError):
    """A google/rappor file is missing, malformed, or inconsistent with the params."""


def _rows(path: str | os.PathLike[str]) -> list[list[str]]:
    try:
        with Path(path).open(newline="", encoding="utf-8") as fh:
            return [row for row in csv.reader(fh) if row and any(cell.strip() for cell in row)]
    except FileNotFoundError:
        raise RapporFileError(f"{path} does not exist") from None
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise RapporFileError(f"cannot read {path}: {exc}") from None


def read_params_csv(path: str | os.PathLike[str]) -> RapporParams:
    rows = _rows(path)
    if len(rows) != 2:
        raise RapporFileError(f"{path}: expected a header and one row, got {len(rows)} rows")
    header = [h.strip().strip('"') for h in rows[0]]
    if sorted(header) != sorted(_PARAM_FIELDS):
        raise RapporFileError(f"{path}: header must be {','.join(_PARAM_FIELDS)}, got {header}")
    raw = dict(zip(header, (c.strip() for c in rows[1]), strict=False))
    try:
        return RapporParams(
            k=int(raw["k"]),
            h=int(raw["h"]),
            m=int(raw["m"]),
            p=float(raw["p"]),
            q=float(raw["q"]),
            f=float(raw["f"]),
        )
    except (KeyError, ValueError) as exc:
        raise RapporFileError(f"{path}: {exc}") from None


def write_params_csv(path: str | os.PathLike[str], params: RapporParams) -> None:
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(_PARAM_FIELDS)
        w.writerow([params.k, params.h, params.m, params.p, params.q, params.f])


def read_counts_csv(
    path: str | os.PathLike[str], params: RapporParams
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(totals[m], ones[m, k]) from a counts file; checked against the params."""
    rows = _rows(path)
    if not rows or len(rows) % params.m:
        raise RapporFileError(
            f"{path}: {len(rows)} cohort rows, but params say m={params.m} "
            "(a multiple of m rows is summed per cohort)"
        )
    widths = sorted({len(r) for r in rows})
    if widths != [params.k + 1]:
        raise RapporFileError(
            f"{path}: rows must have k+1 = {params.k + 1} columns (N, then k bit counts), "
            f"got {widths}"
        )
    table = np.array(
        [[_whole(c, path, line) for c in row] for line, row in enumerate(rows, start=1)],
        dtype=np.int64,
    )
    if len(rows) > params.m:  # google/rappor's AdjustCounts: row r adds to cohort r mod m
        table = table.reshape(len(rows) // params.m, params.m, params.k + 1).sum(axis=0)
    totals, ones = table[:, 0], table[:, 1:]
    if np.any(table < 0) or np.any(ones > totals[:, None]):
        bad = int(np.flatnonzero(np.any(ones > totals[:, None], axis=1) | (totals < 0))[0])
        raise RapporFileError(
            f"{path}: line {bad + 1}: bit counts must be between 0 and the cohort's N"
        )
    return totals.copy(), ones.copy()


def _whole(cell: str, path: str | os.PathLike[str], line: int) -> int:
    """A count: "12" or "12.0"; anything else (12.5, "x", inf) is refused, never truncated."""
    text = cell.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = float(text)
    except ValueError:
        raise RapporFileError(f"{path}: line {line}: {text!r} is not a count") from None
    if not value.is_integer():
        raise RapporFileError(f"{path}: line {line}: count {text} is not a whole number")
    return int(value)


def write_counts_csv(
    path: str | os.PathLike[str], totals: npt.ArrayLike, ones: npt.ArrayLike
) -> None:
    tot = np.asarray(totals, dtype=np.int64)
    cnt = np.asarray(ones, dtype=np.int64)
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        for n, row in zip(tot.tolist(), cnt.tolist(), strict=True):
            w.writerow([n, *row])


def read_map_csv(
    path: str | os.PathLike[str], params: RapporParams, notes: list[str] | None = None
) -> tuple[list[str], sp.csc_matrix]:
    """Candidates and the (m·k × C) 0/1 design matrix from a map file.

    What was skipped (a header row, repeated values) is appended to ``notes``."""
    rows = _rows(path)
    if rows and not all(_is_int(c) for c in rows[0][1:]):
        if notes is not None:
            notes.append(f"{path}: skipped the header row {','.join(rows[0])[:60]!r}")
        rows = rows[1:]
    if not rows:
        raise RapporFileError(f"{path}: no candidates")
    seen: set[str] = set()
    dropped: list[str] = []
    mk = params.m * params.k
    expected = params.m * params.h
    values: list[str] = []
    r_idx: list[int] = []
    c_idx: list[int] = []
    for line, row in enumerate(rows, start=1):
        if len(row) - 1 != expected:
            raise RapporFileError(
                f"{path}: line {line} ({row[0]!r}) has {len(row) - 1} entries, expected "
                f"m·h = {expected}: does the map match the params?"
            )
        try:
            entries = [int(c) for c in row[1:]]
        except ValueError:
            raise RapporFileError(f"{path}: line {line}: entries must be integers") from None
        if min(entries) < 1 or max(entries) > mk:
            raise RapporFileError(f"{path}: line {line}: entries must be in [1, m·k = {mk}]")
        value = row[0] if row[0] != "" else "Empty"  # as google/rappor names it
        if value in seen:  # google/rappor keeps the first row of a repeated value
            dropped.append(value)
            continue
        seen.add(value)
        col = len(values)
        values.append(value)
        r_idx.extend(e - 1 for e in entries)
        c_idx.extend([col] * len(entries))
    if dropped and notes is not None:
        notes.append(
            f"{path}: dropped {len(dropped)} repeated value(s) (the first row of each is kept): "
            f"{sorted(set(dropped))[:5]}"
        )
    x = sp.csc_matrix(
        (np.ones(len(r_idx)), (np.array(r_idx), np.array(c_idx))), shape=(mk, len(values))
    )
    x.data[:] = 1.0  # two hashes on one bit set it once
    return values, x


def _is_int(cell: str) -> bool:
    try:
        int(cell.strip())
    except ValueError:
        return False
    return True


def write_map_csv(
    path: str | os.PathLike[str],
    candidates: Sequence[str],
    params: RapporParams,
    hashing: Hashing | ClientHashing = "rappor-md5",
) -> None:
    """A map file as ``bin/hash_candidates.py`` writes it: h entries per cohort.

    ``rappor-md5``/``rappor-java``: as google/rappor's Python/Java client hashes
    (``crowdmix.aggregator.report.rappor_hashing``; repeats kept, as the client sets
    them); ``mmh3``: as crowdmix's SDK hashes (a cohort with < h distinct bits repeats one).
    """
    try:
        if hashing in CLIENT_HASHINGS:
            check_client_hashing(params, hashing)
        else:
            params.check_hashing(hashing)
    except ValueError as exc:  # ParamsError is one
        raise RapporFileError(str(exc)) from None
    with Path(path).open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        for value in candidates:
            row: list[object] = [value]
            for cohort in range(params.m):
                if hashing == "rappor-md5" or hashing == "rappor-java":
                    bits = client_bloom_bits(value, cohort, params, hashing)
                else:
                    bits = bloom_bits(value, cohort, params, hashing)
                    bits += [bits[-1]] * (params.h - len(bits))
                row.extend(cohort * params.k + b + 1 for b in bits)
            w.writerow(row)
