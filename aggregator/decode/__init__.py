"""Decoders: counts → frequencies with standard errors, intervals and significance.

- ``rappor``: RAPPOR (weighted NNLS, LASSO screening, analytic SEs);
- ``basic``: binary RR, k-RR, OUE, OLH closed-form estimators;
- ``histogram``: shuffled histograms with fake reports (unbiased, exact variance);
- ``stats``: p-values, corrections, intervals; ``simulate``: exact count simulation.
"""

from __future__ import annotations

from crowdmix.aggregator.decode.basic import decode_basic, project_to_simplex
from crowdmix.aggregator.decode.errors import (
    DecodeError,
    DecodeWarning,
    IllPosedError,
    NoReportsError,
    ParamsMismatchError,
)
from crowdmix.aggregator.decode.histogram import decode_histogram
from crowdmix.aggregator.decode.rappor import (
    DecodeOptions,
    bit_estimates,
    decode_rappor,
    design_matrix,
    detection_threshold,
)
from crowdmix.aggregator.decode.result import DecodeResult

__all__ = [
    "DecodeError",
    "DecodeOptions",
    "DecodeResult",
    "DecodeWarning",
    "IllPosedError",
    "NoReportsError",
    "ParamsMismatchError",
    "bit_estimates",
    "decode_basic",
    "decode_histogram",
    "decode_rappor",
    "design_matrix",
    "detection_threshold",
    "project_to_simplex",
]
