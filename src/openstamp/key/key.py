"""The watermark key: one object for embedding and for detection.

On disk a key is a private directory:

* ``key.json``          settings, statistics, fingerprints, versions (no secret);
* ``key.safetensors``   P (``projection``, absent when P = I), S (``selector``) and, for a centred key, the
                        frequency-weighted green mass of each list (``centring``);
* ``secret``            the raw secret bytes, mode 0600.

Pure tensor code: nothing here touches a ``PreTrainedModel``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from openstamp.errors import InvalidKeyError, KeyMismatchError  # noqa: F401  (re-exported)
from openstamp.key.prf import PRF_VERSION, green_lists
from openstamp.storage import atomic_directory, atomic_write_json, read_json

KEY_FORMAT = 2  # 2: key_id covers the header's numbers, and a checksum covers the model record
CENTRED_FORMAT = 3  # 3: a centred key (a ``centring`` tensor), which earlier versions must refuse
READS_FORMATS = (1, 2, 3)
# 2: the checksum covers the whole header (calibration and config included); keys without the field (1) were
# written before, and their checksum covers only the model record: they load with a warning
CHECKSUM_VERSION = 2
REQUIRED = ("format", "key_id", "prf_version", "gamma", "delta", "n_lists", "hidden_size", "vocab_size")


@dataclass(eq=False)
class WatermarkKey:
    """Everything needed to compute ``dW = G S P``.

    Attributes:
        secret: PRF secret (never printed or logged).
        selector: S, fp32 (L, d).
        projection: P, fp32 (d, d), or None for P = I.
        gamma, delta: green fraction and strength.
        vocab_size: rows of the unembedding (|V|).
        never_green: token ids that are in no green list (special tokens, padding rows).
        meta: settings, statistics and fingerprints, stored in key.json.
        centring: c = G^T w, fp32 (L,), the green mass of each list under token frequencies w, or None. A centred
            key's offset is dW = delta (G - 1 c^T) S P: its frequency-weighted mean row is 0, so a re-tied input
            embedding moves less, while each output row h only shifts by a constant (delta c^T S P h), which the
            softmax, and so every output distribution and LLR, ignores.
    """

    secret: bytes = field(repr=False)
    selector: torch.Tensor
    projection: torch.Tensor | None
    gamma: float
    delta: float
    vocab_size: int
    never_green: list[int] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    centring: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if len(self.secret) < 16:
            raise ValueError("the secret must be at least 16 bytes (128 bits)")
        d = self.selector.shape[1]
        if self.projection is not None and tuple(self.projection.shape) != (d, d):
            raise ValueError(f"projection shape {tuple(self.projection.shape)} does not match selector width {d}")
        if self.centring is not None and tuple(self.centring.shape) != (self.selector.shape[0],):
            raise ValueError(f"centring shape {tuple(self.centring.shape)} does not match {self.n_lists} lists")

    # -- shapes and derived matrices -----------------------------------------------------------

    @property
    def n_lists(self) -> int:
        return self.selector.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.selector.shape[1]

    @cached_property
    def key_id(self) -> str:
        """A public identifier: a hash of the secret, the factors and every number that shapes dW.

        It reveals none of them. Editing ``gamma``, ``delta``, ``vocab_size`` or ``never_green``
        in key.json changes it, so ``load`` refuses the edit; a key derived in memory with
        ``dataclasses.replace(key, delta=...)`` gets its own id.
        """
        numbers = {
            "gamma": self.gamma,
            "delta": self.delta,
            "vocab_size": self.vocab_size,
            "n_lists": self.n_lists,
            "hidden_size": self.hidden_size,
            "never_green": sorted(self.never_green),
        }
        digest = self._factor_digest(b"openstamp/key-id/v2")
        digest.update(json.dumps(numbers, sort_keys=True).encode())
        return digest.hexdigest()[:16]

    def _factor_digest(self, tag: bytes):
        digest = hashlib.sha256(tag + self.secret)
        digest.update(self.selector.numpy().tobytes())
        if self.projection is not None:
            digest.update(self.projection.numpy().tobytes())
        if self.centring is not None:
            digest.update(b"centring" + self.centring.numpy().tobytes())
        return digest

    def _legacy_key_id(self) -> str:
        """Format 1's id: the secret and the factors only."""
        return self._factor_digest(b"openstamp/key-id/v1").hexdigest()[:16]

    def checksum(self, version: int = CHECKSUM_VERSION) -> str:
        """sha256 of the key id and the header's other fields.

        Version 2 covers every field of ``meta``: the calibration and config change decisions, and an edit
        to any of them must be refused. Version 1 (keys written before the field existed) covered the
        model record only (source, tied-head mode, fingerprints, and a backbone repair where there was one).
        """
        if version >= 2:
            record = dict(self.meta)
        else:
            record = {k: self.meta.get(k) for k in ("model", "fingerprint")}
            if "repair" in self.meta:  # absent from keys without one, whose checksums stay as they were
                record["repair"] = self.meta["repair"]
        return hashlib.sha256(json.dumps([self.key_id, record], sort_keys=True).encode()).hexdigest()

    @cached_property
    def green(self) -> torch.Tensor:
        """G's membership, bool (V, L)."""
        excluded = torch.zeros(self.vocab_size, dtype=torch.bool)
        excluded[torch.tensor(self.never_green, dtype=torch.long)] = True
        return green_lists(self.secret, self.n_lists, self.vocab_size, self.gamma, excluded)

    @cached_property
    def green_float(self) -> torch.Tensor:
        """G's membership as fp32 (V, L), for matrix products."""
        return self.green.float()

    @cached_property
    def selector_weights(self) -> torch.Tensor:
        """S P, fp32 (L, d): maps a hidden state to its selector values."""
        if self.projection is None:
            return self.selector.float()
        return (self.selector.double() @ self.projection.double()).float()

    def selector_values(self, hidden: torch.Tensor) -> torch.Tensor:
        """s = S P h in fp32. hidden: (..., d) -> (..., L)."""
        weights = self.selector_weights.to(hidden.device)
        return hidden.float() @ weights.T

    def watermark_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """dW h = delta * G s in fp32, through the low-rank factors. (..., d) -> (..., V)."""
        green = self.green_float.to(hidden.device)
        return self.delta * (self.selector_values(hidden) @ green.T)

    def delta_w(self) -> torch.Tensor:
        """The materialised offset dW = delta * G S P, fp32 (V, d); centred, delta * (G S P - 1 c^T S P)."""
        offset = self.green_float @ self.selector_weights
        if self.centring is not None:
            offset -= (self.centring.float() @ self.selector_weights)[None, :]
        return self.delta * offset

    # -- persistence -------------------------------------------------------------------------

    def save(self, directory: str | os.PathLike, overwrite: bool = False) -> Path:
        """Write the key directory atomically; the secret file gets mode 0600."""
        with atomic_directory(directory, overwrite=overwrite) as tmp:
            os.chmod(tmp, 0o700)
            tensors = {"selector": self.selector.contiguous()}
            if self.projection is not None:
                tensors["projection"] = self.projection.contiguous()
            if self.centring is not None:
                tensors["centring"] = self.centring.contiguous()
            save_file(tensors, str(tmp / "key.safetensors"))
            fd = os.open(tmp / "secret", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(self.secret)
            atomic_write_json(tmp / "key.json", self._header())
        return Path(directory)

    def _header(self) -> dict[str, Any]:
        return {
            "format": KEY_FORMAT if self.centring is None else CENTRED_FORMAT,
            "key_id": self.key_id,
            "prf_version": PRF_VERSION,
            "gamma": self.gamma,
            "delta": self.delta,
            "n_lists": self.n_lists,
            "hidden_size": self.hidden_size,
            "vocab_size": self.vocab_size,
            "projection": self.projection is not None,
            "never_green": self.never_green,
            **self.meta,
            "checksum_version": CHECKSUM_VERSION,
            "checksum": self.checksum(),
        }

    def write_header(self, directory: str | os.PathLike) -> None:
        """Rewrite key.json atomically from this key (after ``meta`` changed: a calibration), with a fresh checksum."""
        atomic_write_json(Path(directory) / "key.json", self._header())

    @classmethod
    def load(cls, directory: str | os.PathLike) -> WatermarkKey:
        """Read a key directory; anything missing, corrupt or edited raises a one-line InvalidKeyError."""
        directory = Path(directory)
        if not directory.is_dir():
            raise InvalidKeyError(f"key directory {directory} does not exist")
        for name in ("key.json", "key.safetensors", "secret"):
            if not (directory / name).exists():
                raise InvalidKeyError(f"key directory {directory} has no {name}; is this an OpenStamp key?")
        try:
            header = read_json(directory / "key.json", "key file")
        except ValueError as err:
            raise InvalidKeyError(str(err).splitlines()[0]) from err
        if not isinstance(header, dict):
            raise InvalidKeyError(f"{directory / 'key.json'} is not a JSON object")
        fmt = header.get("format")
        if fmt not in READS_FORMATS or header.get("prf_version") != PRF_VERSION:
            raise InvalidKeyError(
                f"key {directory} has format {fmt} / PRF {header.get('prf_version')}; "
                f"this version of OpenStamp reads formats {READS_FORMATS} / {PRF_VERSION}"
            )
        missing = [name for name in (*REQUIRED, *(("checksum",) if fmt >= 2 else ())) if name not in header]
        if missing:
            raise InvalidKeyError(f"{directory / 'key.json'} lacks {', '.join(missing)}")
        try:
            tensors = load_file(str(directory / "key.safetensors"))
        except (SafetensorError, OSError) as err:
            raise InvalidKeyError(f"{directory / 'key.safetensors'} is corrupt: {err}") from err
        needed = ["selector", *(["projection"] if header.get("projection") else [])]
        needed += ["centring"] if fmt >= CENTRED_FORMAT else []
        for what in needed:
            if what not in tensors:
                raise InvalidKeyError(f"{directory / 'key.safetensors'} lacks the {what} tensor")
        version = header.get("checksum_version", 1)
        if fmt >= 2 and (type(version) is not int or not 1 <= version <= CHECKSUM_VERSION):
            raise InvalidKeyError(f"{directory / 'key.json'} has checksum_version {version!r}; this version reads 1-2")
        skip = {*REQUIRED, "projection", "never_green", "checksum", "checksum_version"}
        meta = {k: v for k, v in header.items() if k not in skip}
        try:
            key = cls(
                secret=(directory / "secret").read_bytes(),
                selector=tensors["selector"],
                projection=tensors.get("projection"),
                gamma=float(header["gamma"]),
                delta=float(header["delta"]),
                vocab_size=int(header["vocab_size"]),
                never_green=[int(t) for t in header.get("never_green", [])],
                meta=meta,
                centring=tensors.get("centring") if fmt >= CENTRED_FORMAT else None,
            )
            shape_ok = (key.n_lists, key.hidden_size) == (int(header["n_lists"]), int(header["hidden_size"]))
        except (TypeError, ValueError) as err:
            raise InvalidKeyError(f"key {directory} is corrupt: {str(err).splitlines()[0]}") from err
        expected = key.key_id if fmt >= 2 else key._legacy_key_id()
        if not shape_ok or expected != header["key_id"]:
            raise InvalidKeyError(
                f"key {directory}: key.json does not match the secret and factors (key id differs; "
                "were gamma, delta, vocab_size, never_green or a tensor edited?)"
            )
        if fmt >= 2 and key.checksum(version) != header["checksum"]:
            edited = " was edited" if version >= 2 else "'s model record or fingerprints were edited"
            raise InvalidKeyError(f"key {directory}: key.json{edited} (its checksum does not match)")
        if version < CHECKSUM_VERSION and {"calibration", "config"} & set(meta):
            logging.getLogger(__name__).warning(
                "key %s was written by an older OpenStamp: its checksum does not cover its calibration or config, "
                "so an edit to them goes unnoticed; re-save it (openstamp calibrate rewrites it) to cover them",
                directory,
            )
        return key
