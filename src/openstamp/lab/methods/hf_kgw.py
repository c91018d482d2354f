"""transformers' own KGW (``WatermarkingConfig``, ``WatermarkDetector``) as a peer in the lab's harness.

The same watermark as ``kgw`` (Kirchenbauer et al. 2023), implemented by Hugging Face: a width-1 ``lefthash``
green list keyed on the previous token, ``greenlist_ratio`` = gamma, ``bias`` = delta, scored by transformers'
``WatermarkDetector`` (its z-score, each distinct (previous, token) pair once, as ``kgw`` counts them). Matched to
``kgw``: gamma 0.25, delta 1.5 and its grid, context width 1, distinct pairs, only pairs inside the completion.
Where they differ (transformers' choices, kept):

* the green list is ``randperm(|V|)[: int(gamma |V|)]`` from a torch generator seeded with ``hashing_key * prev``:
  exactly ``int(gamma |V|)`` green tokens, special tokens and padding rows among them, and the list after token 0
  is the same for every key (its seed is 0); ``kgw`` draws each token's membership from a SHAKE-256 PRF and keeps
  special tokens and padding rows red;
* the key is one integer (31 bits here, from the seed), not a 32-byte secret;
* the p-value is the z-score's normal tail, not the exact binomial ``kgw`` reports;
* ``generate(watermarking_config=...)`` adds the bias after temperature and top-p (transformers #34630); in the
  harness, as ``kgw``, the processor runs before them. At temperature 1 and top-p 1 (the eval's default) the two
  are the same distribution.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import torch
from transformers import LogitsProcessor, WatermarkDetector, WatermarkingConfig

from openstamp.config import option
from openstamp.lab.methods.base import Carrier, MethodScore, WatermarkMethod, register
from openstamp.lab.methods.common import load_key, method_secret, save_key
from openstamp.lab.methods.kgw import KGWConfig
from openstamp.model.patch import head
from openstamp.model.text import encode


@dataclass(frozen=True, kw_only=True)
class HFKGWConfig(KGWConfig):
    """Our KGW's settings and checks, read as transformers' ``WatermarkingConfig`` reads them."""

    delta: float = option(1.5, "transformers' bias: added to the green logits at every step (the swept strength)")
    gamma: float = option(0.25, "transformers' greenlist_ratio: the green share of the vocabulary")


def watermarking_config(hashing_key: int, cfg: HFKGWConfig) -> WatermarkingConfig:
    """transformers' settings of this key: lefthash, context width 1."""
    return WatermarkingConfig(
        greenlist_ratio=cfg.gamma, bias=cfg.delta, hashing_key=hashing_key, seeding_scheme="lefthash", context_width=1
    )


class HFKGWProcessor(LogitsProcessor):
    """transformers' ``WatermarkLogitsProcessor`` for this key, built on the device of the first scores it sees."""

    def __init__(self, hashing_key: int, vocab_size: int, cfg: HFKGWConfig) -> None:
        self.settings, self.vocab_size, self.delta = watermarking_config(hashing_key, cfg), vocab_size, cfg.delta
        self._inner, self._device = None, None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """input_ids: long (B, L); scores: (B, |V|) -> biased scores (B, |V|)."""
        if scores.shape[-1] != self.vocab_size:
            raise ValueError(f"scores have {scores.shape[-1]} columns, the key has {self.vocab_size}")
        if self._inner is None or self._device != scores.device:
            self._inner, self._device = self.settings.construct_processor(self.vocab_size, scores.device), scores.device
        return self._inner(input_ids, scores)


@register
class HFKGW(WatermarkMethod):
    name = "hf-kgw"
    config_class = HFKGWConfig
    strength = "delta"
    scores_ignore_strength = True  # a z-test of green tokens: delta only generates
    sweep = (0.7, 1.0, 1.2, 1.4, 1.5, 1.7, 2.0)  # kgw's grid
    key_fields = ("hashing_key", "vocab_size")
    carrier = Carrier.DECODER
    hashing_key: int
    vocab_size: int

    def build(self, model, tokenizer, documents, seed) -> None:
        self.hashing_key = int.from_bytes(method_secret("hf-kgw", seed)[:4], "little") % (2**31 - 1) + 1
        self.vocab_size = head(model).weight.shape[0]

    def save(self, directory: Path) -> None:
        save_key(directory, self.config, {"key": torch.tensor([self.hashing_key, self.vocab_size])})

    def load(self, directory: Path) -> None:
        self.config, t = load_key(directory, self.config_class)
        self.hashing_key, self.vocab_size = (int(v) for v in t["key"].tolist())

    def logits_processor(self) -> LogitsProcessor:
        return HFKGWProcessor(self.hashing_key, self.vocab_size, self.config)

    def detector(self) -> WatermarkDetector:
        """transformers' detector for this key; completions are scored without BOS (-1: never one)."""
        model_config = SimpleNamespace(bos_token_id=-1, is_encoder_decoder=False, vocab_size=self.vocab_size)
        settings = watermarking_config(self.hashing_key, self.config).to_dict()
        return WatermarkDetector(model_config, "cpu", settings, ignore_repeated_ngrams=True, max_cache_size=4096)

    def score(self, base, tokenizer, texts, batch_size=16) -> list[MethodScore]:
        detector, out = self.detector(), []
        for ids in encode(tokenizer, texts):
            count = max(len(ids) - 1, 0)
            if count < self.config.min_tokens:
                out.append(MethodScore(None, None, count))
                continue
            r = detector(torch.tensor([ids]), return_dict=True)
            extra = {"green_fraction": float(r.green_fraction[0]), "n_unique": float(r.num_tokens_scored[0])}
            out.append(MethodScore(float(r.z_score[0]), float(r.p_value[0]), count, extra))
        return out
