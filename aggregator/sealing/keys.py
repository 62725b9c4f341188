"""The aggregator's HPKE key set: private keys that rotate, and their public config.

A key's state is a function of time (unix seconds), so nothing has to run when it
changes: pending ─not_before▶ active ─not_after▶ grace ─not_after+grace▶ expired.
Devices seal to active keys only; a grace key still opens; reports sealed to an expired
key are dropped and its private key is erased on save. The public config
(``PublicKeySet``, defined in ``crowdmix.core.sealed``) lists pending and active keys with
their validity, so caches carry a new key before it is used and drop an old one on time.
The grace period must cover the longest a report can wait at the shuffler (up to
``disposal_days``): the default, 31 days, covers the default disposal age of 30 days.
Errors: ``KeySetError`` (a ValueError: unknown id, last active key, ...) and its
``KeyFileError`` (the key file is missing, unreadable, malformed or readable by others).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import stat
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final, Literal

from cryptography.hazmat.primitives import hpke
from cryptography.hazmat.primitives.asymmetric import mlkem, x25519

from crowdmix.core.errors import ParamsError
from crowdmix.core.sealed import (
    DEFAULT_SUITE,
    MAX_KEY_ID,
    PublicKeyConfig,
    PublicKeySet,
    suite_named,
)

__all__ = [
    "DEFAULT_GRACE_SECONDS",
    "AggregatorKey",
    "KeyFileError",
    "KeySet",
    "KeySetError",
    "KeyState",
    "load_keyset",
    "save_keyset",
    "write_public_config",
]

DEFAULT_GRACE_SECONDS: Final = 31 * 86400
KeyState = Literal["pending", "active", "grace", "expired"]
_FORMAT: Final = "crowdmix-private-keys"
_MLKEM_SEED: Final = 64


class KeySetError(ValueError):
    """A key operation that cannot be done; the message says why."""


class KeyFileError(KeySetError):
    """The key file cannot be used (missing, malformed, or readable by others)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AggregatorKey:
    """One key pair with its validity. ``private_key`` is ``None`` once erased (expired).

    Raw private key: X25519 32 bytes; hybrid = ML-KEM-768 seed (64) ‖ X25519 (32).
    """

    key_id: int
    suite: str
    public_key: bytes
    private_key: bytes | None
    not_before: int
    not_after: int | None = None
    grace_seconds: int = DEFAULT_GRACE_SECONDS

    def __post_init__(self) -> None:
        if isinstance(self.key_id, bool) or not isinstance(self.key_id, int):
            raise KeySetError(f"key id must be an integer, got {self.key_id!r}")
        if not 1 <= self.key_id <= MAX_KEY_ID:
            raise KeySetError(f"key id must be in [1, 2^32), got {self.key_id}")
        try:
            suite_named(self.suite)
        except ParamsError as exc:
            raise KeySetError(str(exc)) from None
        if isinstance(self.grace_seconds, bool) or not isinstance(self.grace_seconds, int):
            raise KeySetError(f"grace_seconds must be an integer, got {self.grace_seconds!r}")
        if self.grace_seconds < 0:
            raise KeySetError(f"grace_seconds must be >= 0, got {self.grace_seconds}")
        if self.not_after is not None and self.not_after <= self.not_before:
            raise KeySetError(f"key {self.key_id}: not_after must be after not_before")

    @property
    def expires_at(self) -> int | None:
        return None if self.not_after is None else self.not_after + self.grace_seconds

    def state(self, now: float) -> KeyState:
        if self.private_key is None:
            return "expired"
        if now < self.not_before:
            return "pending"
        if self.not_after is None or now < self.not_after:
            return "active"
        return "grace" if now < self.not_after + self.grace_seconds else "expired"

    def opens_at(self, now: float) -> bool:
        """Whether reports sealed to this key are opened at time ``now``."""
        return self.state(now) != "expired"

    def public(self) -> PublicKeyConfig:
        return PublicKeyConfig(
            key_id=self.key_id,
            suite=self.suite,
            public_key=self.public_key,
            not_before=self.not_before,
            not_after=self.not_after,
        )

    def hpke_private_key(self) -> Any:
        """The ``cryptography`` private key object (for ``Suite.decrypt``)."""
        if self.private_key is None:
            raise KeySetError(f"key {self.key_id} has expired; its private key was erased")
        return _private_from_raw(self.suite, self.private_key)


