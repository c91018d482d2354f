"""GaussMark (Block et al. 2025): keyed Gaussian noise on one MLP up-projection weight.

The key is a matrix ``xi`` of the shape of ``W = model.get_decoder().layers[layer].mlp.up_proj
.weight`` (intermediate x hidden), with i.i.d. entries ``N(0, sigma^2)`` (``sigma`` is a standard
deviation in weight units). ``apply`` sets ``W <- W + xi``; ``revert`` restores the saved
original bit-exactly.

Detection uses the private original model. With ``g = grad_W sum_t log p_base(x_t | x_<t)``
(the gradient of the text's log-likelihood at the original weights), the score
``<xi, g> / (sigma ||g||_F)`` is N(0, 1) on text independent of the key, and ``p = 1 - Phi``.
Watermarked text was sampled from ``W + xi``, so it is likelier along ``xi`` and scores high.

The gradient is never materialised: one batched forward records the layer's inputs ``a_t``
(hidden) and the gradients ``e_t`` of its outputs (intermediate); then per text
``<xi, g> = sum_t e_t^T xi a_t`` and ``||g||^2 = sum_{t,t'} (e_t . e_t') (a_t . a_t')``. Under
``hidden.autocast_decoder`` the decoder runs (and back-propagates) in that dtype and the head in float32; g
is then g plus rounding that does not depend on the key, so the score stays N(0, 1) on text independent of it.

Strength on SmolLM2-135M (block 25 of 30, up_proj weight std 0.208). The paper's sigma grid
{0.025..0.045} for Llama-2-7B is not transferable in absolute terms, so the grid was chosen by
quality cost: the increase of the perturbed model's loss on 16 Wikipedia windows of 128 tokens is
+0.015, +0.048, +0.10, +0.17, +0.25 nats/token for sigma = 0.05, 0.1, 0.15, 0.2, 0.25
(sigma/std 0.24..1.2), the same range that Unremovable's epsilon 0.3..0.9 (+0.02..+0.25) and
KGW's delta 0.7..2.0 (+0.04..+0.34) cost on this model. The default 0.2 costs about what
Unremovable at 0.8 and KGW at 1.5 cost (+0.19).
"""

from __future__ import annotations

import dataclasses
import math
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from scipy.stats import norm

from openstamp.config import option
from openstamp.lab.hidden import decoder_dtype
from openstamp.lab.methods.base import MethodScore, WatermarkMethod, register
from openstamp.lab.methods.common import (
    keyed_normal,
    load_key,
    method_secret,
    right_padded,
    save_key,
    scored_mask,
    scored_sequences,
)
from openstamp.model.load import model_device

_DOMAIN = b"openstamp/eval/gaussmark/up-proj/v1"
DEPTH_FRACTION = 0.85  # default block: int(0.85 * depth), 25 of 30 (SmolLM2), 27 of 32 (Llama-2-7B)


@dataclass(frozen=True, kw_only=True)
class GaussMarkConfig:
    sigma: float = option(
        0.2,
        "standard deviation (not variance) of the Gaussian noise added to every entry of the up_proj weight",
    )
    layer: int | None = option(
        None,
        "0-based decoder block whose mlp.up_proj weight is perturbed; None: int(0.85 * depth) at build",
    )
    min_tokens: int = option(16, "texts with fewer scored tokens get no score")

    def __post_init__(self) -> None:
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be a positive standard deviation, got {self.sigma}")
        if self.layer is not None and self.layer < 0:
            raise ValueError(f"layer must be a 0-based block index, got {self.layer}")
        if self.min_tokens < 1:
            raise ValueError(f"min_tokens must be at least 1, got {self.min_tokens}")


def up_proj(model, layer: int) -> torch.nn.Module:
    """The ``mlp.up_proj`` linear layer of decoder block ``layer`` (Llama-style models)."""
    layers = model.get_decoder().layers
    if not 0 <= layer < len(layers):
        raise ValueError(f"layer {layer} out of range: the model has {len(layers)} decoder blocks")
    module = getattr(getattr(layers[layer], "mlp", None), "up_proj", None)
    if module is None:
        raise ValueError(f"{type(model).__name__} block {layer} has no mlp.up_proj to perturb")
    return module


@contextmanager
def _frozen(model):
    """Temporarily turn off parameter gradients, so only activations after the hook get a graph."""
    flags = [(p, p.requires_grad) for p in model.parameters()]
    try:
        for p, _ in flags:
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in flags:
            p.requires_grad_(flag)


