"""Unremovable (Christ et al. 2024): a keyed Gaussian bias on the final-layer logits.

The key is a vector ``b`` in R^|V| with ``b_y ~ N(0, epsilon^2)`` (``epsilon`` is a standard
deviation, in logit units). ``apply`` gives lm_head the bias ``b`` (or adds ``b`` to an existing
bias), so every next-token logit vector becomes ``U h + b`` and tokens with positive ``b_y``
are preferred regardless of context. Special tokens and the padding rows past the tokenizer get
``b_y = 0``. A checkpoint saved from the watermarked model carries one extra tensor,
``lm_head.bias``; architectures without a head bias ignore it on load, so releases should
merge it into a bias-carrying head or ship the model object.

Detection needs only the key, no model: over the text's distinct scored tokens ``Y``,
``z = sum_{y in Y} b_y / (epsilon sqrt(|Y|))``, which is N(0, 1) on text independent of the key,
and ``p = 1 - Phi(z)``. Counting each token once keeps repeated tokens from inflating ``z``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from scipy.stats import norm

from openstamp.config import option
from openstamp.lab.methods.base import MethodScore, WatermarkMethod, register
from openstamp.lab.methods.common import keyed_normal, load_key, method_secret, save_key, scored_sequences
from openstamp.model.patch import head
from openstamp.model.text import never_green_ids

_DOMAIN = b"openstamp/eval/unremovable/bias/v1"


@dataclass(frozen=True, kw_only=True)
class UnremovableConfig:
    epsilon: float = option(
        0.8, "standard deviation (not variance) of the keyed Gaussian bias b added to every final-layer logit"
    )
    min_tokens: int = option(16, "texts with fewer scored tokens get no score")

    def __post_init__(self) -> None:
        if not (math.isfinite(self.epsilon) and self.epsilon > 0):
            raise ValueError(f"epsilon must be a positive standard deviation, got {self.epsilon}")
        if self.min_tokens < 1:
            raise ValueError(f"min_tokens must be at least 1, got {self.min_tokens}")


@register
class Unremovable(WatermarkMethod):
    name = "unremovable"
    config_class = UnremovableConfig
    strength = "epsilon"
    scores_ignore_strength = True  # the z-test sums the noise of the text's tokens: epsilon only generates
    sweep = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)  # the paper's grid; 0.8 is its representative value
    key_fields = ("noise", "excluded")
    head_only = True  # the bias lives in lm_head: the decoder's hidden states stay the original's
    noise: torch.Tensor  # float32 (|V|,), standard normal; zero on excluded ids
    excluded: torch.Tensor  # long (k,), ids that carry no bias and are never scored
    _saved: tuple[torch.Tensor | None] | None = None  # the head's bias before ``apply``

    def build(self, model, tokenizer, documents, seed) -> None:
        vocab = head(model).weight.shape[0]
        self.excluded = torch.tensor(never_green_ids(tokenizer, vocab), dtype=torch.long)
        self.noise = keyed_normal(method_secret(self.name, seed), _DOMAIN, vocab)
        self.noise[self.excluded] = 0.0

    def bias(self) -> torch.Tensor:
        """The logit bias b = epsilon * noise, float32 (|V|,)."""
        return self.config.epsilon * self.noise

    def save(self, directory: Path) -> None:
        save_key(directory, self.config, {"noise": self.noise, "excluded": self.excluded})

    def load(self, directory: Path) -> None:
        self.config, tensors = load_key(directory, self.config_class)
        self.noise, self.excluded = tensors["noise"], tensors["excluded"]

    def apply(self, model) -> None:
        if self._saved is not None:
            raise RuntimeError("this Unremovable instance is already applied; revert it first")
        out = head(model)
        if out.weight.shape[0] != self.noise.shape[0]:
            raise ValueError(f"key has {self.noise.shape[0]} logits but lm_head has {out.weight.shape[0]}")
        old = out.bias
        bias = self.bias().to(device=out.weight.device, dtype=out.weight.dtype)
        if old is not None:
            bias = old.detach() + bias.to(old.dtype)
        self._saved = (None if old is None else old.detach().clone(),)
        out.bias = torch.nn.Parameter(bias, requires_grad=False)

    def revert(self, model) -> None:
        if self._saved is None:
            raise RuntimeError("revert() without a matching apply()")
        (old,) = self._saved
        head(model).bias = None if old is None else torch.nn.Parameter(old)
        self._saved = None

    def score(self, base, tokenizer, texts, batch_size=16) -> list[MethodScore]:
        seqs, first, counts = scored_sequences(tokenizer, texts)
        excluded = set(self.excluded.tolist())
        results = []
        for seq, count in zip(seqs, counts, strict=True):
            unique = sorted(set(seq[first:]) - excluded)
            if count < self.config.min_tokens or not unique:
                results.append(MethodScore(None, None, count))
                continue
            z = float(self.noise[unique].double().sum()) / math.sqrt(len(unique))
            results.append(MethodScore(z, float(norm.sf(z)), count, {"n_unique": float(len(unique))}))
        return results