def _generate(suite: str) -> tuple[bytes, bytes]:
    """(private raw, public raw) of a fresh key pair from the library's CSPRNG."""
    if not suite_named(suite).post_quantum:
        sk = x25519.X25519PrivateKey.generate()
        return sk.private_bytes_raw(), sk.public_key().public_bytes_raw()
    mk = mlkem.MLKEM768PrivateKey.generate()
    xk = x25519.X25519PrivateKey.generate()
    return (
        mk.private_bytes_raw() + xk.private_bytes_raw(),
        mk.public_key().public_bytes_raw() + xk.public_key().public_bytes_raw(),
    )


def _private_from_raw(suite: str, raw: bytes) -> Any:
    if not suite_named(suite).post_quantum:
        return x25519.X25519PrivateKey.from_private_bytes(raw)
    return hpke.MLKEM768X25519PrivateKey(
        mlkem.MLKEM768PrivateKey.from_seed_bytes(raw[:_MLKEM_SEED]),
        x25519.X25519PrivateKey.from_private_bytes(raw[_MLKEM_SEED:]),
    )


def _public_from_raw(suite: str, raw: bytes) -> bytes:
    if not suite_named(suite).post_quantum:
        return x25519.X25519PrivateKey.from_private_bytes(raw).public_key().public_bytes_raw()
    mk = mlkem.MLKEM768PrivateKey.from_seed_bytes(raw[:_MLKEM_SEED])
    xk = x25519.X25519PrivateKey.from_private_bytes(raw[_MLKEM_SEED:])
    return mk.public_key().public_bytes_raw() + xk.public_key().public_bytes_raw()


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise KeySetError(f"{name} must be an integer number of seconds, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class KeySet:
    """The aggregator's keys, oldest first. Operations return a new ``KeySet``."""

    keys: tuple[AggregatorKey, ...] = ()

    def __post_init__(self) -> None:
        ids = [k.key_id for k in self.keys]
        if len(set(ids)) != len(ids):
            raise KeySetError(f"duplicate key ids in {ids}")

    # -- queries -------------------------------------------------------------
    def get(self, key_id: int) -> AggregatorKey | None:
        return next((k for k in self.keys if k.key_id == key_id), None)

    def active(self, now: float) -> list[AggregatorKey]:
        return [k for k in self.keys if k.state(now) == "active"]

    def public_config(self, now: float) -> PublicKeySet:
        """Pending and active keys: what devices may seal to now or soon. No private key."""
        return PublicKeySet(
            tuple(k.public() for k in self.keys if k.state(now) in ("pending", "active"))
        )

    # -- operations ----------------------------------------------------------
    def _next_id(self) -> int:
        nid = max((k.key_id for k in self.keys), default=0) + 1
        if nid > MAX_KEY_ID:
            raise KeySetError("key ids are exhausted (2^32 - 1 keys)")
        return nid

    def with_new_key(
        self,
        now: int,
        *,
        suite: str = DEFAULT_SUITE,
        pending_seconds: int = 0,
        grace_seconds: int = DEFAULT_GRACE_SECONDS,
    ) -> tuple[KeySet, AggregatorKey]:
        """Add a fresh key usable from ``now + pending_seconds`` (no end yet)."""
        _int(now, "now")
        if _int(pending_seconds, "pending_seconds") < 0:
            raise KeySetError(f"pending_seconds must be >= 0, got {pending_seconds}")
        try:
            suite_named(suite)
        except ParamsError as exc:
            raise KeySetError(str(exc)) from None
        private, public = _generate(suite)
        key = AggregatorKey(
            key_id=self._next_id(),
            suite=suite,
            public_key=public,
            private_key=private,
            not_before=now + pending_seconds,
            grace_seconds=_int(grace_seconds, "grace_seconds"),
        )
        return KeySet((*self.keys, key)), key

    def rotate(
        self,
        now: int,
        *,
        suite: str | None = None,
        pending_seconds: int = 0,
        grace_seconds: int | None = None,
    ) -> tuple[KeySet, AggregatorKey]:
        """A new key from ``now + pending_seconds``; the keys active until then end there
        and enter their grace period (``grace_seconds`` overrides theirs).

        ``suite`` defaults to that of the newest active key (or the default suite).
        """
        current = self.active(now)
        if suite is None:
            suite = current[-1].suite if current else DEFAULT_SUITE
        # the new key keeps the current key's grace; ``grace_seconds`` is for the outgoing
        new_grace = current[-1].grace_seconds if current else DEFAULT_GRACE_SECONDS
        if grace_seconds is not None and _int(grace_seconds, "grace_seconds") < 0:
            raise KeySetError(f"grace_seconds must be >= 0, got {grace_seconds}")
        grown, key = self.with_new_key(
            now, suite=suite, pending_seconds=pending_seconds, grace_seconds=new_grace
        )
        start = key.not_before
        ended = []
        for k in grown.keys:
            running = k is not key and k.state(now) in ("pending", "active")
            if running and k.not_before <= start and (k.not_after is None or k.not_after > start):
                k = replace(
                    k,
                    # a key made in this same second still ends after it began
                    not_after=max(start, k.not_before + 1),
                    grace_seconds=k.grace_seconds if grace_seconds is None else grace_seconds,
                )
            ended.append(k)
        return KeySet(tuple(ended)), key

    def retire(
        self, key_id: int, now: int, *, immediately: bool = False, force: bool = False
    ) -> KeySet:
        """End a key now. It still opens during its grace period unless ``immediately``
        (a compromised key: expired at once, its private key erased); so is a pending key.
        Entries stay, so a key id is never reused.

        Refuses to retire the only active key, in either way, unless ``force``: devices
        would have no key to seal to (every report waits) and a shuffler would not start
        on the public config. Rotate first; ``force`` is for a compromised key that must
        stop opening before its replacement exists.
        """
        key = self.get(key_id)
        if key is None:
            raise KeySetError(f"no key with id {key_id}; see 'crowdmix keys list'")
        state = key.state(now)
        if state == "expired":
            raise KeySetError(f"key {key_id} has already expired")
        if state == "grace" and not immediately:
            raise KeySetError(f"key {key_id} is already retired (in its grace period)")
        only = [k.key_id for k in self.active(now)] == [key_id]
        if state == "active" and only and not force:
            pending = [k for k in self.keys if k.state(now) == "pending"]
            later = (
                f" (key {pending[0].key_id} is pending until "
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(pending[0].not_before))}: "
                "retire this one then)"
                if pending
                else ""
            )
            raise KeySetError(
                f"key {key_id} is the only active key: without it devices have no key to seal "
                f"to (their reports wait) and a shuffler does not start on the public config"
                f"{later}; rotate first (crowdmix keys rotate), or give --force to retire it "
                "with no replacement (a compromised key)"
            )
        if state == "pending":  # never used: expired at once, its id never reused
            immediately = True
        end = max(min(key.not_after or now, now), key.not_before + 1)
        if immediately:
            ended = replace(key, not_after=end, grace_seconds=0, private_key=None)
        else:
            ended = replace(key, not_after=end)
        return KeySet(tuple(ended if k.key_id == key_id else k for k in self.keys))

    def erase_expired(self, now: float) -> KeySet:
        """Drop the private key of every expired key (its entry stays, to tell
        ``expired`` from ``unknown`` when a late report arrives)."""
        return KeySet(
            tuple(
                replace(k, private_key=None) if k.state(now) == "expired" else k for k in self.keys
            )
        )

    # -- serialisation ---------------------------------------------------------
    def to_json(self) -> str:
        entries = [
            {
                "id": k.key_id,
                "suite": k.suite,
                "public_key": base64.b64encode(k.public_key).decode(),
                "private_key": None
                if k.private_key is None
                else base64.b64encode(k.private_key).decode(),
                "not_before": k.not_before,
                "not_after": k.not_after,
                "grace_seconds": k.grace_seconds,
            }
            for k in self.keys
        ]
        return json.dumps({"format": _FORMAT, "version": 1, "keys": entries}, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str, *, source: str = "key file") -> KeySet:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise KeyFileError(f"{source} is not JSON: {exc}") from None
        if not isinstance(doc, dict) or doc.get("format") != _FORMAT:
            raise KeyFileError(f"{source} is not a crowdmix private key file")
        if doc.get("version") != 1:
            raise KeyFileError(f"{source}: unsupported version {doc.get('version')!r}")
        entries = doc.get("keys")
        if not isinstance(entries, list):
            raise KeyFileError(f"{source}: keys must be a list")
        keys = []
        for e in entries:
            try:
                public = base64.b64decode(e["public_key"], validate=True)
                private = (
                    None
                    if e["private_key"] is None
                    else base64.b64decode(e["private_key"], validate=True)
                )
                key = AggregatorKey(
                    key_id=e["id"],
                    suite=e["suite"],
                    public_key=public,
                    private_key=private,
                    not_before=_int(e["not_before"], "not_before"),
                    not_after=None if e["not_after"] is None else _int(e["not_after"], "not_after"),
                    grace_seconds=e["grace_seconds"],
                )
                if private is not None and _public_from_raw(key.suite, private) != public:
                    raise KeyFileError(f"{source}: key {key.key_id}'s public key does not match")
            except KeyFileError:
                raise
            except (KeyError, TypeError, ValueError) as exc:
                raise KeyFileError(f"{source}: malformed key entry ({exc})") from None
            keys.append(key)
        return cls(tuple(keys))


