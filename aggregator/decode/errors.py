"""Errors and warnings of the decoders.

DecodeError (ValueError)           nothing trustworthy can be decoded
├── NoReportsError                 zero reports
├── ParamsMismatchError            counts/map/candidates do not fit the params
└── IllPosedError                  candidates the counts cannot tell apart
DecodeWarning (UserWarning)        decoded, but read the message (e.g. empty cohorts)
"""

from __future__ import annotations

__all__ = [
    "DecodeError",
    "DecodeWarning",
    "IllPosedError",
    "NoReportsError",
    "ParamsMismatchError",
]


class DecodeError(ValueError):
    """Base class: the input cannot be decoded into estimates worth reporting."""


class NoReportsError(DecodeError):
    """There are no reports to decode."""


class ParamsMismatchError(DecodeError):
    """Counts, map or candidates do not have the shape the params imply."""


class IllPosedError(DecodeError):
    """The counts cannot separate the candidates (identical or collinear Bloom columns)."""


class DecodeWarning(UserWarning):
    """A decode succeeded with a caveat (also listed in the result's ``warnings``)."""
