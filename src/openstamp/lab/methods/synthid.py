"""SynthID-Text (Dathathri et al. 2024) through transformers (``SynthIDTextWatermarkingConfig``), scored without a
trained detector: the weighted mean of its g-values.

Tournament sampling: at each step, ``depth`` layers of keyed Bernoulli(1/2) g-values, each a hash of the last
``ngram_len - 1`` tokens, the candidate token and one of the layer keys, reweight the next-token distribution
(``p <- p (1 + g - E_p[g])`` per layer); a context seen before in the same text is left alone. The sampler is
transformers' ``SynthIDTextWatermarkLogitsProcessor``; the score is the reference implementation's weighted mean
(weights ``linspace(10, 1, depth)``, normalised to mean 1) of the g-values of the completion's n-grams whose context
is not repeated. On human text each g-value is a fair coin, so the score has mean 1/2 and standard deviation
``sqrt(sum_l w_l^2 / 4) / (depth sqrt(n))`` over n scored positions: its p-value is that normal tail.

The strength is ``depth`` (whole layers, from a key of ``MAX_DEPTH`` layer keys). ``ngram_len`` 2 matches ``kgw``'s
width-1 context; SynthID's paper uses 5 (``--set method_settings=...``), which repeats contexts less often. It has
no gamma or delta. It changes no weights: the watermark needs control of the sampler.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
from scipy.stats import norm
from transformers import LogitsProcessor, SynthIDTextWatermarkingConfig

from openstamp.config import option
from openstamp.lab.methods.base import Carrier, MethodScore, WatermarkMethod, register
from openstamp.lab.methods.common import keyed_uint32, load_key, method_secret, save_key
from openstamp.model.text import encode

MAX_DEPTH = 32  # layer keys a key holds: the most layers any strength of it uses
_DOMAIN = b"openstamp/eval/synthid/keys/v1"


@dataclass(frozen=True, kw_only=True)
class SynthIDConfig:
    depth: int = option(8, "tournament layers, each with its own key (the swept strength)")
    ngram_len: int = option(2, "tokens hashed per g-value: the candidate and ngram_len - 1 before it")
    context_history_size: int = option(1024, "contexts remembered per text; a repeated one is not watermarked")
    min_tokens: int = option(16, "texts with fewer scored positions get no score")

    def __post_init__(self) -> None:
        if float(self.depth) != int(self.depth) or not 1 <= self.depth <= MAX_DEPTH:
            raise ValueError(f"depth must be a whole number in [1, {MAX_DEPTH}], got {self.depth}")
        object.__setattr__(self, "depth", int(self.depth))  # a sweep hands strengths over as floats
        if self.ngram_len < 2:
            raise ValueError(f"ngram_len must be at least 2, got {self.ngram_len}")
        if self.context_history_size < 1 or self.min_tokens < 1:
            raise ValueError("context_history_size and min_tokens must be at least 1")


def layer_weights(depth: int) -> torch.Tensor:
    """float64 (depth,): the reference's weights linspace(10, 1, depth), scaled to mean 1."""
    w = torch.linspace(10, 1, depth, dtype=torch.float64)
    return w * depth / w.sum()


def weighted_mean_score(g: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """The weighted mean of g-values and its one-sided p-value under fair coins.

    Args:
        g: (T, depth) g-values in {0, 1} of the scored positions.
        mask: bool (T,), positions whose context is not repeated.
    """
    w, n = layer_weights(g.shape[1]), int(mask.sum())
    score = float((g[mask].double() * w).sum()) / (g.shape[1] * n)
    sd = math.sqrt(float((w**2).sum()) / 4) / (g.shape[1] * math.sqrt(n))
    return score, float(norm.sf((score - 0.5) / sd))


class SynthIDProcessor(LogitsProcessor):
    """transformers' SynthID processor, fresh for each sequence it is run over: its state (the context and the
    contexts seen) restarts whenever the batch changes or the input is not one token longer than at the last call."""

    def __init__(self, keys: list[int], table_seed: int, cfg: SynthIDConfig) -> None:
        self.settings = SynthIDTextWatermarkingConfig(
            ngram_len=cfg.ngram_len,
            keys=keys[: cfg.depth],
            context_history_size=cfg.context_history_size,
            sampling_table_seed=table_seed,
        )
        self.delta = cfg.depth  # the strength, as every decode-time processor here names it
        self._inner, self._last = None, None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """input_ids: long (B, L); scores: (B, |V|) -> watermarked log-probabilities (B, |V|)."""
        shape = (input_ids.shape[0], input_ids.shape[1] - 1, scores.device)
        if self._inner is None or self._last != shape:
            self._inner = self.settings.construct_processor(scores.shape[-1], scores.device)
        self._last = (input_ids.shape[0], input_ids.shape[1], scores.device)
        return self._inner(input_ids, scores)


@register
class SynthID(WatermarkMethod):
    name = "synthid"
    config_class = SynthIDConfig
    strength = "depth"
    scores_ignore_strength = False  # the score averages the first `depth` layers
    sweep = (1, 2, 3, 4, 6, 8, 12, 16)
    key_fields = ("keys", "table_seed")
    carrier = Carrier.DECODER
    keys: list[int]
    table_seed: int

    def build(self, model, tokenizer, documents, seed) -> None:
        words = keyed_uint32(method_secret("synthid", seed), _DOMAIN, 0, MAX_DEPTH + 1)
        self.keys, self.table_seed = [int(v) for v in words[:MAX_DEPTH]], int(words[MAX_DEPTH])

    def save(self, directory: Path) -> None:
        save_key(directory, self.config, {"keys": torch.tensor([*self.keys, self.table_seed], dtype=torch.int64)})

    def load(self, directory: Path) -> None:
        self.config, t = load_key(directory, self.config_class)
        values = [int(v) for v in t["keys"].tolist()]
        self.keys, self.table_seed = values[:-1], values[-1]

    def logits_processor(self) -> LogitsProcessor:
        return SynthIDProcessor(self.keys, self.table_seed, self.config)

    def score(self, base, tokenizer, texts, batch_size=16) -> list[MethodScore]:
        inner = self.logits_processor().settings.construct_processor(1, "cpu")  # g-values need no vocabulary
        out = []
        for ids in encode(tokenizer, texts):
            count = max(len(ids) - (self.config.ngram_len - 1), 0)
            if count < self.config.min_tokens:
                out.append(MethodScore(None, None, count))
                continue
            x = torch.tensor([ids])
            g = inner.compute_g_values(x)[0]  # (count, depth)
            mask = inner.compute_context_repetition_mask(x)[0].bool()  # (count,)
            score, p = weighted_mean_score(g, mask)
            out.append(MethodScore(score, p, count, {"n_unrepeated": float(mask.sum())}))
        return out