def load_keyset(path: str | os.PathLike[str]) -> KeySet:
    """Read a private key file; refuses one that group or others may read or write."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY)
    except FileNotFoundError:
        raise KeyFileError(f"key file {p} does not exist (create it: crowdmix keys new)") from None
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {p}: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as f:
        mode = stat.S_IMODE(os.fstat(f.fileno()).st_mode)
        data = f.read()
    if _is_public_config(data):  # no chmod advice: a public file may be read by anyone
        raise KeyFileError(
            f"{p} is the public key config (what crowdmix keys export writes for shufflers), "
            "not the private key file: give --file the key set made by crowdmix keys new"
        )
    if mode & 0o077:
        raise KeyFileError(
            f"key file {p} has mode {mode:04o}: private keys must not be accessible "
            f"to other users; run: chmod 600 {p}"
        )
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise KeyFileError(f"key file {p} is not UTF-8 JSON") from None
    return KeySet.from_json(text, source=f"key file {p}")


def _is_public_config(data: bytes) -> bool:
    try:
        doc = json.loads(data)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("format") == "crowdmix-public-keys"


def _atomic_write(path: Path, text: str, mode: int) -> None:
    """Write a file whole or not at all, with ``mode`` from its creation (never wider)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent or ".")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def save_keyset(
    path: str | os.PathLike[str], keys: KeySet, *, now: float, create: bool = False
) -> None:
    """Write the key file (mode 0600) atomically, erasing expired private keys first.

    ``create=True`` refuses to overwrite an existing file (never lose private keys).
    """
    p = Path(path)
    if create and p.exists():
        raise KeyFileError(f"key file {p} already exists; use 'crowdmix keys rotate'")
    if not p.parent.is_dir():
        raise KeyFileError(f"directory {p.parent} does not exist")
    _atomic_write(p, keys.erase_expired(now).to_json(), 0o600)


def write_public_config(path: str | os.PathLike[str], keys: KeySet, *, now: float) -> PublicKeySet:
    """Write the public key config (mode 0644): safe to hand to a shuffler."""
    p = Path(path)
    if not p.parent.is_dir():
        raise KeyFileError(f"directory {p.parent} does not exist")
    config = keys.public_config(now)
    _atomic_write(p, config.to_json(), 0o644)
    return config
