"""Heavy hitters without a candidate list: round params and the prefix hash, shared by
the device's encoders (``crowdmix.client.discovery``) and the aggregator's decoders.

A value is read as ``max_length + 1`` symbols over the metric's alphabet (outside
characters become OTHER, then END; the last position is OTHER for a longer value).
Rounds run over collection windows, each with its own group of devices, so they compose
in parallel. ``PrefixRound``: symbols ``[start, stop)`` extend the prefix; with the
extension e = hi·g + lo, key = BLAKE2b-64(start, stop, hi, prefix) and a seed s uniform in
[0, S), h = (H_s(key) + m_s·lo) mod g (g prime, H_s and m_s from SplitMix64 of s); y is
k-RR of h over g buckets (optimised local hashing, Wang et al., USENIX Security 2017) and
the payload is s·g + y in ``index_bytes(S·g)`` bytes. ``ValueRound``: k-RR over the
round's candidates plus "none of these" C; payload ``index_bytes(C+1)``. Either report is
ε-LDP for the value and counted like k-RR: its keep probability (``keep_probability``) is
the largest float at most L/(L + n − 1), L an integer lower bound on e^ε, so the ε the
device realises never exceeds the round's. The hash in full: docs/design.md, "Core".
"""

from __future__ import annotations

import functools
import hashlib
import math
from dataclasses import dataclass

from crowdmix.core.basic import index_bytes
from crowdmix.core.errors import ParamsError

__all__ = [
    "ENCODING",
    "MAX_CELLS",
    "MIN_EPSILON",
    "REPORT_BYTES",
    "SEED_SALTS",
    "HeavyHittersParams",
    "PrefixRound",
    "SymbolMap",
    "ValueRound",
    "exp_lower",
    "keep_probability",
    "mix64",
    "next_prime",
    "prefix_bucket",
    "prefix_key",
    "seed_constants",
]

#: Registry name of this encoding.
ENCODING = "heavy-hitters"
#: Most index values one round's report may take (S·g or C + 1): the aggregator's
#: dense count vector per window.
MAX_CELLS = 1 << 24
#: The wire length of every round's report (the index in little-endian): one length per
#: metric whatever its round, so shufflers and stores keep fixed-length rows.
REPORT_BYTES = index_bytes(MAX_CELLS)
MAX_ALPHABET = 254
MAX_LENGTH = 64
MAX_EXTENSIONS = 1 << 20
MAX_EPSILON = 20.0
#: The smallest round ε: from it up a round's keep is ≥ 1/n (``keep_probability``).
MIN_EPSILON = 2.0**-48
_MASK = (1 << 64) - 1
_KEY_TAG = b"crowdmix/discovery/v1\x00"
# SplitMix64 increments that separate the three per-seed constants.
SEED_SALTS = (0x9E3779B97F4A7C15, 0x3C6EF372FE94F82A, 0xDAA66D2C7DDF743F)


def mix64(z: int) -> int:
    """SplitMix64's finaliser (Steele, Lea, Flood 2014): a bijection of 64-bit words."""
    z &= _MASK
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & _MASK
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def next_prime(n: int) -> int:
    """The smallest prime ≥ max(n, 2) (trial division: n is at most ~2^24 here)."""
    n = max(2, n)
    while True:
        if n < 4 or (n % 2 and all(n % d for d in range(3, math.isqrt(n) + 1, 2))):
            return n
        n += 1


#: Fixed-point bits of ``exp_lower``.
EXP_BITS = 256


def exp_lower(epsilon: float) -> int:
    """An integer L ≤ e^ε·2^256 (within ~2^-200 of it for ε ≤ 20): the Taylor series of
    e^x at x = ⌊ε·2^256⌋/2^256, every term rounded down from the one before, so each
    term, and the sum, errs low. Integer arithmetic only: every SDK gets the same L.
    ε must be in (0, ``MAX_EPSILON``]."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, int | float):
        raise ParamsError(f"epsilon must be a number, got {epsilon!r}")
    if not 0.0 < epsilon <= MAX_EPSILON:  # NaN fails too
        raise ParamsError(f"epsilon must be in (0, {MAX_EPSILON}], got {epsilon!r}")
    num, den = float(epsilon).as_integer_ratio()
    x = (num << EXP_BITS) // den
    term = total = 1 << EXP_BITS
    k = 1
    while term:
        term = ((term * x) >> EXP_BITS) // k
        total += term
        k += 1
    return total


def _float_at_most(a: int, b: int) -> float:
    """The largest float ≤ a/b, for 2^-1000 < a/b < 1 (m·2^-s with 2^52 ≤ m < 2^53)."""
    s = 53 + b.bit_length() - a.bit_length()  # a·2^s/b in [2^52, 2^54)
    m = (a << s) // b
    if m >> 53:
        s -= 1
        m = (a << s) // b
    return math.ldexp(m, -s)


@functools.lru_cache(maxsize=256)
def keep_probability(epsilon: float, n: int) -> float:
    """The keep probability of a round's n-ary randomized response, as every SDK draws it:
    the largest float ≤ L/(L + (n−1)·2^256) with L = ``exp_lower(ε)``. Since L ≤ e^ε·2^256
    and t/(t + n − 1) grows with t, it is ≤ e^ε/(e^ε + n − 1), so the realised ε,
    ln(keep·(n−1)/(1−keep)), is at most ε (and below it by about an ulp of keep). It is
    ≥ 0, i.e. keep ≥ 1/n, when ε ≥ ``MIN_EPSILON`` (what a round requires): L/2^256 =: u ≥
    1 + x exactly (the first two terms), x ≥ ε − 2^-256 ≥ 2^-50, so (u − 1)/u ≥ 2^-51 and
    keep > t(1 − 2^-52) ≥ 1/n. Below it keep may be the float under 1/n: q/keep > 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ParamsError(f"n must be an integer >= 2, got {n!r}")
    a = exp_lower(epsilon)
    return _float_at_most(a, a + ((n - 1) << EXP_BITS))


