"""The key that signs the ledger's checkpoints (Ed25519), kept where the database is not: a 0600 key file outside
the state dir, created on first use; and the `Signer` protocol its aws counterpart (a key in Secrets Manager) meets.
A verifier may hold the public half only (`PublicKeyOnly`, `read_public_key`).
"""

from __future__ import annotations

import base64
import hashlib
import os
import stat
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from shiplift.tasks.errors import ConfigError, IntegrityError, NotFound
from shiplift.tasks.hashing import canonical_json

KEY_ENV = "SHIPLIFT_CHECKPOINT_KEY"
DEFAULT_KEY = Path("~/.config/shiplift/ledger-ed25519.pem")


def default_key_path() -> Path:
    """$SHIPLIFT_CHECKPOINT_KEY, else ~/.config/shiplift/ledger-ed25519.pem."""
    return Path(os.environ.get(KEY_ENV) or DEFAULT_KEY).expanduser().resolve()

def key_id_of(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_private_key(pem: bytes, source: str) -> Ed25519PrivateKey:
    """The Ed25519 private key in PEM (PKCS#8) text read from `source`; IntegrityError naming what else it is."""
    try:
        private = serialization.load_pem_private_key(pem, password=None)
    except ValueError as error:
        raise IntegrityError(f"{source} is not a PEM private key: {error}", fix=f"restore {source}") from error
    if not isinstance(private, Ed25519PrivateKey):
        raise IntegrityError(f"{source} holds a {type(private).__name__}, not an Ed25519 key",
                             fix="restore the key that signed this ledger's checkpoints")
    return private


def load_public_key(pem: str) -> Ed25519PublicKey:
    """The Ed25519 public key in PEM (SubjectPublicKeyInfo) text; ValueError saying what else it is (never echoing
    it)."""
    if "PRIVATE KEY" in pem:
        raise ValueError("this is a private key: the config holds only the public half (openssl pkey -pubout)")
    try:
        public = serialization.load_pem_public_key(pem.encode())
    except (ValueError, UnsupportedAlgorithm) as error:
        raise ValueError(f"not a PEM public key ({error})") from error
    if not isinstance(public, Ed25519PublicKey):
        raise ValueError(f"a {type(public).__name__}, not an Ed25519 public key")
    return public


def public_pem(public: Ed25519PublicKey) -> str:
    """A verifying key as PEM (SubjectPublicKeyInfo): what `ledger public-key` exports and `--public-key` reads."""
    return public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode()


def read_public_key(path: str | Path) -> Ed25519PublicKey:
    """The Ed25519 public key in the PEM file at `path` (`--public-key`); ConfigError naming what is wrong and the
    fix."""
    source = Path(path).expanduser()
    fix = "export it where the private key is: `shiplift ledger public-key --out FILE`"
    try:
        text = source.read_text(encoding="utf-8")
    except FileNotFoundError as error:
        raise ConfigError(f"no public key file {source}", fix=fix) from error
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"the public key file {source} cannot be read: {error}", fix=fix) from error
    try:
        return load_public_key(text)
    except ValueError as error:
        raise ConfigError(f"{source} is {error}", fix=fix) from error


class Signer(Protocol):
    """What signs checkpoints: an Ed25519 key, its public half and the id checkpoints name it by."""

    key_id: str
    public: Ed25519PublicKey

    def sign(self, body: dict[str, Any]) -> str: ...


class PrivateKeySigner:
    """A `Signer` over an Ed25519 private key held in memory (the local key file's, or one fetched from AWS)."""

    def __init__(self, private: Ed25519PrivateKey):
        self.private = private
        self.public = private.public_key()
        self.key_id = key_id_of(self.public)

    def sign(self, body: dict[str, Any]) -> str:
        """The base64 Ed25519 signature of a checkpoint body's canonical JSON."""
        return base64.b64encode(self.private.sign(canonical_json(body))).decode()


class PublicKeyOnly:
    """A verify-only `Signer`: a public key and its id, for whoever verifies but must never hold the private key."""

    def __init__(self, public: Ed25519PublicKey):
        self.public = public
        self.key_id = key_id_of(public)

    def sign(self, body: dict[str, Any]) -> str:
        raise ConfigError(f"key {self.key_id} is a public key only: it verifies checkpoints but cannot sign them",
                          fix="sign where the private key is (`shiplift ledger checkpoint`, a release's end)")


class SigningKey(PrivateKeySigner):
    """The Ed25519 key that signs checkpoints: read from a 0600 file, or created there on first use."""

    def __init__(self, path: str | Path, *, state_dir: str | Path | None = None, create: bool = True):
        self.path = Path(path).expanduser().resolve()
        if state_dir is not None and self.path.is_relative_to(Path(state_dir).expanduser().resolve()):
            raise ConfigError(f"the checkpoint key {self.path} is inside the state dir {state_dir}: whoever can "
                              "rewrite the ledger there could re-sign it too",
                              fix=f"keep the key elsewhere (${KEY_ENV}, default {DEFAULT_KEY})")
        if not self.path.exists():
            if not create:
                raise NotFound(f"no checkpoint key at {self.path}",
                               fix=f"point ${KEY_ENV} at the key that signed this ledger's checkpoints")
            self._create()
        mode = stat.S_IMODE(self.path.stat().st_mode)
        if mode & 0o077:
            raise ConfigError(f"the checkpoint key {self.path} is readable by others (mode {mode:o})",
                              fix=f"chmod 600 {self.path}")
        super().__init__(load_private_key(self.path.read_bytes(), str(self.path)))

    def _create(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        pem = Ed25519PrivateKey.generate().private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                         serialization.NoEncryption())
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never overwrites a key
        with os.fdopen(fd, "wb") as handle:
            handle.write(pem)
            handle.flush()
            os.fsync(handle.fileno())
