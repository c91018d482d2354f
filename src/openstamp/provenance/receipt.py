"""Signed receipts: a record of a test result that a third party can check, and later tie to the revealed key.

A receipt is one JSON object:

    format, kind (verify-model or detect), created (UTC), tool {name, version},
    files [{name, sha256, bytes}]   the model files the test read,
    keys  [{key_id, commitment}]    commitment = sha256("openstamp/key-commitment/v1" || salt || secret ||
                                    S || P || c || the numbers of key_id), one per key,
    result                          the statistic, the null, the p-value and the rest of the test's output,
    signature {algorithm: ed25519, public_key_sha256, value}

The signature is Ed25519 over the canonical JSON of every other field (sorted keys, no spaces, ASCII). The salt
(32 random bytes per key) goes to a private ``<receipt>.opening.json`` (mode 0600), never into the receipt: the
commitment then hides the key even where its factors are public, and the owner opens it later by revealing the
key directory and that file. Pure Python (cryptography); nothing here touches a model.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from openstamp.assets import sha256_file
from openstamp.errors import require_extra
from openstamp.key.key import WatermarkKey
from openstamp.storage import atomic_write_text, check_can_write

FORMAT = "openstamp-receipt/v1"
COMMITMENT_TAG = b"openstamp/key-commitment/v1"


def _crypto():
    require_extra("cryptography", "provenance", "signed receipts")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return serialization, ed25519


def generate_keypair(private_path: Path, public_path: Path, overwrite: bool = False) -> str:
    """Write a new Ed25519 private key (PKCS8 PEM, mode 0600) and its public key (PEM); returns its fingerprint."""
    serialization, ed25519 = _crypto()
    for path in (private_path, public_path):
        check_can_write(path, overwrite)
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    atomic_write_text(private_path, pem.decode(), mode=0o600)
    atomic_write_text(public_path, public.decode())
    return public_fingerprint(private.public_key())


def public_fingerprint(public_key) -> str:
    serialization, _ = _crypto()
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def load_private_key(path: Path):
    serialization, ed25519 = _crypto()
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (ValueError, TypeError) as err:
        raise ValueError(f"{path} is not an unencrypted PEM private key: {err}") from err
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ValueError(f"{path} is not an Ed25519 private key (make one with openstamp receipt keygen)")
    return key


def load_public_key(path: Path):
    serialization, ed25519 = _crypto()
    try:
        key = serialization.load_pem_public_key(Path(path).read_bytes())
    except ValueError as err:
        raise ValueError(f"{path} is not a PEM public key: {err}") from err
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ValueError(f"{path} is not an Ed25519 public key")
    return key


def key_commitment(key: WatermarkKey, salt: bytes) -> str:
    """sha256(tag || salt || secret || S || P || c || the numbers key_id covers), hex."""
    digest = hashlib.sha256(COMMITMENT_TAG + len(salt).to_bytes(2, "little") + salt)
    digest.update(len(key.secret).to_bytes(2, "little") + key.secret)
    factors = {"selector": key.selector, "projection": key.projection, "centring": key.centring}
    for name, tensor in factors.items():  # fp32, C order, as key.safetensors holds them
        if tensor is not None:
            digest.update(name.encode() + tensor.float().contiguous().numpy().tobytes())
    numbers = [key.gamma, key.delta, key.vocab_size, key.n_lists, key.hidden_size, sorted(key.never_green)]
    digest.update(json.dumps(numbers).encode())
    return digest.hexdigest()


def canonical(record: dict[str, Any]) -> bytes:
    """The signed bytes: every field but the signature, as sorted, compact, ASCII JSON."""
    body = {k: v for k, v in record.items() if k != "signature"}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def build_receipt(kind: str, result: dict[str, Any], files: list[str], keys: list[WatermarkKey], salts: list[bytes]):
    """The unsigned record (see the module docstring)."""
    from openstamp import __version__

    return {
        "format": FORMAT,
        "kind": kind,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "tool": {"name": "openstamp", "version": __version__},
        "files": [
            {"name": Path(f).name, "sha256": sha256_file(Path(f)), "bytes": Path(f).stat().st_size} for f in files
        ],
        "keys": [{"key_id": k.key_id, "commitment": key_commitment(k, s)} for k, s in zip(keys, salts, strict=True)],
        "result": result,
    }


def sign(record: dict[str, Any], private_key) -> dict[str, Any]:
    signature = private_key.sign(canonical(record))
    return {
        **record,
        "signature": {
            "algorithm": "ed25519",
            "public_key_sha256": public_fingerprint(private_key.public_key()),
            "value": base64.b64encode(signature).decode(),
        },
    }


def check_receipt_options(receipt: Path | None, signing_key: Path | None, local: bool = True) -> None:
    """Fail before any work: a receipt needs a readable signing key, a new, writable file and a local key."""
    if receipt is None and signing_key is None:
        return
    if not local:
        raise ValueError("--receipt needs local detection (--model and --key): the key is committed to")
    if receipt is None or signing_key is None:
        raise ValueError("--receipt and --signing-key go together")
    if Path(receipt).exists():
        raise FileExistsError(f"receipt {receipt} already exists; receipts are never overwritten")
    check_can_write(receipt)
    load_private_key(signing_key)


def write_receipt(
    path: Path, signing_key: Path, kind: str, result: dict[str, Any], files: list[str], key_dirs: list | Path
) -> dict[str, Any]:
    """Sign and write a receipt, and its private opening (the salts) beside it; returns the receipt."""
    key_dirs = key_dirs if isinstance(key_dirs, list) else [key_dirs]
    keys = [k if isinstance(k, WatermarkKey) else WatermarkKey.load(k) for k in key_dirs]
    salts = [secrets.token_bytes(32) for _ in keys]
    record = sign(build_receipt(kind, result, files, keys, salts), load_private_key(signing_key))
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    opening = {
        "receipt_sha256": hashlib.sha256(text.encode()).hexdigest(),
        "salts": {k.key_id: s.hex() for k, s in zip(keys, salts, strict=True)},
    }
    atomic_write_text(opening_path(path), json.dumps(opening, indent=2) + "\n", mode=0o600)
    atomic_write_text(path, text)
    return record


def opening_path(path: Path) -> Path:
    return Path(path).with_name(Path(path).name + ".opening.json")


def read_receipt(path: Path) -> dict[str, Any]:
    if not Path(path).is_file():
        raise FileNotFoundError(f"receipt {path} does not exist")
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{path} is not a JSON receipt: {err}") from err
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path} is not an OpenStamp receipt (format {FORMAT})")
    return record


def verify_receipt(
    record: dict[str, Any], public_key, key: WatermarkKey | None = None, opening: dict[str, Any] | None = None
) -> tuple[bool, str]:
    """(valid, why): the signature against ``public_key``, and with a revealed key and its opening, the
    commitment too."""
    from cryptography.exceptions import InvalidSignature

    signature = record.get("signature")
    if not isinstance(signature, dict) or signature.get("algorithm") != "ed25519":
        return False, "the receipt carries no Ed25519 signature"
    if signature.get("public_key_sha256") != public_fingerprint(public_key):
        return False, "the receipt was signed with another key than this public key"
    try:
        public_key.verify(base64.b64decode(signature.get("value", ""), validate=True), canonical(record))
    except (InvalidSignature, ValueError):
        return False, "the signature does not match the receipt's contents: it was altered, or signed elsewhere"
    if key is None:
        return True, "signature valid"
    entry = next((k for k in record.get("keys", []) if k.get("key_id") == key.key_id), None)
    salt = (opening or {}).get("salts", {}).get(key.key_id)
    if entry is None or salt is None:
        return False, f"the receipt (or its opening) has no commitment to key {key.key_id}"
    if key_commitment(key, bytes.fromhex(salt)) != entry.get("commitment"):
        return False, f"the revealed key {key.key_id} does not open the receipt's commitment"
    return True, f"signature valid; the revealed key {key.key_id} opens the commitment"


def model_files(spec: str) -> list[str]:
    """The files a detect receipt hashes: a .gguf file, or a model directory's safetensors and JSON files."""
    path = Path(spec).expanduser()
    if not path.exists():
        from openstamp.model.load import resolve_model_path

        path = Path(resolve_model_path(spec))
    if path.is_file():
        return [str(path)]
    return [str(p) for p in sorted(path.rglob("*")) if p.is_file() and p.suffix in (".safetensors", ".json", ".gguf")]


def write_detect_receipt(
    path: Path, signing_key: Path, model: str, keys: list, records: list[dict], inputs: list
) -> None:
    """``openstamp detect --receipt``: the per-text records (without token scores) of a local detection, each with
    the sha256 of its input (the text, or the conversation as compact JSON), so the texts need not be disclosed."""
    slim = []
    for record, item in zip(records, inputs, strict=True):
        data = item if isinstance(item, str) else json.dumps(item, sort_keys=True, separators=(",", ":"))
        kept = {k: v for k, v in record.items() if k not in ("token_scores", "tokens")}
        slim.append({**kept, "input_sha256": hashlib.sha256(data.encode("utf-8")).hexdigest()})
    write_receipt(path, signing_key, "detect", {"model": model, "records": slim}, model_files(model), list(keys))
