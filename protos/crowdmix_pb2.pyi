from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Report(_message.Message):
    __slots__ = ("metric", "cohort", "bits", "params_fingerprint", "report_id", "key_id", "sealed", "window")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    COHORT_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REPORT_ID_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    metric: str
    cohort: int
    bits: bytes
    params_fingerprint: int
    report_id: bytes
    key_id: int
    sealed: bytes
    window: int
    def __init__(self, metric: _Optional[str] = ..., cohort: _Optional[int] = ..., bits: _Optional[bytes] = ..., params_fingerprint: _Optional[int] = ..., report_id: _Optional[bytes] = ..., key_id: _Optional[int] = ..., sealed: _Optional[bytes] = ..., window: _Optional[int] = ...) -> None: ...

class ReportColumns(_message.Message):
    __slots__ = ("metric", "params_fingerprint", "count", "report_bytes", "cohorts", "bits", "report_ids", "key_ids", "sealed", "sealed_bytes", "window")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    REPORT_BYTES_FIELD_NUMBER: _ClassVar[int]
    COHORTS_FIELD_NUMBER: _ClassVar[int]
    BITS_FIELD_NUMBER: _ClassVar[int]
    REPORT_IDS_FIELD_NUMBER: _ClassVar[int]
    KEY_IDS_FIELD_NUMBER: _ClassVar[int]
    SEALED_FIELD_NUMBER: _ClassVar[int]
    SEALED_BYTES_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    metric: str
    params_fingerprint: int
    count: int
    report_bytes: int
    cohorts: _containers.RepeatedScalarFieldContainer[int]
    bits: bytes
    report_ids: bytes
    key_ids: _containers.RepeatedScalarFieldContainer[int]
    sealed: bytes
    sealed_bytes: int
    window: int
    def __init__(self, metric: _Optional[str] = ..., params_fingerprint: _Optional[int] = ..., count: _Optional[int] = ..., report_bytes: _Optional[int] = ..., cohorts: _Optional[_Iterable[int]] = ..., bits: _Optional[bytes] = ..., report_ids: _Optional[bytes] = ..., key_ids: _Optional[_Iterable[int]] = ..., sealed: _Optional[bytes] = ..., sealed_bytes: _Optional[int] = ..., window: _Optional[int] = ...) -> None: ...

class SubmitRequest(_message.Message):
    __slots__ = ("reports", "columns", "protocol")
    REPORTS_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    reports: _containers.RepeatedCompositeFieldContainer[Report]
    columns: _containers.RepeatedCompositeFieldContainer[ReportColumns]
    protocol: int
    def __init__(self, reports: _Optional[_Iterable[_Union[Report, _Mapping]]] = ..., columns: _Optional[_Iterable[_Union[ReportColumns, _Mapping]]] = ..., protocol: _Optional[int] = ...) -> None: ...

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

class GetConfigRequest(_message.Message):
    __slots__ = ("metrics",)
    METRICS_FIELD_NUMBER: _ClassVar[int]
    metrics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, metrics: _Optional[_Iterable[str]] = ...) -> None: ...

class RapporConfig(_message.Message):
    __slots__ = ("k", "h", "m", "f", "p", "q", "hashing")
    K_FIELD_NUMBER: _ClassVar[int]
    H_FIELD_NUMBER: _ClassVar[int]
    M_FIELD_NUMBER: _ClassVar[int]
    F_FIELD_NUMBER: _ClassVar[int]
    P_FIELD_NUMBER: _ClassVar[int]
    Q_FIELD_NUMBER: _ClassVar[int]
    HASHING_FIELD_NUMBER: _ClassVar[int]
    k: int
    h: int
    m: int
    f: float
    p: float
    q: float
    hashing: str
    def __init__(self, k: _Optional[int] = ..., h: _Optional[int] = ..., m: _Optional[int] = ..., f: _Optional[float] = ..., p: _Optional[float] = ..., q: _Optional[float] = ..., hashing: _Optional[str] = ...) -> None: ...

class BasicConfig(_message.Message):
    __slots__ = ("epsilon", "domain_size", "domain")
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    epsilon: float
    domain_size: int
    domain: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, epsilon: _Optional[float] = ..., domain_size: _Optional[int] = ..., domain: _Optional[_Iterable[str]] = ...) -> None: ...

class HistogramConfig(_message.Message):
    __slots__ = ("domain_size", "fake_slots", "fake_probability", "local_epsilon", "domain")
    DOMAIN_SIZE_FIELD_NUMBER: _ClassVar[int]
    FAKE_SLOTS_FIELD_NUMBER: _ClassVar[int]
    FAKE_PROBABILITY_FIELD_NUMBER: _ClassVar[int]
    LOCAL_EPSILON_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    domain_size: int
    fake_slots: int
    fake_probability: float
    local_epsilon: float
    domain: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, domain_size: _Optional[int] = ..., fake_slots: _Optional[int] = ..., fake_probability: _Optional[float] = ..., local_epsilon: _Optional[float] = ..., domain: _Optional[_Iterable[str]] = ...) -> None: ...

