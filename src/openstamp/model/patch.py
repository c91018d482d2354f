"""Write the offset into a model's unembedding, take it out again, and fingerprint heads.

One of the few modules that touch a ``PreTrainedModel``. Tied weights are checked before
any weight is patched. A tied model is kept tied by default (``retie``): lm_head and the
input embeddings stay one tensor holding ``U~ = U + dW``, so the release holds no copy of
``U``. ``untie`` gives lm_head its own copy and leaves the input embeddings (= ``U``) alone,
which leaks the offset; it exists for comparison and for backbones that must stay unchanged.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from openstamp.key.key import KeyMismatchError, WatermarkKey

log = logging.getLogger(__name__)

FINGERPRINT_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
TIED_HEAD_MODES = ("retie", "untie")
TIED_WARNING = (
    "this model ties lm_head to its input embeddings and was exported with --tied-head untie: the "
    "released checkpoint's input embeddings are the original unembedding U, so anyone can compute "
    "U~ - U and subtract the watermark. The default (--tied-head retie) does not leak U."
)
RETIE_SHIFT_WARN = 0.5  # ||dW|| / ||U|| above this in a re-tied release: the input embeddings move as much as that
RETIE_WARNING = (
    "the offset is {ratio:.2f} times the size of the unembedding (||dW|| / ||U||), and this re-tied release's input "
    "embeddings move by as much: its text may fall apart. Choose a smaller delta for this model (openstamp tune, or "
    "embed --delta auto). With the projected profile (0.1.0's default) at delta 1 it is 0.42 on SmolLM2-135M and "
    "1.08 on Qwen2.5-Coder-0.5B, whose re-tied release no longer writes language; the default key of 0.2.0 "
    "(delta 0.386, centred) reads 0.04 and 0.06 (benchmarks/results/offset_size*.json)."
)
REPAIRED_ERROR = (
    "key {key_id} belongs to a release whose backbone was repaired (embed --repair-minutes): its layers exist only "
    "in the released checkpoint, and the original model gives other hidden states. Detect with the released "
    "checkpoint"
)
FORCE_HINT = "pass --force (DetectConfig(check_key=False)) to score anyway"


@functools.cache
def _warn_tied_once() -> None:
    """Log the untie warning once per process (attacks and sweeps patch many copies of one model)."""
    log.warning(TIED_WARNING)


@dataclass
class PatchState:
    """What ``apply_watermark`` changed, so ``revert_watermark`` can undo it exactly."""

    original: torch.Tensor
    mode: str  # retie, untie or untied-base

    @property
    def was_tied(self) -> bool:
        return self.mode != "untied-base"


def head(model: PreTrainedModel) -> torch.nn.Module:
    out = model.get_output_embeddings()
    if out is None or not hasattr(out, "weight"):
        raise ValueError(f"{type(model).__name__} has no output embedding (lm_head) to watermark")
    return out


def is_tied(model: PreTrainedModel) -> bool:
    """True when lm_head shares its weight with the input embeddings."""
    inp = model.get_input_embeddings()
    return inp is not None and head(model).weight.data_ptr() == inp.weight.data_ptr()


def _set_tied_config(model: PreTrainedModel, tied: bool) -> None:
    model.config.tie_word_embeddings = tied
    text_config = model.config.get_text_config()
    if text_config is not model.config:
        text_config.tie_word_embeddings = tied


def untie(model: PreTrainedModel) -> bool:
    """Give lm_head its own copy of the weight. Returns whether it was tied."""
    if not is_tied(model):
        return False
    out = head(model)
    out.weight = torch.nn.Parameter(out.weight.detach().clone(), requires_grad=out.weight.requires_grad)
    _set_tied_config(model, False)
    return True


def tied_head_mode(key: WatermarkKey) -> str:
    """How the key's release treats a tied head: ``retie``, ``untie`` or ``untied-base``.

    Keys written before re-tying existed record only ``tied``; those releases were untied.
    """
    model = key.meta.get("model", {})
    return model.get("tied_head") or ("untie" if model.get("tied") else "untied-base")


def release_tied_head(key: WatermarkKey) -> str:
    """The ``tied_head`` argument that rebuilds the key's release: ``untie`` for an untied release, else ``retie``."""
    return "untie" if tied_head_mode(key) == "untie" else "retie"


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
def apply_watermark(
    model: PreTrainedModel, key: WatermarkKey, tied_head: str = "retie", *, source: str | None = None
) -> PatchState:
    """Set the unembedding to U + dW (dW in fp32, cast to the model's dtype) and fingerprint it.

    ``tied_head`` matters only when lm_head is tied to the input embeddings: ``retie`` (the
    default) writes U~ into the one shared tensor; ``untie`` gives lm_head its own copy first
    (the input embeddings stay U, which leaks the offset). The model's identity, the mode and
    the sha256 of the original and watermarked heads go into ``key.meta`` unless the key
    already holds them; a key that records another original head is refused.
    """
    if tied_head not in TIED_HEAD_MODES:
        raise ValueError(f"tied_head must be one of {TIED_HEAD_MODES}, not {tied_head!r}")
    weight = head(model).weight
    if tuple(weight.shape) != (key.vocab_size, key.hidden_size):
        raise KeyMismatchError(
            f"key is for an unembedding of shape ({key.vocab_size}, {key.hidden_size}); "
            f"this model's lm_head is {tuple(weight.shape)}"
        )
    recorded, digest = _own_fingerprint(key), tensor_sha256(weight)
    if hasattr(model, "_openstamp_patch") or recorded.get("watermarked", {}).get(dtype_name(weight.dtype)) == digest:
        raise ValueError("this model already carries this OpenStamp watermark; revert it first")
    if recorded.get("original", {}).get(dtype_name(weight.dtype), digest) != digest:
        raise KeyMismatchError(f"key {key.key_id} records another original lm_head than this model's")
    mode = tied_head if is_tied(model) else "untied-base"
    if mode == "untie":
        untie(model)
        _warn_tied_once()
    weight = head(model).weight  # retie: still the tensor the input embeddings share
    state = PatchState(original=weight.detach().clone(), mode=mode)
    weight.copy_((weight.float() + key.delta_w().to(weight.device)).to(weight.dtype))
    model._openstamp_patch = state
    if not recorded:
        _record(key, model, state, source or getattr(model.config, "name_or_path", "") or "unknown")
    return state


