"""Write tests/golden/vectors.json: what the Python SDK computes, for every SDK to match.

    python -m tests.golden.make_vectors    # rewrite the file (test_golden_vectors checks it)

Per case: value, secret, cohort and params -> Bloom bits, PRR bits, the cohort the
secret picks, the params fingerprint and ε_1 / ε_∞; the fingerprints of basic and
histogram params; heavy hitters (metric fingerprints, symbols, the device's round from
its secret, each round's params, prefix keys and buckets, the index a fixed byte stream
gives, each round's fingerprint, a GetConfig answer serving rounds, and keep
probabilities with the integer lower bound on e^ε they come from); Python's float repr
(which fingerprints embed); the per-bit counts of seeded Python clients' reports (the
TypeScript suite compares its own with a χ² test); and sealed reports under a fixed test
key pair (its private key is public: it seals nothing real), each with its HPKE info and
plaintext, sealed by Python. The TypeScript suite
(sdk/typescript/test/golden.test.mjs) checks every field and writes reports it sealed
to tests/golden/sealed_by_typescript.json, which tests/golden/test_golden_vectors.py opens.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

from crowdmix.client.rappor import RapporEncoder, cohort_for_secret
from crowdmix.client.sealing import seal_report
from crowdmix.core.basic import BasicParams
from crowdmix.core.hashing import bloom_int
from crowdmix.core.histogram import HistogramParams
from crowdmix.core.params import RapporParams
from crowdmix.core.privacy import epsilon_inf, epsilon_one
from crowdmix.core.sealed import X25519_SUITE, PublicKeyConfig, pack_plaintext, report_info

PATH = Path(__file__).with_name("vectors.json")

# A fixed X25519 test key (public knowledge: it protects nothing).
TEST_PRIVATE_KEY = hashlib.sha256(b"crowdmix golden vectors test key").digest()
TEST_KEY_ID = 7


def _secret(i: int, n: int) -> bytes:
    return (
        hashlib.blake2b(f"secret {i}".encode(), digest_size=64).digest()[:n]
        if n <= 64
        else (hashlib.sha512(f"long secret {i}".encode()).digest() * 2)[:n]
    )


RAPPOR_PARAMS = [
    dict(k=16, h=2, m=64, f=0.5, p=0.5, q=0.75),
    dict(k=8, h=1, m=4, f=0.25, p=0.25, q=0.75),
    dict(k=13, h=3, m=7, f=0.3, p=0.1, q=0.9),
    dict(k=32, h=4, m=1, f=0.0, p=0.5, q=0.75),
    dict(k=64, h=2, m=128, f=1 / 3, p=0.4, q=0.6),
    dict(k=128, h=2, m=32, f=0.5, p=0.5, q=0.75),
    dict(k=256, h=4, m=2**32, f=0.875, p=0.2, q=0.8),
    dict(k=1000, h=3, m=100, f=0.1, p=0.05, q=0.95),
]
VALUES: list[str | bytes] = [
    "",
    "a",
    "example.com",
    "dark",
    "héllo wörld ✓",
    "x" * 40,
    b"\x00\xff\x10",
]
SECRET_LENGTHS = [16, 32, 64, 65, 100]


def _value_json(v: str | bytes) -> Any:
    return v if isinstance(v, str) else {"hex": v.hex()}


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _bits_hex(value: int, k: int) -> str:
    return value.to_bytes((k + 7) // 8, "little").hex()


def rappor_cases() -> list[dict[str, Any]]:
    cases = []
    n = 0
    for pi, pd in enumerate(RAPPOR_PARAMS):
        params = RapporParams(**pd)  # type: ignore[arg-type]
        for vi, value in enumerate(VALUES):
            slen = SECRET_LENGTHS[(pi + vi) % len(SECRET_LENGTHS)]
            secret = _secret(n, slen)
            metric = ["home_page", "m", "métrique", "theme"][(pi + vi) % 4]
            derived = cohort_for_secret(secret, params.m)
            cohort = derived if vi % 2 == 0 else (n * 7919) % params.m
            enc = RapporEncoder(params, secret=secret, metric=metric, cohort=cohort)
            bloom = bloom_int(value, cohort, params, "mmh3")
            prr = enc.permanent_response(bloom).bits
            cases.append(
                {
                    "params": pd,
                    "secret": secret.hex(),
                    "metric": metric,
                    "value": _value_json(value),
                    "cohort": cohort,
                    "cohort_for_secret": derived,
                    "bloom": _bits_hex(bloom, params.k),
                    "prr": _bits_hex(prr, params.k),
                    "fingerprint": str(params.fingerprint()),
                    # JSON has no infinity: null stands for it
                    "epsilon_one": _finite(epsilon_one(params)),
                    "epsilon_inf": _finite(epsilon_inf(params)),
                }
            )
            n += 1
    return cases


def basic_cases() -> list[dict[str, Any]]:
    out = []
    for mech, eps, d in [
        ("binary-rr", 1.0, 2),
        ("krr", 0.5, 10),
        ("krr", 2.5, 300),
        ("oue", 1.25, 17),
        ("olh", 3.0, 1000),
        ("olh", 0.1, 70000),
        ("krr", 1e-05, 2),
    ]:
        p = BasicParams(mechanism=mech, epsilon=eps, domain_size=d)  # type: ignore[arg-type]
        out.append(
            {
                "mechanism": mech,
                "epsilon": eps,
                "domain_size": d,
                "fingerprint": str(p.fingerprint()),
                "report_bytes": p.report_bytes,
                "keep_probability": p.keep_probability,
            }
        )
    return out


def histogram_cases() -> list[dict[str, Any]]:
    out = []
    for d, m, q, le in [
        (10, 3, 0.5, None),
        (300, 0, 0.0, 1.5),
        (70000, 12, 0.125, 4.0),
        (2, 1, 1.0, None),
    ]:
        p = HistogramParams(domain_size=d, fake_slots=m, fake_probability=q, local_epsilon=le)
        out.append(
            {
                "domain_size": d,
                "fake_slots": m,
                "fake_probability": q,
                "local_epsilon": le,
                "fingerprint": str(p.fingerprint()),
                "report_bytes": p.report_bytes,
            }
        )
    return out


FLOATS = [
    0.5,
    1.0,
    0.1,
    1 / 3,
    1e-05,
    0.0001,
    1e16,
    1e15,
    123456789.125,
    2.5e-300,
    0.3,
    7.0,
    1e22,
    5e-324,
]


def sealed_section() -> dict[str, Any]:
    from cryptography.hazmat.primitives.asymmetric import x25519

    priv = x25519.X25519PrivateKey.from_private_bytes(TEST_PRIVATE_KEY)
    from cryptography.hazmat.primitives import serialization

    pub = priv.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    key = PublicKeyConfig(key_id=TEST_KEY_ID, suite=X25519_SUITE.name, public_key=pub, not_before=0)
    cases = []
    for i, (metric, window, bits) in enumerate(
        [
            ("home_page", 20000, bytes([0x5A, 0x01])),
            ("theme", 0, b"\x02"),
            ("métrique", 2**32 - 1, bytes(range(125))),
        ]
    ):
        rid = hashlib.sha256(f"report id {i}".encode()).digest()[:16]
        cohort, fp = (i * 1000003) % 2**32, (0x0123456789ABCDEF * (i + 1)) % 2**64
        sealed = seal_report(
            key,
            metric=metric,
            window=window,
            bits=bits,
            cohort=cohort,
            fingerprint=fp,
            report_id=rid,
        )
        cases.append(
            {
                "metric": metric,
                "window": window,
                "bits": bits.hex(),
                "cohort": cohort,
                "fingerprint": str(fp),
                "report_id": rid.hex(),
                "info": report_info(metric, TEST_KEY_ID, window).hex(),
                "plaintext": pack_plaintext(bits, cohort, fp, rid).hex(),
                "sealed_by_python": sealed.sealed.hex(),
            }
        )
    return {
        "suite": X25519_SUITE.name,
        "key_id": TEST_KEY_ID,
        "private_key": TEST_PRIVATE_KEY.hex(),
        "public_key": pub.hex(),
        "cases": cases,
    }


#: Python's per-bit frequencies for the TypeScript suite's two-sample χ² test: N clients
#: (seeded secrets and IRR bits) report one value in one cohort.
FREQUENCY_CASES = [
    dict(k=16, h=2, m=8, f=0.5, p=0.5, q=0.75),
    dict(k=13, h=3, m=8, f=0.3, p=0.1, q=0.7),
]
FREQUENCY_CLIENTS = 6000


def frequency_cases() -> list[dict[str, Any]]:
    from tests.client.bitsources import SeededBits

    out = []
    for i, pd in enumerate(FREQUENCY_CASES):
        params = RapporParams(**pd)  # type: ignore[arg-type]
        rand = SeededBits(1000 + i)
        ones = [0] * params.k
        for c in range(FREQUENCY_CLIENTS):
            secret = hashlib.sha256(f"frequency client {i} {c}".encode()).digest()
            enc = RapporEncoder(params, secret=secret, metric="m", cohort=3, rand=rand)
            bits = int.from_bytes(enc.encode("example.com").bits, "little")
            for b in range(params.k):
                ones[b] += (bits >> b) & 1
        out.append(
            {
                "params": pd,
                "value": "example.com",
                "cohort": 3,
                "clients": FREQUENCY_CLIENTS,
                "ones": ones,
            }
        )
    return out


class ByteStream:
    """A BitSource over fixed bytes with ``SecureBits``' reading: ``random_bits(n)`` takes
    the next ceil(n/8) bytes, little-endian, and keeps the low n bits (the TypeScript
    SDK's ``RandomBytes`` reads the same bytes the same way)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.used = data, 0

    def random_bits(self, nbits: int) -> int:
        n = (nbits + 7) // 8
        if self.used + n > len(self.data):
            raise ValueError("the byte stream ran out")
        chunk = self.data[self.used : self.used + n]
        self.used += n
        return int.from_bytes(chunk, "little") & ((1 << nbits) - 1)


HEAVY_METRICS: list[dict[str, Any]] = [
    dict(alphabet="abcehlnpry", max_length=6, spans=[3, 7], keep=20, candidates=10,
         seeds=16, weights=[1 / 3, 1 / 3, 1 / 3], epsilon=9.5, delta=1e-06, devices=300),
    dict(alphabet="0123456789abcdef.-", max_length=8, spans=[2, 4, 6, 9], keep=8,
         candidates=5, seeds=5, weights=[0.1, 0.2, 0.3, 0.25, 0.15], epsilon=2.0,
         delta=1e-08, devices=100000),
    dict(alphabet="aé'\\\"✓😀 \t", max_length=3, spans=[1, 4], keep=3, candidates=4,
         seeds=3, weights=[0.5, 0.25, 0.25], epsilon=1.25, delta=0.001, devices=30),
    dict(alphabet="xy", max_length=1, spans=[2], keep=1, candidates=1, seeds=1,
         weights=[0.75, 0.25], epsilon=20.0, delta=0.5, devices=2),
]  # fmt: skip
HEAVY_VALUES = ["", "apple", "banana", "cherry", "ab", "yes", "a1b2c3d4e5", "é'✓", "😀x",
                "\t\"\\", "xyzzy", "aaaaaaaa", "deadbeef.0"]  # fmt: skip
#: Per metric, rounds as a round file serves them: (round, epsilon, seeds, buckets) for a
#: prefix round, (round, epsilon, candidates) for the value round.
HEAVY_ROUNDS: list[list[tuple[Any, ...]]] = [
    [(0, 9.5, 16, 0), (1, 9.5, 16, 0), (2, 9.5, ["apple", "banana", "cherry", "yes"])],
    [(0, 2.0, 5, 0), (1, 0.5, 5, 11), (2, 4.0, 7, 0), (3, 2.0, 5, 59),
     (4, 2.0, ["ab", "deadbeef"])],
    [(0, 1.25, 3, 0), (1, 3.0, 2, 31), (2, 1.25, ["é'✓", "😀x", "a", ""])],
    [(0, 20.0, 1, 65521), (1, 0.125, ["xy"])],
]  # fmt: skip


def _served_round(hh: Any, spec: tuple[Any, ...], window: int, opened: int) -> Any:
    from crowdmix.core.rounds import ServedRound

    r, eps = spec[0], spec[1]
    if isinstance(spec[2], list):
        return ServedRound(round=r, window=window, opened=opened, epsilon=eps,
                           candidates=tuple(spec[2]))  # fmt: skip
    start = hh.spans[r - 1] if r else 0
    return ServedRound(round=r, window=window, opened=opened, epsilon=eps, start=start,
                       stop=hh.spans[r], seeds=spec[2], buckets=spec[3])  # fmt: skip


def _keep_cases() -> list[dict[str, Any]]:
    """ε and n where a float formula and the exact rounding may part: small and large n,
    ε near 0, at 20, and seeded random ones."""
    import random

    from crowdmix.core.discovery import MAX_CELLS, exp_lower, keep_probability

    rng = random.Random(20260)
    pairs = [(5e-324, 2), (1e-300, 3), (2**-60, MAX_CELLS), (0.125, 2), (1.0, 2),
             (9.5, 13367), (20.0, 3), (20.0, 65521), (20.0, MAX_CELLS), (math.log(3.0), 3),
             (7.425, 1693)]  # fmt: skip
    while len(pairs) < 60:
        pairs.append(
            (
                rng.uniform(0.0, 20.0),
                rng.choice([2, rng.randint(2, 500), rng.randint(2, MAX_CELLS)]),
            )
        )
    return [{"epsilon": e, "n": n, "exp_lower": str(exp_lower(e)),
             "keep": keep_probability(e, n)} for e, n in pairs]  # fmt: skip


def heavy_hitters_section() -> dict[str, Any]:
    from crowdmix.client.discovery import PrefixEncoder, ValueEncoder, device_round
    from crowdmix.core.device_config import DeviceConfig, to_proto
    from crowdmix.core.discovery import HeavyHittersParams, PrefixRound, prefix_bucket, prefix_key
    from crowdmix.core.registry import MetricConfig, Registry
    from crowdmix.core.sealed import PublicKeySet

    metrics, rounds, devices = [], [], []
    n = 0
    for mi, (md, specs) in enumerate(zip(HEAVY_METRICS, HEAVY_ROUNDS, strict=True)):
        hh = HeavyHittersParams(**{**md, "spans": tuple(md["spans"]),
                                   "weights": tuple(md["weights"])})  # fmt: skip
        fp = hh.fingerprint()
        metrics.append({
            "params": md,
            "fingerprint": str(fp),
            "report_bytes": hh.report_bytes,
            "symbols": {v: hh.symbols.symbols(v).hex() for v in HEAVY_VALUES},
        })  # fmt: skip
        metric = f"words{mi}"
        for d in range(12):
            secret = _secret(1000 + 12 * mi + d, 32)
            opened = 525_960 + 7 * d
            devices.append({
                "secret": secret.hex(), "metric": metric, "fingerprint": str(fp),
                "opened": opened, "weights": md["weights"],
                "round": device_round(secret, metric, fp, opened, hh.weights),
            })  # fmt: skip
        for spec in specs:
            served = _served_round(hh, spec, 525_960 + spec[0], 525_960)
            params = served.params(hh)
            case: dict[str, Any] = {
                "metric": mi,
                "served": served.to_dict(),
                "cells": params.cells,
                "keep_probability": params.keep_probability,
                "round_fingerprint": str(served.fingerprint(fp)),
                "values": [],
            }
            if isinstance(params, PrefixRound):
                case["buckets"] = params.buckets
            for value in HEAVY_VALUES:
                stream = hashlib.blake2b(f"heavy stream {n}".encode(), digest_size=64).digest()
                n += 1
                rand = ByteStream(stream)
                kind = PrefixEncoder if isinstance(params, PrefixRound) else ValueEncoder
                enc = kind(params, metric=metric, rand=rand)  # type: ignore[arg-type]
                row: dict[str, Any] = {"value": value, "stream": stream.hex(),
                                       "index": enc.index(value), "used": rand.used}  # fmt: skip
                if isinstance(params, PrefixRound):
                    prefix, hi, lo = params.split(params.symbols.symbols(value))
                    key = prefix_key(params.start, params.stop, hi, prefix)
                    row.update(hi=hi, lo=lo, key=str(key), bucket_by_seed=[
                        prefix_bucket(s, key, lo, params.buckets)
                        for s in range(min(params.seeds, 4))
                    ])  # fmt: skip
                case["values"].append(row)
            rounds.append(case)
    # a GetConfig answer as the shuffler serves it: the first metric and two of its rounds
    hh = HeavyHittersParams(**{**HEAVY_METRICS[0], "spans": (3, 7), "weights": (1 / 3,) * 3})
    mc = MetricConfig(name="words", heavy_hitters=hh)
    served = tuple(_served_round(hh, s, 525_960 + 2 * s[0], 525_960) for s in HEAVY_ROUNDS[0])
    config = DeviceConfig.of(Registry({"words": mc}), PublicKeySet(()),
                             rounds={"words": served[:2]})  # fmt: skip
    answer = to_proto(config)
    answer.server_time = 525_961 * 86_400.0
    return {
        "metrics": metrics,
        "devices": devices,
        "rounds": rounds,
        "keep": _keep_cases(),
        "config": {
            "answer": answer.SerializeToString(deterministic=True).hex(),
            "fingerprint": str(hh.fingerprint()),
            "rounds": [r.to_dict() for r in served[:2]],
            "round_fingerprints": [str(r.fingerprint(hh.fingerprint())) for r in served[:2]],
        },
    }


def vectors(*, sealed: bool = True) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "format": "crowdmix-golden-vectors",
        "rappor": rappor_cases(),
        "basic": basic_cases(),
        "histogram": histogram_cases(),
        "float_repr": [[x, repr(x)] for x in FLOATS],
        "frequencies": frequency_cases(),
        "heavy_hitters": heavy_hitters_section(),
    }
    if sealed:
        doc["sealed"] = sealed_section()
    return doc


def deterministic_part(doc: dict[str, Any]) -> dict[str, Any]:
    """The document without what HPKE randomizes (the sealed values)."""
    out = json.loads(json.dumps(doc))
    for case in out.get("sealed", {}).get("cases", []):
        case.pop("sealed_by_python", None)
    return out


def main() -> None:
    doc = vectors()
    if PATH.exists():  # HPKE seals at random: keep what is on disk while its cases stand
        old = json.loads(PATH.read_text(encoding="utf-8")).get("sealed")
        if old is not None and deterministic_part({"sealed": old}) == deterministic_part(
            {"sealed": doc["sealed"]}
        ):
            doc["sealed"] = old
    PATH.write_text(
        json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False) + "\n", encoding="utf-8"
    )


if __name__ == "__main__":
    main()
