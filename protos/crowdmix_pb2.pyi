from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Report(_message.Message):
    __slots__ = ("metric", "cohort", "bits", "params_fingerprint", "report_id")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    metric: str
    cohort: int
    bits: bytes
    params_fingerprint: int
    report_id: bytes
    def __init__(self, metric: _Optional[str] = ..., cohort: _Optional[int] = ..., bits: _Optional[bytes] = ..., params_fingerprint: _Optional[int] = ..., report_id: _Optional[bytes] = ...) -> None: ...

class ReportColumns(_message.Message):
    __slots__ = ("metric", "params_fingerprint", "count", "report_bytes", "cohorts", "bits", "report_ids")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    REPORT_BYTES_FIELD_NUMBER: _ClassVar[int]
    COHORTS_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    REPORT_IDS_FIELD_NUMBER: _ClassVar[int]
    metric: str
    params_fingerprint: int
    count: int
    report_bytes: int
    cohorts: _containers.RepeatedScalarFieldContainer[int]
    bits: bytes
    report_ids: bytes
    def __init__(self, metric: _Optional[str] = ..., params_fingerprint: _Optional[int] = ..., count: _Optional[int] = ..., report_bytes: _Optional[int] = ..., cohorts: _Optional[_Iterable[int]] = ..., bits: _Optional[bytes] = ..., report_ids: _Optional[bytes] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("reports", "columns")
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[Report]
    columns: _containers.RepeatedCompositeFieldContainer[ReportColumns]
    def __init__(self, reports: _Optional[_Iterable[_Union[Report, _Mapping]]] = ..., columns: _Optional[_Iterable[_Union[ReportColumns, _Mapping]]] = ...) -> None: ...

class SubmitResponse(_message.Message):
    __slots__ = ("accepted",)
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    accepted: int
    def __init__(self, accepted: _Optional[int] = ...) -> None: ...

class Batch(_message.Message):
    __slots__ = ("batch_id", "window", "reports")
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    batch_id: bytes
    window: int
    reports: ReportColumns
    def __init__(self, batch_id: _Optional[bytes] = ..., window: _Optional[int] = ..., reports: _Optional[_Union[ReportColumns, _Mapping]] = ...) -> None: ...

class IngestResponse(_message.Message):
    __slots__ = ("applied", "duplicate", "duplicate_reports")
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_REPORTS_FIELD_NUMBER: _ClassVar[int]
    applied: int
    duplicate: bool
    duplicate_reports: int
    def __init__(self, applied: _Optional[int] = ..., duplicate: _Optional[bool] = ..., duplicate_reports: _Optional[int] = ...) -> None: ...
