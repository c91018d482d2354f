"""Near copies: a release tensor that is not U~ but nearly parallel to it, or to the original U,
gives the watermark away even when it is not equal (``U~ - E = dW + (U - E)``).

The measure is the mean-centred cosine (:func:`similarity`), not a relative difference; see
``NEAR_COSINE``.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from openstamp.key.key import WatermarkKey
from openstamp.model.similarity import similarity
from openstamp.release.checkpoint import Checkpoint, Finding

# Two matrices whose mean-centred cosine is >= this are near copies. A watermark is not a small
# relative change: ||dW|| / ||U|| is 0.14 x delta on SmolLM2-135M (L = 16) and 0.6 x delta on the
# tiny test Llama, so U~ and U have cosine about 1 / sqrt(1 + r^2): 0.96 to 0.64 for r = 0.28 to
# 1.2, and any relative-difference threshold small enough to spare unrelated matrices would miss
# them. Unrelated matrices have cosine near 0; 0.5 flags r up to 1.7. Cosine ignores scale and a
# shared mean row, which a leak survives too: from X = cU + 1 m^T, U~ - (X - 1 m^T) / c = dW.
NEAR_COSINE = 0.5
EQUAL = 1e-5  # a relative difference below this is equality up to fp32 rounding (the exact-copy checks' case)


def check_near_copies(
    ckpt: Checkpoint,
    key: WatermarkKey | None = None,
    base: Checkpoint | None = None,
    base_name: str = "",
    near_cosine: float = NEAR_COSINE,
) -> list[Finding]:
    """High for a release matrix nearly parallel to U~, or to the original U.

    References, each against every other release matrix of its shape: the released U~ (lm_head
    against the input embeddings is :func:`check_tied`'s pair); with a key, U = U~ - dW; with a
    base, the base's U (U~ against it is :func:`check_base`'s). A near copy of U is the leak that
    matters, as U~ - X then holds dW; without key or base only U~ stands in for U, which works
    while ||dW|| is small next to ||U||. Equal tensors (up to rounding) are the exact-copy checks'.
    Pairs without U~ or U are not compared: the watermark lives in U~ alone.
    """
    ours = ckpt.unembedding()
    if ours is None:
        return []
    shape, head_pair = ckpt.shape(ours), {ours, ckpt.embed_name() if ckpt.head_name() else None}
    # (what, its row blocks, its shape, release tensors not to compare with it)
    references = [("the released unembedding " + ours, lambda: ckpt.blocks(ours), shape, head_pair)]
    if key is not None and shape == (key.vocab_size, key.hidden_size):
        what = "the original unembedding U (U~ - dW, from the key)"
        references.append((what, lambda: _minus_offset(ckpt, ours, key), shape, {ours}))
    if base is not None:
        base_u = {base.unembedding()}
        if base.head_name() is None or base.config.get("tie_word_embeddings"):
            base_u.add(base.embed_name())
        for u in sorted(base_u - {None}):
            references.append((f"{base_name}'s {u} (U)", lambda u=u: base.blocks(u), base.shape(u), {ours}))
    findings = []
    for what, blocks, like, skip in references:
        for name in (n for n in sorted(ckpt.index) if n not in skip and ckpt.shape(n) == like):
            near = similarity(ckpt.blocks(name), blocks())
            if near.cosine >= near_cosine and near.relative_difference > EQUAL:
                findings.append(
                    Finding(
                        "high",
                        "near copy",
                        f"{name} is a near copy of {what} (cosine >= {near_cosine}): their difference gives "
                        "the watermark's offset dW away, or most of it",
                        [near.describe()],
                    )
                )
    return findings


def _minus_offset(ckpt: Checkpoint, name: str, key: WatermarkKey) -> Iterator[torch.Tensor]:
    """Row blocks of ckpt[name] - dW: the original unembedding, when ckpt[name] is U~."""
    offset, start = key.delta_w(), 0
    for block in ckpt.blocks(name):
        yield block.float() - offset[start : start + len(block)]
        start += len(block)