def seed_constants(seed: int, buckets: int) -> tuple[int, int, int]:
    """(a_s, b_s, m_s): a_s odd 64-bit, b_s 64-bit, m_s in [1, g)."""
    a = mix64(seed ^ SEED_SALTS[0]) | 1
    b = mix64(seed ^ SEED_SALTS[1])
    m = 1 + mix64(seed ^ SEED_SALTS[2]) % (buckets - 1)
    return a, b, m


def prefix_key(start: int, stop: int, hi: int, prefix: bytes) -> int:
    """BLAKE2b-64 (little-endian) of the round's span, the extension's high part
    and the prefix symbols: one 64-bit key per (prefix, hi)."""
    data = _KEY_TAG + bytes((start, stop)) + hi.to_bytes(4, "little") + prefix
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def prefix_bucket(seed: int, key: int, lo: int, buckets: int) -> int:
    """h = (H_s(key) + m_s·lo) mod g (module docstring); H_s reduces the high 32 bits
    of a multiply-add by multiplication (Lemire 2019), not a division."""
    a, b, m = seed_constants(seed, buckets)
    return (((((a * key + b) & _MASK) >> 32) * buckets >> 32) + m * lo) % buckets


@dataclass(frozen=True, slots=True, kw_only=True)
class SymbolMap:
    """Characters → symbols: the alphabet's characters are 0..a−1, OTHER = a, END = a+1."""

    alphabet: str
    max_length: int

    def __post_init__(self) -> None:
        a = self.alphabet
        if not isinstance(a, str) or not 1 <= len(a) <= MAX_ALPHABET:
            raise ParamsError(f"alphabet must be 1 to {MAX_ALPHABET} characters, got {a!r}")
        if len(set(a)) != len(a):
            raise ParamsError(f"alphabet characters must be distinct, got {a!r}")
        n = self.max_length
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_LENGTH:
            raise ParamsError(f"max_length must be an integer in [1, {MAX_LENGTH}], got {n!r}")

    @property
    def other(self) -> int:
        return len(self.alphabet)

    @property
    def end(self) -> int:
        return len(self.alphabet) + 1

    @property
    def size(self) -> int:
        """A: the number of symbols (alphabet, OTHER, END)."""
        return len(self.alphabet) + 2

    @property
    def length(self) -> int:
        """Symbols per value: max_length + 1."""
        return self.max_length + 1

    def symbols(self, value: str) -> bytes:
        """The value's ``max_length + 1`` symbols (module docstring), one byte each."""
        if not isinstance(value, str):
            raise ValueError(f"a heavy-hitter value must be a string, got {type(value).__name__}")
        index = {c: i for i, c in enumerate(self.alphabet)}
        head = [index.get(c, self.other) for c in value[: self.max_length]]
        tail = self.end if len(value) <= self.max_length else self.other
        return bytes(head + [tail] * (self.length - len(head)))

    def text(self, symbols: bytes) -> tuple[str, bool]:
        """(characters up to END, complete?): OTHER reads as U+FFFD, and as "…" in
        the last position (a value longer than ``max_length``, truncated: complete);
        ``complete`` is False for a prefix that has neither yet."""
        out: list[str] = []
        for i, s in enumerate(symbols):
            if s == self.end:
                return "".join(out), True
            if i == self.max_length:
                return "".join(out) + "\u2026", True
            out.append(self.alphabet[s] if s < self.other else "\ufffd")
        return "".join(out), False


