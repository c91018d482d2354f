"""``verify_model``: is this checkpoint a derivative of my release? Read, align, difference, test.

base, suspect  -> ModelWeights (readers.py)
vocabularies   -> aligned rows (align.py)
D = U_suspect - U_base on those rows (and the input embeddings' difference for a re-tied release)
T, share, p    -> weights.py: T = <Dc, Wc>_F, share = T / ||Wc||_F^2, p under random secrets
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from openstamp.errors import KeyMismatchError
from openstamp.key.key import WatermarkKey
from openstamp.model.patch import tensor_sha256, tied_head_mode
from openstamp.provenance.align import align
from openstamp.provenance.readers import ModelWeights, read_weights
from openstamp.provenance.weights import NULL, TEST, weights_test


@dataclass
class VerifyResult:
    """The evidence that ``suspect`` carries the key's offset: one JSON object (``to_dict``)."""

    suspect: str
    base: str
    key_id: str
    p_value: float
    statistic: float
    expected: float
    share: float
    rows_aligned: int
    rows_base: int
    rows_suspect: int
    alignment: str
    matrices: list[str]
    p_permutation: float
    p_tail: float | None
    n_permutations: int
    test: str
    null: str
    warnings: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list, repr=False)  # the suspect's files, for receipts

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("files")
        return data


def verify_model(
    suspect: str | os.PathLike | ModelWeights,
    key: str | os.PathLike | WatermarkKey,
    base: str | os.PathLike | ModelWeights,
    *,
    n_permutations: int = 9999,
    tail: bool = True,
    adapter_base: str | None = None,
    cache_dir: str | None = None,
) -> VerifyResult:
    """Test whether ``suspect`` holds the offset of ``key`` relative to ``base`` (the key's original model).

    ``suspect``: a model directory, .gguf or .safetensors file, LoRA adapter directory, packaged alias or hub id
    (or weights already read). Raises ValueError (KeyMismatchError, FileNotFoundError) for bad input.
    """
    key = key if isinstance(key, WatermarkKey) else WatermarkKey.load(key)
    base_w = base if isinstance(base, ModelWeights) else read_weights(base, cache_dir=cache_dir)
    warnings = check_base(base_w, key)
    suspect_w = (
        suspect
        if isinstance(suspect, ModelWeights)
        else read_weights(suspect, adapter_base=adapter_base, cache_dir=cache_dir)
    )
    check_compatible(suspect_w, base_w)
    alignment = align(base_w.tokens, key.vocab_size, suspect_w.tokens, suspect_w.head.shape[0])
    warnings += alignment.warnings
    b_rows, s_rows = alignment.base_rows, alignment.suspect_rows
    diffs, matrices = [suspect_w.head[s_rows] - base_w.head[b_rows]], ["lm_head"]
    if tied_head_mode(key) == "retie":  # the release's input embeddings hold U~ too
        if suspect_w.embed is None or base_w.embed is None or len(suspect_w.embed) <= int(s_rows.max()):
            warnings.append("the key's release is re-tied but the suspect's input embeddings could not be read")
        else:
            diffs.append(suspect_w.embed[s_rows] - base_w.embed[b_rows])
            matrices.append("input_embeddings")
    stat = weights_test(diffs, b_rows, key, n_permutations, tail)
    if all(torch.equal(d, torch.zeros_like(d)) for d in diffs):
        warnings.append("the suspect's matrices equal the base's on every aligned row")
    return VerifyResult(
        suspect=suspect_w.source,
        base=base_w.source,
        key_id=key.key_id,
        p_value=stat.p_value,
        statistic=stat.statistic,
        expected=stat.expected,
        share=stat.share,
        rows_aligned=alignment.rows,
        rows_base=key.vocab_size,
        rows_suspect=suspect_w.head.shape[0],
        alignment=alignment.how,
        matrices=matrices,
        p_permutation=stat.p_permutation,
        p_tail=stat.p_tail,
        n_permutations=n_permutations,
        test=TEST.format(k=n_permutations),
        null=NULL,
        warnings=warnings,
        files=[str(Path(f)) for f in suspect_w.files],
    )


def check_base(base: ModelWeights, key: WatermarkKey) -> list[str]:
    """Refuse a base of another shape than the key's; warn when its head is not the key's recorded original."""
    if tuple(base.head.shape) != (key.vocab_size, key.hidden_size):
        raise KeyMismatchError(
            f"the base's unembedding is {tuple(base.head.shape)}, but key {key.key_id} is for "
            f"({key.vocab_size}, {key.hidden_size}): give the base the release was made from"
        )
    recorded = key.meta.get("fingerprint", {})
    digest = tensor_sha256(base.head)
    if digest == recorded.get("watermarked", {}).get("float32"):
        raise KeyMismatchError("the base given is the watermarked release itself; give the original model")
    if recorded.get("original") and digest != recorded["original"].get("float32"):
        return [f"the base's lm_head is not the original that key {key.key_id} records (fingerprint differs)"]
    return []


def check_compatible(suspect: ModelWeights, base: ModelWeights) -> None:
    """Refuse a suspect of another hidden size or architecture than the base."""
    if suspect.hidden_size != base.hidden_size:
        raise ValueError(
            f"the suspect's hidden size is {suspect.hidden_size}, the base's {base.hidden_size}: "
            "a model of another size cannot be a derivative of this release"
        )
    known = suspect.architecture and base.architecture
    if known and suspect.architecture.lower() != base.architecture.lower():
        raise ValueError(
            f"the suspect is a {suspect.architecture} model, the base a {base.architecture} model: "
            "another architecture cannot be a derivative of this release"
        )