def _own_fingerprint(key: WatermarkKey) -> dict:
    """The key's fingerprint record if it was made with this very key (same key id), else {}.

    Keys derived with another ``delta`` (``dataclasses.replace``) carry their parent's record;
    its watermarked digest is not theirs, so they record their own.
    """
    made_with = key.meta.get("model", {}).get("key_id")
    return (key.meta.get("fingerprint") or {}) if made_with == key.key_id else {}


def _record(key: WatermarkKey, model: PreTrainedModel, state: PatchState, source: str) -> None:
    """Store the model's identity, the tied-head mode and both heads' sha256 in the key (new dicts)."""
    weight = head(model).weight
    key.meta["model"] = {
        "source": str(source),
        "architecture": type(model).__name__,
        "vocab_size": key.vocab_size,
        "hidden_size": key.hidden_size,
        "dtype": dtype_name(weight.dtype),
        "tied": state.was_tied,
        "tied_head": state.mode,
        "key_id": key.key_id,  # the fingerprints below are of this key's dW
    }
    key.meta["fingerprint"] = {
        "original": head_digests(state.original),
        "watermarked": head_digests(weight),
    }
    ratio = float(torch.linalg.vector_norm(key.delta_w()) / torch.linalg.vector_norm(state.original.float()))
    key.meta["offset_to_head"] = ratio  # ||dW|| / ||U||: how far a re-tied release's input embeddings move
    key.meta["warnings"] = [TIED_WARNING] if state.mode == "untie" else []
    if state.mode == "retie" and ratio > RETIE_SHIFT_WARN:
        key.meta["warnings"].append(RETIE_WARNING.format(ratio=ratio))


