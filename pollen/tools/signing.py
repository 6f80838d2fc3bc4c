"""Signed app bundles: only the operator's code runs on Pollen's SuperNodes.

Flower 1.39 carries verification records only for apps from its online hub: a bundle (FAB)
submitted from a directory reaches the SuperNodes with none, and a SuperNode started with
`--trusted-entities` refuses every such bundle (tests/pollen/test_app_signing_e2e.py shows it).
Pollen therefore signs the bundle's content itself:

- `stage_signed_app` builds the bundle exactly as `flwr run` will (Flower's own
  `build_fab_from_disk`), computes `bundle_digest` over every file in it, signs the digest
  with the operator's ed25519 key and writes the signature into a staging copy of the app
  (`pollen/bundle_signature.py`, a file the bundle's include patterns already cover). The
  staging copy is what `flwr run` submits.
- On a SuperNode, `pollen.tools.app_runner` checks that signature against the operator's public key
  before Flower installs or imports anything from the bundle (`verify_bundle`).

The digest covers every file of the bundle except Flower's own manifest (`.info/`) and the
signature itself, so changing, adding or removing any file breaks the signature. What is signed
is the code, not a run: whoever can reach the SuperLink's HTTP API could still start the
operator's signed code with other settings (docs/security.md).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import zipfile
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

SIGNATURE_FILE = "pollen/bundle_signature.py"
"""Where the signature travels inside a bundle (matched by the `pollen/**/*.py` include)."""

_HEADER = "# Signature of this app bundle by its operator (pollen.tools.signing); never imported.\n"


class SigningError(ValueError):
    """A key that cannot be read, or a bundle whose signature does not verify."""


def bundle_digest(files: dict[str, bytes]) -> bytes:
    """SHA-256 over the sorted (path, SHA-256 of content) pairs of the signed files."""
    h = hashlib.sha256()
    for name in sorted(files):
        if name == SIGNATURE_FILE or name.startswith(".info/"):
            continue
        h.update(name.encode() + b"\0" + hashlib.sha256(files[name]).digest() + b"\n")
    return h.digest()


def _zip_files(fab: bytes) -> dict[str, bytes]:
    try:
        with zipfile.ZipFile(io.BytesIO(fab)) as zf:
            return {info.filename: zf.read(info) for info in zf.infolist() if not info.is_dir()}
    except (zipfile.BadZipFile, OSError) as exc:
        raise SigningError(f"the app bundle is not a readable archive ({exc})") from None


def read_private_key(path: Path, what: str = "signing key") -> Any:
    """A private key of any kind in OpenSSH or PEM format; SigningError naming `what` and the
    file when it cannot be read or is no private key."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SigningError(f"{what} {path} cannot be read: {exc.strerror}") from None
    try:
        return (
            serialization.load_ssh_private_key(data, password=None)
            if b"OPENSSH PRIVATE KEY" in data
            else serialization.load_pem_private_key(data, password=None)
        )
    except (ValueError, TypeError) as exc:
        raise SigningError(f"{what} {path} is not a private key ({exc})") from None


def load_private_key(path: Path) -> ed25519.Ed25519PrivateKey:
    """An ed25519 private key in OpenSSH or PEM format (`ssh-keygen -t ed25519`)."""
    key = read_private_key(path)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise SigningError(f"signing key {path} is not an ed25519 key (ssh-keygen -t ed25519)")
    return key


def load_public_key(path: Path) -> ed25519.Ed25519PublicKey:
    """An ed25519 public key in OpenSSH format (the `.pub` of `ssh-keygen -t ed25519`)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise SigningError(f"trusted key {path} cannot be read: {exc.strerror}") from None
    try:
        key = serialization.load_ssh_public_key(data)
    except (ValueError, TypeError, IndexError) as exc:
        raise SigningError(f"trusted key {path} is not an OpenSSH public key ({exc})") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise SigningError(f"trusted key {path} is not an ed25519 key (ssh-keygen -t ed25519)")
    return key


def key_id(key: ed25519.Ed25519PublicKey) -> str:
    """A short fingerprint naming the key in logs and signatures."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def signature_text(digest: bytes, key: ed25519.Ed25519PrivateKey) -> str:
    record = {
        "key": key_id(key.public_key()),
        "signature": base64.b64encode(key.sign(digest)).decode(),
    }
    return f"{_HEADER}SIGNATURE = {json.dumps(record)}\n"


def _read_signature(text: str) -> dict[str, str]:
    prefix = "SIGNATURE = "
    for line in text.splitlines():
        if line.startswith(prefix):
            try:
                record = json.loads(line[len(prefix) :])
            except ValueError:
                break
            if isinstance(record, dict) and isinstance(record.get("signature"), str):
                return record
    raise SigningError("the app bundle's signature record is malformed")


def verify_bundle(fab: bytes, trusted: ed25519.Ed25519PublicKey) -> str:
    """Check `fab`'s signature against the trusted key; returns the signer's key id. Raises
    SigningError naming what is wrong (unsigned, signed by another key, altered)."""
    files = _zip_files(fab)
    if SIGNATURE_FILE not in files:
        raise SigningError(
            "the app bundle is not signed (it was not submitted with the operator's key)"
        )
    record = _read_signature(files[SIGNATURE_FILE].decode("utf-8", errors="replace"))
    expected = key_id(trusted)
    if record.get("key") != expected:
        raise SigningError(
            f"the app bundle is signed by key {record.get('key')}, not the trusted key {expected}"
        )
    try:
        trusted.verify(base64.b64decode(record["signature"]), bundle_digest(files))
    except (InvalidSignature, ValueError):
        raise SigningError(
            "the app bundle's signature does not match its content (altered after signing)"
        ) from None
    return expected


def stage_signed_app(app: Path, staging: Path, key: ed25519.Ed25519PrivateKey) -> Path:
    """A copy of the files `flwr run` would bundle from `app`, plus their signature; submit
    the returned directory instead of `app`."""
    from flwr.cli.build import build_fab_from_disk  # lazy: flwr's CLI (imports flwr.server)

    files = _zip_files(build_fab_from_disk(app))
    if staging.exists():
        shutil.rmtree(staging)
    for name, content in files.items():
        if name.startswith(".info/"):
            continue
        target = staging / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    signature = staging / SIGNATURE_FILE
    signature.parent.mkdir(parents=True, exist_ok=True)
    signature.write_text(signature_text(bundle_digest(files), key))
    return staging


def generate_key(private_path: Path) -> ed25519.Ed25519PublicKey:
    """A fresh ed25519 key pair: `private_path` (OpenSSH, mode 600) and `<private_path>.pub`."""
    key = ed25519.Ed25519PrivateKey.generate()
    private_path.parent.mkdir(parents=True, exist_ok=True)
    private_path.touch(mode=0o600)
    private_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.OpenSSH,
            serialization.NoEncryption(),
        )
    )
    public = key.public_key()
    private_path.with_suffix(".pub").write_bytes(
        public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        + b" pollen-operator\n"
    )
    return public
