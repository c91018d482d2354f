"""Helpers shared by the baseline methods: keyed Gaussian noise, per-method secrets, key files, tokenising.

Every random quantity of a baseline (a bias vector, a weight perturbation, a green list) is a
SHAKE-256 stream of ``domain || len(secret) || secret || index``, read with an explicit byte
order, so the same secret gives the same values on any machine and any numpy or torch version.
Gaussians come from Box-Muller in float64 and are rounded to float32, which hides the last-ulp
differences that vectorised ``log``/``cos`` implementations may show across CPUs.

Key directories hold ``config.json`` (the method's settings) and ``key.safetensors``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedTokenizerBase

from openstamp.model.text import bos_prefix, encode


def method_secret(name: str, seed: int) -> bytes:
    """The 32-byte secret of method ``name`` built with ``seed``."""
    return hashlib.sha256(f"openstamp/eval/{name}/{seed}".encode()).digest()


def keyed_bytes(secret: bytes, domain: bytes, index: int, n_bytes: int) -> bytes:
    """``n_bytes`` of the SHAKE-256 stream keyed by ``(domain, secret, index)``."""
    if not secret:
        raise ValueError("the secret must not be empty")
    if not 0 <= index < 2**32:
        raise ValueError(f"stream index {index} out of range")
    xof = hashlib.shake_256(domain + len(secret).to_bytes(2, "little") + secret + index.to_bytes(4, "little"))
    return xof.digest(n_bytes)


def keyed_uint32(secret: bytes, domain: bytes, index: int, n: int) -> np.ndarray:
    """uint32 values, shape (n,). Value ``i`` does not depend on ``n`` (prefix-stable)."""
    return np.frombuffer(keyed_bytes(secret, domain, index, 4 * n), dtype="<u4")


def keyed_normal(secret: bytes, domain: bytes, n: int, index: int = 0) -> torch.Tensor:
    """Standard normal values (mean 0, std 1), float32 shape (n,), prefix-stable in ``n``.

    Pair ``j`` uses uniforms ``u1, u2`` in (0, 1) from two 53-bit words of the stream and
    gives ``sqrt(-2 ln u1) * (cos 2 pi u2, sin 2 pi u2)``.
    """
    pairs = (n + 1) // 2
    words = np.frombuffer(keyed_bytes(secret, domain, index, 16 * pairs), dtype="<u8").reshape(pairs, 2)
    uniform = ((words >> np.uint64(11)).astype(np.float64) + 0.5) / 2.0**53
    radius = np.sqrt(-2.0 * np.log(uniform[:, 0]))
    angle = 2.0 * np.pi * uniform[:, 1]
    values = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1).reshape(-1)[:n]
    return torch.from_numpy(values.astype(np.float32))


# -- key files --------------------------------------------------------------------------------


def save_key(directory: Path, config: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Write ``config.json`` and ``key.safetensors`` into ``directory``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True) + "\n")
    save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(directory / "key.safetensors"))


def load_key(directory: Path, config_class: type) -> tuple[Any, dict[str, torch.Tensor]]:
    """Read what ``save_key`` wrote: the config (validated again) and the tensors."""
    directory = Path(directory)
    for name in ("config.json", "key.safetensors"):
        if not (directory / name).exists():
            raise FileNotFoundError(f"{directory} is not a baseline key directory (no {name})")
    config = config_class(**json.loads((directory / "config.json").read_text()))
    return config, load_file(str(directory / "key.safetensors"))


def key_digest(directory: Path) -> str:
    """sha256 of the tensors in every ``*.safetensors`` file under a key directory (names, dtypes, shapes, bytes).

    Two keys with one digest hold bit-identical tensors, so a run's results can say which key made
    them, and a key rebuilt from its seed elsewhere can be checked against the one a run used.
    """
    digest = hashlib.sha256()
    for path in sorted(Path(directory).rglob("*.safetensors")):
        tensors = load_file(str(path))
        digest.update(path.relative_to(directory).as_posix().encode())
        for name in sorted(tensors):
            t = tensors[name].contiguous()
            digest.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def secret_tensor(secret: bytes) -> torch.Tensor:
    """The secret as a uint8 tensor (for safetensors)."""
    return torch.tensor(list(secret), dtype=torch.uint8)


# -- texts to scored tokens -------------------------------------------------------------------


def scored_sequences(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> tuple[list[list[int]], int, list[int]]:
    """Tokenise texts for scoring.

    Returns the sequences (BOS prefix, if the tokenizer uses one, plus the text's tokens),
    the index of the first scored token in every sequence (the prefix length, or 1 without a
    prefix: the first token has no context), and each text's number of scored tokens.
    """
    prefix = bos_prefix(tokenizer)
    seqs = [prefix + ids for ids in encode(tokenizer, texts)]
    first = len(prefix) if prefix else 1
    return seqs, first, [max(len(s) - first, 0) for s in seqs]


def right_padded(seqs: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad sequences: ids and attention mask, long (B, T). Causal models need no position ids."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        mask[i, : len(seq)] = 1
    return ids, mask


def scored_mask(mask: torch.Tensor, first: int) -> torch.Tensor:
    """bool (B, T): positions whose token is scored (inside the text, from index ``first``)."""
    scored = mask.bool().clone()
    scored[:, :first] = False
    return scored