class HeavyHittersRound(_message.Message):
    __slots__ = ("round", "window", "epsilon", "start", "stop", "seeds", "buckets", "candidates", "opened")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    BUCKETS_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    OPENED_FIELD_NUMBER: _ClassVar[int]
    round: int
    window: int
    epsilon: float
    start: int
    stop: int
    seeds: int
    buckets: int
    candidates: _containers.RepeatedScalarFieldContainer[str]
    opened: int
    def __init__(self, round: _Optional[int] = ..., window: _Optional[int] = ..., epsilon: _Optional[float] = ..., start: _Optional[int] = ..., stop: _Optional[int] = ..., seeds: _Optional[int] = ..., buckets: _Optional[int] = ..., candidates: _Optional[_Iterable[str]] = ..., opened: _Optional[int] = ...) -> None: ...

class HeavyHittersConfig(_message.Message):
    __slots__ = ("alphabet", "max_length", "spans", "keep", "candidates", "seeds", "weights", "epsilon", "delta", "devices", "rounds")
    ALPHABET_FIELD_NUMBER: _ClassVar[int]
    MAX_LENGTH_FIELD_NUMBER: _ClassVar[int]
    SPANS_FIELD_NUMBER: _ClassVar[int]
    KEEP_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    SEEDS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    EPSILON_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    ROUNDS_FIELD_NUMBER: _ClassVar[int]
    alphabet: str
    max_length: int
    spans: _containers.RepeatedScalarFieldContainer[int]
    keep: int
    candidates: int
    seeds: int
    weights: _containers.RepeatedScalarFieldContainer[float]
    epsilon: float
    delta: float
    devices: int
    rounds: _containers.RepeatedCompositeFieldContainer[HeavyHittersRound]
    def __init__(self, alphabet: _Optional[str] = ..., max_length: _Optional[int] = ..., spans: _Optional[_Iterable[int]] = ..., keep: _Optional[int] = ..., candidates: _Optional[int] = ..., seeds: _Optional[int] = ..., weights: _Optional[_Iterable[float]] = ..., epsilon: _Optional[float] = ..., delta: _Optional[float] = ..., devices: _Optional[int] = ..., rounds: _Optional[_Iterable[_Union[HeavyHittersRound, _Mapping]]] = ...) -> None: ...

class MetricInfo(_message.Message):
    __slots__ = ("name", "encoding", "params_fingerprint", "report_bytes", "rappor", "basic", "histogram", "heavy_hitters", "disposal_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    REPORT_BYTES_FIELD_NUMBER: _ClassVar[int]
    RAPPOR_FIELD_NUMBER: _ClassVar[int]
    BASIC_FIELD_NUMBER: _ClassVar[int]
    HISTOGRAM_FIELD_NUMBER: _ClassVar[int]
    HEAVY_HITTERS_FIELD_NUMBER: _ClassVar[int]
    DISPOSAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    encoding: str
    params_fingerprint: int
    report_bytes: int
    rappor: RapporConfig
    basic: BasicConfig
    histogram: HistogramConfig
    heavy_hitters: HeavyHittersConfig
    disposal_seconds: int
    def __init__(self, name: _Optional[str] = ..., encoding: _Optional[str] = ..., params_fingerprint: _Optional[int] = ..., report_bytes: _Optional[int] = ..., rappor: _Optional[_Union[RapporConfig, _Mapping]] = ..., basic: _Optional[_Union[BasicConfig, _Mapping]] = ..., histogram: _Optional[_Union[HistogramConfig, _Mapping]] = ..., heavy_hitters: _Optional[_Union[HeavyHittersConfig, _Mapping]] = ..., disposal_seconds: _Optional[int] = ...) -> None: ...

class PublicKey(_message.Message):
    __slots__ = ("key_id", "suite", "public_key", "not_before", "not_after")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    SUITE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_FIELD_NUMBER: _ClassVar[int]
    key_id: int
    suite: str
    public_key: bytes
    not_before: int
    not_after: int
    def __init__(self, key_id: _Optional[int] = ..., suite: _Optional[str] = ..., public_key: _Optional[bytes] = ..., not_before: _Optional[int] = ..., not_after: _Optional[int] = ...) -> None: ...

class ConfigResponse(_message.Message):
    __slots__ = ("version", "cache_seconds", "metrics", "keys", "protocol", "window_seconds", "server_time", "window", "plaintext", "window_tolerance")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CACHE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SERVER_TIME_FIELD_NUMBER: _ClassVar[int]
    WINDOW_FIELD_NUMBER: _ClassVar[int]
    PLAINTEXT_FIELD_NUMBER: _ClassVar[int]
    WINDOW_TOLERANCE_FIELD_NUMBER: _ClassVar[int]
    version: str
    cache_seconds: int
    metrics: _containers.RepeatedCompositeFieldContainer[MetricInfo]
    keys: _containers.RepeatedCompositeFieldContainer[PublicKey]
    protocol: int
    window_seconds: int
    server_time: float
    window: int
    plaintext: bool
    window_tolerance: int
    def __init__(self, version: _Optional[str] = ..., cache_seconds: _Optional[int] = ..., metrics: _Optional[_Iterable[_Union[MetricInfo, _Mapping]]] = ..., keys: _Optional[_Iterable[_Union[PublicKey, _Mapping]]] = ..., protocol: _Optional[int] = ..., window_seconds: _Optional[int] = ..., server_time: _Optional[float] = ..., window: _Optional[int] = ..., plaintext: _Optional[bool] = ..., window_tolerance: _Optional[int] = ...) -> None: ...