def gradient_projection(
    model, layer: int, noise: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, scored: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``<noise, g_i>`` and ``||g_i||_F^2`` for each row's log-likelihood gradient g_i at up_proj.

    Args:
        model: the original model.
        layer: decoder block.
        noise: (intermediate, hidden), the direction to project on.
        ids, mask: right-padded long (B, T).
        scored: bool (B, T), the tokens whose log-probability enters g_i.

    Returns:
        float64 (B,) inner products and (B,) squared Frobenius norms.
    """
    captured: dict[str, torch.Tensor] = {}

    def hook(module, inputs, output):
        captured["a"] = inputs[0].detach()
        captured["out"] = output.detach().requires_grad_(True)
        return captured["out"]

    handle = up_proj(model, layer).register_forward_hook(hook)
    try:
        with torch.inference_mode(False), torch.enable_grad(), _frozen(model):
            dtype = decoder_dtype()  # the decoder under autocast where the eval asks (its rounding adds noise to g)
            with torch.autocast(ids.device.type, dtype=getattr(torch, dtype or "float32"), enabled=dtype is not None):
                states = model.get_decoder()(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
            logits = model.get_output_embeddings()(states[:, :-1].float()).float()
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            loglik = (logp * scored[:, 1:].to(logp)).sum()
            (e,) = torch.autograd.grad(loglik, captured["out"])
    finally:
        handle.remove()
    keep = mask[..., None].to(torch.float64)
    a, e = captured["a"].to(torch.float64) * keep, e.to(torch.float64) * keep  # (B, T, d), (B, T, m)
    inner = (e * (a @ noise.to(a).T)).sum((1, 2))
    norm_sq = ((e @ e.transpose(1, 2)) * (a @ a.transpose(1, 2))).sum((1, 2))
    return inner, norm_sq


@register
class GaussMark(WatermarkMethod):
    name = "gaussmark"
    config_class = GaussMarkConfig
    strength = "sigma"
    scores_ignore_strength = True  # <noise, g> / ||g||: sigma cancels
    sweep = (0.05, 0.1, 0.15, 0.2, 0.25)  # for SmolLM2-135M (sigma/std 0.24..1.2); see the module docstring
    key_fields = ("noise",)
    noise: torch.Tensor  # float32 (intermediate, hidden), standard normal
    _saved: torch.Tensor | None = None  # the original weight while applied

    def build(self, model, tokenizer, documents, seed) -> None:
        depth = len(model.get_decoder().layers)
        layer = self.config.layer if self.config.layer is not None else int(DEPTH_FRACTION * depth)
        shape = up_proj(model, layer).weight.shape
        self.config = dataclasses.replace(self.config, layer=layer)
        self.noise = keyed_normal(method_secret(self.name, seed), _DOMAIN, shape.numel()).reshape(shape)

    def save(self, directory: Path) -> None:
        save_key(directory, self.config, {"noise": self.noise})

    def load(self, directory: Path) -> None:
        self.config, tensors = load_key(directory, self.config_class)
        self.noise = tensors["noise"]

    def perturbation(self) -> torch.Tensor:
        """xi = sigma * noise, float32 (intermediate, hidden)."""
        return self.config.sigma * self.noise

    def apply(self, model) -> None:
        if self._saved is not None:
            raise RuntimeError("this GaussMark instance is already applied; revert it first")
        weight = up_proj(model, self.config.layer).weight
        if weight.shape != self.noise.shape:
            raise ValueError(f"key noise {tuple(self.noise.shape)} does not fit up_proj {tuple(weight.shape)}")
        self._saved = weight.detach().clone()
        with torch.no_grad():
            weight.add_(self.perturbation().to(device=weight.device, dtype=weight.dtype))

    def revert(self, model) -> None:
        if self._saved is None:
            raise RuntimeError("revert() without a matching apply()")
        with torch.no_grad():
            up_proj(model, self.config.layer).weight.copy_(self._saved)
        self._saved = None

    def score(self, base, tokenizer, texts, batch_size=16) -> list[MethodScore]:
        seqs, first, counts = scored_sequences(tokenizer, texts)
        results = [MethodScore(None, None, c) for c in counts]
        todo = sorted((i for i, c in enumerate(counts) if c >= self.config.min_tokens), key=lambda i: -len(seqs[i]))
        device = model_device(base)
        for b in range(0, len(todo), batch_size):
            batch = todo[b : b + batch_size]
            ids, mask = right_padded([seqs[i] for i in batch], tokenizer.pad_token_id or 0)
            scored = scored_mask(mask, first)
            inner, norm_sq = gradient_projection(
                base,
                self.config.layer,
                self.noise.to(device),
                ids.to(device),
                mask.to(device),
                scored.to(device),
            )
            for i, dot, sq in zip(batch, inner.tolist(), norm_sq.tolist(), strict=True):
                z = dot / math.sqrt(sq) if sq > 0 else 0.0
                results[i] = MethodScore(z, float(norm.sf(z)), counts[i], {"grad_norm": math.sqrt(sq)})
        return results
