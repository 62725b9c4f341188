"""``cryptography``'s HPKE (RFC 9180) suite objects for the suites of ``crowdmix.core.sealed``.

The one definition both sides use, with ``public_key`` (a published key's bytes as the
object HPKE encrypts to): the device seals with it (``crowdmix.client.sealing``),
the aggregator opens with it (``crowdmix.aggregator.sealing.opening``). ``cryptography``
(>= 47, the first version with ``hazmat.primitives.hpke``) is an optional extra: a
missing package raises ``ModuleNotFoundError`` naming the extra to install. The shuffler
never imports this module (it holds no key and opens nothing).
"""

from __future__ import annotations

import functools
from typing import Any

from crowdmix.core.errors import ParamsError
from crowdmix.core.sealed import SealingSuite, suite_named

try:
    from cryptography.hazmat.primitives import hpke as _hpke
    from cryptography.hazmat.primitives.asymmetric import mlkem as _mlkem
    from cryptography.hazmat.primitives.asymmetric import x25519 as _x25519
except ModuleNotFoundError as exc:  # pragma: no cover - exercised only without the extra
    raise ModuleNotFoundError(
        "sealed reports need the 'cryptography' package (>= 47): pip install 'crowdmix[transport]'",
        name="cryptography",
    ) from exc

__all__ = ["hpke_suite", "public_key"]


def hpke_suite(suite: str | SealingSuite) -> Any:
    """``cryptography``'s ``hpke.Suite`` for one of ``crowdmix.core.sealed.SUITES``."""
    s = suite_named(suite) if isinstance(suite, str) else suite
    kem = _hpke.KEM.MLKEM768_X25519 if s.post_quantum else _hpke.KEM.X25519
    return _hpke.Suite(kem, _hpke.KDF.HKDF_SHA256, _hpke.AEAD.AES_128_GCM)


@functools.lru_cache(maxsize=64)
def public_key(suite: str, raw: bytes) -> Any:
    """The ``cryptography`` public key of ``raw`` bytes of ``suite`` (cached); ParamsError
    when they are not one."""
    s = suite_named(suite)
    try:
        if not s.post_quantum:
            return _x25519.X25519PublicKey.from_public_bytes(raw)
        return _hpke.MLKEM768X25519PublicKey(
            _mlkem.MLKEM768PublicKey.from_public_bytes(raw[:1184]),
            _x25519.X25519PublicKey.from_public_bytes(raw[1184:]),
        )
    except ValueError as exc:
        raise ParamsError(f"invalid {s.name} public key: {exc}") from None
