"""Write the offset into a model's lm_head, take it out again, and fingerprint heads.

One of the few modules that touch a ``PreTrainedModel``. Tied weights are checked
(and untied) before any weight is patched, so the input embeddings stay bit-identical.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from openstamp.key.key import KeyMismatchError, WatermarkKey

log = logging.getLogger(__name__)

FINGERPRINT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TIED_WARNING = (
    "this model ties lm_head to its input embeddings: the released checkpoint's input embeddings "
    "are the original unembedding U, so anyone can compute U~ - U and subtract the watermark. "
    "Prefer an untied model, or accept that this release is not removal-resistant."
)


@functools.cache
def _warn_tied_once() -> None:
    """Log the tied-head warning once per process (attacks and sweeps patch many copies of one model)."""
    log.warning(TIED_WARNING)


@dataclass
class PatchState:
    """What ``apply_watermark`` changed, so ``revert_watermark`` can undo it exactly."""

    original: torch.Tensor
    was_tied: bool


def head(model: PreTrainedModel) -> torch.nn.Module:
    out = model.get_output_embeddings()
    if out is None or not hasattr(out, "weight"):
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head) to watermark")
    return out


def is_tied(model: PreTrainedModel) -> bool:
    """True when lm_head shares its weight with the input embeddings."""
    inp = model.get_input_embeddings()
    return inp is not None and head(model).weight.data_ptr() == inp.weight.data_ptr()


def untie(model: PreTrainedModel) -> bool:
    """Give lm_head its own copy of the weight. Returns whether it was tied."""
    if not is_tied(model):
        return False
    out = head(model)
    out.weight = torch.nn.Parameter(out.weight.detach().clone(), requires_grad=out.weight.requires_grad)
    model.config.tie_word_embeddings = False
    text_config = model.config.get_text_config()
    if text_config is not model.config:
        text_config.tie_word_embeddings = False
    return True


def tensor_sha256(tensor: torch.Tensor) -> str:
    data = tensor.detach().contiguous().cpu()
    return hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()


def head_digests(weight: torch.Tensor) -> dict[str, str]:
    """sha256 of a head weight as stored and cast to each common dtype.

    A checkpoint saved in fp32 and loaded as bf16 still matches, because the cast is exact
    and deterministic.
    """
    digests = {}
    for name, dtype in FINGERPRINT_DTYPES.items():
        if dtype == weight.dtype or _is_narrower(dtype, weight.dtype):
            digests[name] = tensor_sha256(weight.to(dtype))
    return digests


def _is_narrower(dtype: torch.dtype, than: torch.dtype) -> bool:
    return torch.finfo(dtype).bits < torch.finfo(than).bits


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@torch.no_grad()
def apply_watermark(model: PreTrainedModel, key: WatermarkKey) -> PatchState:
    """Untie if needed, then set lm_head to U + dW (dW in fp32, cast to the model's dtype)."""
    weight = head(model).weight
    if tuple(weight.shape) != (key.vocab_size, key.hidden_size):
        raise KeyMismatchError(
            f"key is for an unembedding of shape ({key.vocab_size}, {key.hidden_size}); "
            f"this model's lm_head is {tuple(weight.shape)}"
        )
    recorded = key.meta.get("fingerprint", {}).get("watermarked", {})
    if hasattr(model, "_openstamp_patch") or recorded.get(dtype_name(weight.dtype)) == tensor_sha256(weight):
        raise ValueError("this model already carries this OpenStamp watermark; revert it first")
    was_tied = untie(model)
    if was_tied:
        _warn_tied_once()
    weight = head(model).weight
    state = PatchState(original=weight.detach().clone(), was_tied=was_tied)
    delta = key.delta_w().to(weight.device)
    weight.copy_((weight.float() + delta).to(weight.dtype))
    model._openstamp_patch = state
    return state


@torch.no_grad()
def revert_watermark(model: PreTrainedModel, key: WatermarkKey, base: PreTrainedModel | None = None) -> str:
    """Restore the original lm_head. Returns how: ``exact`` or ``subtracted``.

    Exact when this process applied the watermark, when a ``base`` model is given,
    or when the key records a tied model (the input embeddings are the original U).
    Otherwise U = U~ - dW, exact up to one fp32 rounding per weight.
    """
    weight = head(model).weight
    state: PatchState | None = getattr(model, "_openstamp_patch", None)
    if state is not None:
        weight.copy_(state.original)
        del model._openstamp_patch
        if state.was_tied:
            _retie(model)
        return "exact"
    if base is not None:
        weight.copy_(head(base).weight.to(weight.dtype))
        return "exact"
    if key.meta.get("model", {}).get("tied"):
        weight.copy_(model.get_input_embeddings().weight)
        _retie(model)
        return "exact"
    weight.copy_((weight.float() - key.delta_w().to(weight.device)).to(weight.dtype))
    return "subtracted"


def _retie(model: PreTrainedModel) -> None:
    model.config.tie_word_embeddings = True
    text_config = model.config.get_text_config()
    if text_config is not model.config:
        text_config.tie_word_embeddings = True
    head(model).weight = model.get_input_embeddings().weight


def check_key(model: PreTrainedModel, key: WatermarkKey) -> str:
    """Which head does this model carry: ``watermarked`` or ``original``? Raises KeyMismatchError."""
    weight = head(model).weight
    if tuple(weight.shape) != (key.vocab_size, key.hidden_size):
        raise KeyMismatchError(
            f"wrong key for this model: the key was made for an lm_head of shape "
            f"({key.vocab_size}, {key.hidden_size}), this model's is {tuple(weight.shape)}"
        )
    recorded = key.meta.get("fingerprint", {})
    digest = tensor_sha256(weight)
    for which in ("watermarked", "original"):
        if recorded.get(which, {}).get(dtype_name(weight.dtype)) == digest:
            return which
    raise KeyMismatchError(
        f"wrong key for this model: key {key.key_id} was made for a model whose lm_head has sha256 "
        f"{recorded.get('watermarked', {}).get('float32', '?')[:12]}... (watermarked) or "
        f"{recorded.get('original', {}).get('float32', '?')[:12]}... (original); this model's "
        f"{dtype_name(weight.dtype)} lm_head is {digest[:12]}..."
    )