@torch.no_grad()
def revert_watermark(model: PreTrainedModel, key: WatermarkKey, base: PreTrainedModel | None = None) -> str:
    """Restore the original unembedding. Returns how: ``exact`` or ``subtracted``.

    Exact when this process applied the watermark, when a ``base`` model is given, or for an
    ``untie`` release (its input embeddings are the original U). Otherwise (a re-tied or an
    untied-base release) U = U~ - dW, exact up to one fp32 rounding per weight; for a re-tied
    release this restores the input embeddings too, since they are the same tensor.
    """
    weight = head(model).weight
    state: PatchState | None = getattr(model, "_openstamp_patch", None)
    if state is not None:
        weight.copy_(state.original)
        del model._openstamp_patch
        if state.mode == "untie":
            _retie(model)
        return "exact"
    if base is not None:
        weight.copy_(head(base).weight.to(weight.dtype))
        return "exact"
    if tied_head_mode(key) == "untie":
        weight.copy_(model.get_input_embeddings().weight)
        _retie(model)
        return "exact"
    weight.copy_((weight.float() - key.delta_w().to(weight.device)).to(weight.dtype))
    return "subtracted"


def _retie(model: PreTrainedModel) -> None:
    _set_tied_config(model, True)
    head(model).weight = model.get_input_embeddings().weight


def watermarked_copy(model: PreTrainedModel, key: WatermarkKey) -> PreTrainedModel:
    """A deep copy of the original ``model`` with the key's watermark applied in the key's mode.

    For a re-tied release the backbone's input embeddings are U~ too, so only this copy gives
    the release's hidden states; ``model`` itself is left untouched (costs one model's memory).
    A key whose release had its backbone repaired is refused: no copy of the original has its layers.
    """
    if key.meta.get("repair"):
        raise KeyMismatchError(REPAIRED_ERROR.format(key_id=key.key_id))
    patched = copy.deepcopy(model)
    apply_watermark(patched, key, release_tied_head(key))
    del patched._openstamp_patch  # never reverted: drop the clone of U
    return patched


def check_key(model: PreTrainedModel, key: WatermarkKey) -> str:
    """Which head does this model carry: ``watermarked`` or ``original``? Raises KeyMismatchError."""
    weight = head(model).weight
    if tuple(weight.shape) != (key.vocab_size, key.hidden_size):
        raise KeyMismatchError(
            f"wrong key for this model: the key was made for an lm_head of shape "
            f"({key.vocab_size}, {key.hidden_size}), this model's is {tuple(weight.shape)}; {FORCE_HINT}"
        )
    recorded = key.meta.get("fingerprint", {})
    if not recorded.get("original"):
        raise KeyMismatchError(
            f"key {key.key_id} records no model fingerprint (apply_watermark records it); {FORCE_HINT}"
        )
    digest = tensor_sha256(weight)
    # a key derived with another delta carries its parent's record: only the original head still fits
    inherited = key.meta.get("model", {}).get("key_id") not in (None, key.key_id)
    for which in ("original",) if inherited else ("watermarked", "original"):
        if recorded.get(which, {}).get(dtype_name(weight.dtype)) == digest:
            return which
    raise KeyMismatchError(
        f"wrong key for this model: key {key.key_id} was made for a model whose lm_head has sha256 "
        f"{recorded.get('watermarked', {}).get('float32', '?')[:12]}... (watermarked) or "
        f"{recorded.get('original', {}).get('float32', '?')[:12]}... (original); this model's "
        f"{dtype_name(weight.dtype)} lm_head is {digest[:12]}...; {FORCE_HINT}"
    )