def _check_epsilon(eps: object) -> float:
    if isinstance(eps, bool) or not isinstance(eps, int | float) or not math.isfinite(eps):
        raise ParamsError(f"epsilon must be a finite number, got {eps!r}")
    if not MIN_EPSILON <= eps <= MAX_EPSILON:
        raise ParamsError(
            f"epsilon must be in [2^-48, {MAX_EPSILON}] (below it the keep probability "
            f"cannot stay at least 1/n), got {eps!r}"
        )
    return float(eps)


@dataclass(frozen=True, slots=True, kw_only=True)
class PrefixRound:
    """A discovery round: extend prefixes ``[0, start)`` by symbols ``[start, stop)``.

    ``buckets`` (g) defaults to the prime nearest above e^ε + 1 (the variance-optimal
    size); ``seeds`` (S) is how many hash functions devices draw from, S·g ≤ MAX_CELLS.
    """

    symbols: SymbolMap
    start: int
    stop: int
    epsilon: float
    seeds: int
    buckets: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_epsilon(self.epsilon))
        L = self.symbols.length
        for name in ("start", "stop", "seeds", "buckets"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ParamsError(f"{name} must be an integer, got {v!r}")
        if not 0 <= self.start < self.stop <= L:
            raise ParamsError(
                f"need 0 <= start < stop <= {L} (max_length + 1), got {self.start}, {self.stop}"
            )
        if self.extensions > MAX_EXTENSIONS:
            raise ParamsError(
                f"a round of {self.stop - self.start} symbols over {self.symbols.size} has "
                f"{self.extensions} extensions, more than {MAX_EXTENSIONS}: use shorter rounds"
            )
        if self.buckets == 0:
            object.__setattr__(self, "buckets", next_prime(round(math.exp(self.epsilon)) + 1))
        g = self.buckets
        if g < 3 or g != next_prime(g):
            raise ParamsError(f"buckets must be a prime >= 3, got {g}")
        if self.seeds < 1 or self.seeds * g > MAX_CELLS:
            raise ParamsError(
                f"seeds must be in [1, {MAX_CELLS // g}] (seeds x buckets <= {MAX_CELLS}), "
                f"got {self.seeds}"
            )

    @property
    def extensions(self) -> int:
        """E = A^(stop − start): the children each prefix may have."""
        return int(self.symbols.size ** (self.stop - self.start))

    @property
    def cells(self) -> int:
        """S·g: the index values a report may take."""
        return self.seeds * self.buckets

    @property
    def domain_size(self) -> int:
        return self.cells

    @property
    def keep_probability(self) -> float:
        """P(y = h): e^ε/(e^ε + g − 1) rounded toward the smaller ε (``keep_probability``)."""
        return keep_probability(self.epsilon, self.buckets)

    @property
    def report_bytes(self) -> int:
        return index_bytes(self.cells)

    def split(self, symbols: bytes) -> tuple[bytes, int, int]:
        """(prefix, hi, lo) of a value's symbols for this round."""
        e = 0
        for s in symbols[self.start : self.stop]:
            e = e * self.symbols.size + s
        hi, lo = divmod(e, self.buckets)
        return symbols[: self.start], hi, lo

    def fingerprint(self) -> int:
        canon = (
            f"{ENCODING}/prefix/v1;alphabet={self.symbols.alphabet!r};"
            f"max_length={self.symbols.max_length};start={self.start};stop={self.stop};"
            f"epsilon={self.epsilon!r};g={self.buckets};seeds={self.seeds}"
        )
        return int.from_bytes(hashlib.blake2b(canon.encode(), digest_size=8).digest(), "little")


@dataclass(frozen=True, slots=True, kw_only=True)
class ValueRound:
    """An estimation round: k-RR over ``candidates`` and one "none of these" index."""

    symbols: SymbolMap
    epsilon: float
    candidates: tuple[str, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", _check_epsilon(self.epsilon))
        c = tuple(self.candidates)
        object.__setattr__(self, "candidates", c)
        if not c or len(c) >= MAX_CELLS:
            raise ParamsError(f"candidates must hold 1 to {MAX_CELLS - 1} values, got {len(c)}")
        if any(not isinstance(v, str) for v in c):
            raise ParamsError("candidates must be strings")
        if len({self.symbols.symbols(v) for v in c}) != len(c):
            raise ParamsError("candidates must be distinct after mapping to symbols")

    @property
    def cells(self) -> int:
        """C + 1: every candidate and "none"."""
        return len(self.candidates) + 1

    @property
    def domain_size(self) -> int:
        return self.cells

    @property
    def keep_probability(self) -> float:
        """P(report the true index): e^ε/(e^ε + C) rounded toward the smaller ε
        (``keep_probability``)."""
        return keep_probability(self.epsilon, self.cells)

    @property
    def report_bytes(self) -> int:
        return index_bytes(self.cells)

    def fingerprint(self) -> int:
        h = hashlib.blake2b(digest_size=8)
        h.update(
            f"{ENCODING}/value/v1;alphabet={self.symbols.alphabet!r};"
            f"max_length={self.symbols.max_length};epsilon={self.epsilon!r};".encode()
        )
        for v in self.candidates:
            h.update(self.symbols.symbols(v) + b"\xff")
        return int.from_bytes(h.digest(), "little")


def _positive_int(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ParamsError(f"{name} must be a positive integer, got {v!r}")
    return v


@dataclass(frozen=True, slots=True, kw_only=True)
class HeavyHittersParams:
    """A heavy-hitters metric as the registry states it: the plan (alphabet,
    ``max_length``, the prefix lengths ``spans`` after each prefix round, ``keep``
    prefixes per round, ``candidates`` in the value round, ``seeds`` hash functions,
    each round's share ``weights`` of the devices) and the central target
    (``epsilon``, ``delta``) over the ``devices`` expected in all rounds. Each
    round's params follow from these and the metric's shuffle ``min_batch`` (its local
    ε0 is planned over that many reports): the aggregator's round job fixes them, the
    shuffler serves them per window."""

    alphabet: str
    max_length: int
    spans: tuple[int, ...]
    keep: int
    candidates: int
    seeds: int
    weights: tuple[float, ...]
    epsilon: float
    delta: float
    devices: int

    def __post_init__(self) -> None:
        sm = SymbolMap(alphabet=self.alphabet, max_length=self.max_length)
        spans = self.spans
        if not isinstance(spans, list | tuple) or not spans:
            raise ParamsError(f"spans must be a non-empty list of integers, got {spans!r}")
        for s in spans:
            _positive_int("each span", s)
        spans = tuple(spans)
        object.__setattr__(self, "spans", spans)
        if any(b <= a for a, b in zip((0, *spans), spans, strict=False)):
            raise ParamsError(f"spans must be increasing, got {list(spans)}")
        if spans[-1] != sm.length:
            raise ParamsError(
                f"the last span must be {sm.length} (max_length + 1), got {spans[-1]}"
            )
        for a, b in zip((0, *spans), spans, strict=False):
            if sm.size ** (b - a) > MAX_EXTENSIONS:
                raise ParamsError(
                    f"spans {a} -> {b}: {sm.size}^{b - a} extensions, more than "
                    f"{MAX_EXTENSIONS}: use shorter rounds"
                )
        for name in ("keep", "candidates", "seeds", "devices"):
            _positive_int(name, getattr(self, name))
        if self.candidates >= MAX_CELLS or self.seeds * 3 > MAX_CELLS:
            raise ParamsError(f"candidates and seeds x 3 must stay below {MAX_CELLS}")
        w = self.weights
        if not isinstance(w, list | tuple) or any(
            isinstance(x, bool) or not isinstance(x, int | float) for x in w
        ):
            raise ParamsError(f"weights must be a list of numbers, got {w!r}")
        w = tuple(float(x) for x in w)
        object.__setattr__(self, "weights", w)
        if len(w) != len(spans) + 1:
            raise ParamsError(
                f"weights needs {len(spans) + 1} shares (one per round: {len(spans)} prefix "
                f"rounds and the value round), got {len(w)}"
            )
        if any(not x > 0 for x in w) or not math.isclose(math.fsum(w), 1.0, rel_tol=1e-9):
            raise ParamsError(f"weights must be positive and sum to 1, got {list(w)}")
        eps = self.epsilon
        if isinstance(eps, bool) or not isinstance(eps, int | float) or not 0 < eps < math.inf:
            raise ParamsError(f"epsilon must be a positive number, got {eps!r}")
        d = self.delta
        if isinstance(d, bool) or not isinstance(d, int | float) or not 0.0 < d < 1.0:
            raise ParamsError(f"delta must be in (0, 1), got {d!r}")
        object.__setattr__(self, "epsilon", float(eps))
        object.__setattr__(self, "delta", float(d))
        if self.devices < self.rounds:
            raise ParamsError(f"devices must be at least {self.rounds} (one per round)")

    @property
    def symbols(self) -> SymbolMap:
        return SymbolMap(alphabet=self.alphabet, max_length=self.max_length)

    @property
    def rounds(self) -> int:
        """Prefix rounds and the value round."""
        return len(self.spans) + 1

    @property
    def report_bytes(self) -> int:
        return REPORT_BYTES

    def fingerprint(self) -> int:
        canon = (
            f"{ENCODING}/metric/v1;alphabet={self.alphabet!r};max_length={self.max_length};"
            f"spans={list(self.spans)};keep={self.keep};candidates={self.candidates};"
            f"seeds={self.seeds};weights={[repr(x) for x in self.weights]};"
            f"epsilon={self.epsilon!r};delta={self.delta!r};devices={self.devices}"
        )
        return int.from_bytes(hashlib.blake2b(canon.encode(), digest_size=8).digest(), "little")
