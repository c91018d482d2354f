"""Keyed green lists: ``G[i, l] = 1`` iff ``PRF(secret, l, i) < gamma``.

The PRF is SHAKE-256 in counter-free XOF mode: list ``l`` reads the stream of
``SHAKE256(domain || len(secret) || secret || l)`` as little-endian uint32 values, one
per token id. It depends only on ``hashlib`` and explicit byte order, so the same
secret gives a bit-identical ``G`` on any machine, numpy or torch version. Token ``i``'s
value does not depend on the vocabulary size (an XOF stream is prefix-stable), and list
``l`` = 0 is keyed like any other list.
"""

from __future__ import annotations

import hashlib
import secrets as _secrets

import numpy as np
import torch

PRF_VERSION = "shake256-u32/v1"
_DOMAIN = b"openstamp/green-list/v1"
SECRET_BYTES = 32


def new_secret() -> bytes:
    """A fresh random 256-bit secret."""
    return _secrets.token_bytes(SECRET_BYTES)


def list_values(secret: bytes, list_index: int, vocab_size: int) -> np.ndarray:
    """The PRF values of one list as uint32, shape (vocab_size,)."""
    if not secret:
        raise ValueError("the secret must not be empty")
    if not 0 <= list_index < 2**32:
        raise ValueError(f"list index {list_index} out of range")
    xof = hashlib.shake_256(_DOMAIN + len(secret).to_bytes(2, "little") + secret + list_index.to_bytes(4, "little"))
    return np.frombuffer(xof.digest(4 * vocab_size), dtype="<u4")


def green_threshold(gamma: float) -> int:
    """Integer threshold: a PRF value is green iff it is below this."""
    if not 0.0 < gamma < 1.0:
        raise ValueError(f"gamma must be in (0, 1), got {gamma}")
    return int(round(gamma * 2**32))


def green_lists(
    secret: bytes,
    n_lists: int,
    vocab_size: int,
    gamma: float,
    excluded: torch.Tensor | None = None,
) -> torch.Tensor:
    """Membership matrix of the ``n_lists`` green lists.

    Args:
        secret: the key's secret bytes.
        n_lists: L.
        vocab_size: |V|, rows of the model's unembedding.
        gamma: green fraction.
        excluded: optional bool (vocab_size,), token ids that are never green
            (padding rows beyond the tokenizer, special tokens).

    Returns:
        bool tensor (vocab_size, n_lists).
    """
    threshold = green_threshold(gamma)
    columns = [list_values(secret, index, vocab_size) < threshold for index in range(n_lists)]
    green = torch.from_numpy(np.stack(columns, axis=1))
    if excluded is not None:
        green[excluded] = False
    return green


def green_digest(green: torch.Tensor) -> str:
    """sha256 of the packed membership bits, for reproducibility checks."""
    packed = np.packbits(green.numpy().astype(np.uint8), axis=None)
    return hashlib.sha256(packed.tobytes()).hexdigest()


def permutations(secret: bytes, n_lists: int, count: int) -> torch.Tensor:
    """``count`` keyed permutations of the L list indices, long (count, L).

    Drawn from the same PRF family with their own domain, so they are reproducible and
    independent of G. Used by the permutation test that re-maps which green list each
    cluster selects.
    """
    rows = []
    for k in range(count):
        xof = hashlib.shake_256(
            b"openstamp/permutation/v1" + len(secret).to_bytes(2, "little") + secret + k.to_bytes(4, "little")
        )
        values = np.frombuffer(xof.digest(8 * n_lists), dtype="<u8")
        rows.append(np.argsort(values, kind="stable"))
    return torch.from_numpy(np.stack(rows)) if rows else torch.empty(0, n_lists, dtype=torch.long)
