"""KGW (Kirchenbauer et al. 2023), a decode-time watermark, with its z-test and with an LLR detector.

Context width 1: the green list at step t is keyed on the previous token,
``G(prev) = {i : PRF(secret, prev, i) < gamma}``, where ``PRF(secret, prev, .)`` is a SHAKE-256
stream of uint32 values with its own domain (so it shares nothing with OpenStamp's lists).
Special tokens and the unembedding's padding rows are never green. During generation a
``LogitsProcessor`` adds ``delta`` (in logit units, before temperature and top-p) to the green
logits of every row; the model's weights are never touched.

* ``kgw`` scores the fraction of green tokens: over the distinct (previous, token) pairs of
  the text (n pairs, k green), ``z = (k - gamma n) / sqrt(n gamma (1 - gamma))`` and the exact
  binomial p-value ``P(Bin(n, gamma) >= k)``.
* ``kgw-llr`` (the paper's KGW + LLR) scores the mean per-token log-likelihood ratio of the
  KGW-biased to the plain original logits,
  ``delta [x_t in G(x_{t-1})] - log(1 + (e^delta - 1) p_base(G(x_{t-1}) | x_<t))``; it has no
  p-value because its null distribution depends on the text's source.

Only pairs inside the text are scored: the first token's predecessor (a prompt token) is unknown.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from scipy.stats import binom
from transformers import LogitsProcessor

from openstamp.config import option
from openstamp.key.prf import green_threshold
from openstamp.lab.hidden import lab_hidden
from openstamp.lab.methods.base import Carrier, MethodScore, WatermarkMethod, register
from openstamp.lab.methods.common import (
    keyed_uint32,
    load_key,
    method_secret,
    right_padded,
    save_key,
    scored_sequences,
    secret_tensor,
)
from openstamp.model.load import model_device
from openstamp.model.patch import head
from openstamp.model.text import bos_prefix, encode, never_green_ids

_DOMAIN = b"openstamp/eval/kgw/green-list/v1"


class GreenLists:
    """The keyed green lists ``G(prev)`` of a width-1 KGW watermark, computed on demand (LRU cache).

    Args:
        secret: PRF secret.
        vocab_size: |V|, rows of the unembedding.
        gamma: green fraction.
        excluded: ids that are never green.
        cache_size: how many lists to keep (each is |V| bytes).
    """

    def __init__(
        self, secret: bytes, vocab_size: int, gamma: float, excluded: Sequence[int], cache_size: int = 1024
    ) -> None:
        self.secret, self.vocab_size, self.gamma = secret, vocab_size, gamma
        self.threshold = green_threshold(gamma)
        self.excluded = torch.as_tensor(list(excluded), dtype=torch.long)
        self.mask = functools.lru_cache(maxsize=cache_size)(self._compute)

    def _compute(self, prev: int) -> torch.Tensor:
        """bool (|V|,): membership of G(prev)."""
        green = torch.from_numpy(keyed_uint32(self.secret, _DOMAIN, prev, self.vocab_size) < self.threshold)
        green[self.excluded] = False
        return green

    def rows(self, prevs: Sequence[int]) -> torch.Tensor:
        """bool (n, |V|): the green list of each previous token."""
        return torch.stack([self.mask(int(p)) for p in prevs])

    @classmethod
    def for_model(cls, secret: bytes, model, tokenizer, gamma: float) -> GreenLists:
        """Lists over the model's unembedding rows; special tokens and padding rows are never green."""
        vocab = head(model).weight.shape[0]
        return cls(secret, vocab, gamma, never_green_ids(tokenizer, vocab))

    def tensors(self) -> dict[str, torch.Tensor]:
        """What a saved key holds of the lists (``from_tensors`` reads it back)."""
        return {
            "secret": secret_tensor(self.secret),
            "excluded": self.excluded,
            "vocab_size": torch.tensor([self.vocab_size]),
        }

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor], gamma: float) -> GreenLists:
        return cls(bytes(t["secret"].tolist()), int(t["vocab_size"][0]), gamma, t["excluded"].tolist())


class KGWProcessor(LogitsProcessor):
    """Adds ``delta`` to the green logits of each row, keyed on the row's last token."""

    def __init__(self, greens: GreenLists, delta: float) -> None:
        self.greens, self.delta = greens, delta

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """input_ids: long (B, L); scores: (B, |V|) -> biased scores (B, |V|)."""
        if scores.shape[-1] != self.greens.vocab_size:
            raise ValueError(f"scores have {scores.shape[-1]} columns, the key has {self.greens.vocab_size}")
        green = self.greens.rows(input_ids[:, -1].tolist()).to(scores.device)
        return scores + self.delta * green.to(scores.dtype)


@dataclass(frozen=True, kw_only=True)
class KGWConfig:
    delta: float = option(1.5, "logit bias added to the green tokens at every decoding step (the swept strength)")
    gamma: float = option(0.25, "fraction of the vocabulary in each green list")
    min_tokens: int = option(16, "texts with fewer scored tokens get no score")

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delta) and self.delta > 0):
            raise ValueError(f"delta must be positive, got {self.delta}")
        if not 0.0 < self.gamma < 1.0:
            raise ValueError(f"gamma must be in (0, 1), got {self.gamma}")
        if self.min_tokens < 1:
            raise ValueError(f"min_tokens must be at least 1, got {self.min_tokens}")


@register
class KGW(WatermarkMethod):
    name = "kgw"
    config_class = KGWConfig
    strength = "delta"
    scores_ignore_strength = True  # the z-test counts green tokens: delta only generates
    sweep = (0.7, 1.0, 1.2, 1.4, 1.5, 1.7, 2.0)  # from the paper's 0.7..2.0 grid; 1.5 is representative
    key_fields = ("greens",)
    carrier = Carrier.DECODER
    greens: GreenLists

    def build(self, model, tokenizer, documents, seed) -> None:
        secret = method_secret("kgw", seed)  # kgw and kgw-llr with one seed share the lists (and texts)
        self.greens = GreenLists.for_model(secret, model, tokenizer, self.config.gamma)

    def save(self, directory: Path) -> None:
        save_key(directory, self.config, self.greens.tensors())

    def load(self, directory: Path) -> None:
        self.config, t = load_key(directory, self.config_class)
        self.greens = GreenLists.from_tensors(t, self.config.gamma)

    @property
    def generation_family(self) -> str:
        """kgw and kgw-llr built with one seed and gamma generate alike, so an evaluation shares their texts."""
        return "kgw" if self.config.gamma == 0.25 else f"kgw-gamma{self.config.gamma:g}"

    def logits_processor(self) -> LogitsProcessor:
        return KGWProcessor(self.greens, self.config.delta)

    def score(self, base, tokenizer, texts, batch_size=16) -> list[MethodScore]:
        return [self._z_test(ids) for ids in encode(tokenizer, texts)]

    def _z_test(self, ids: list[int]) -> MethodScore:
        count = max(len(ids) - 1, 0)
        if count < self.config.min_tokens:
            return MethodScore(None, None, count)
        pairs = sorted(set(zip(ids[:-1], ids[1:], strict=True)))
        k = sum(bool(self.greens.mask(prev)[tok]) for prev, tok in pairs)
        n, gamma = len(pairs), self.config.gamma
        z = (k - gamma * n) / math.sqrt(n * gamma * (1 - gamma))
        p = float(binom.sf(k - 1, n, gamma))
        return MethodScore(z, p, count, {"green_fraction": k / n, "n_unique": float(n)})


@dataclass(frozen=True, kw_only=True)
class KGWLLRConfig(KGWConfig):
    delta: float = option(1.4, "logit bias added to the green tokens at every decoding step (the swept strength)")
    chunk: int = option(64, "scored positions per block of |V|-wide logits in detection (memory bound)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.chunk < 1:
            raise ValueError(f"chunk must be at least 1, got {self.chunk}")


def green_statistics(logits: torch.Tensor, green: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What the LLR takes from the key alone.

    Args:
        logits: (N, |V|) original logits.
        green: bool (N, |V|), the green list of each position.
        targets: long (N,), the observed tokens.

    Returns:
        float32 (N,) green mass ``p(G)`` under the original model, and (N,) hit ``[target green]``.
    """
    mass = (torch.softmax(logits.float(), -1) * green).sum(-1)
    return mass, green.gather(-1, targets[:, None]).squeeze(-1).float()


def green_llr(mass: torch.Tensor, hit: torch.Tensor, delta: float) -> torch.Tensor:
    """Per-token LLR of the KGW-biased (bias ``delta``) to the plain distribution:
    ``delta hit - log(1 + (e^delta - 1) p(G))``."""
    return delta * hit - torch.log1p(math.expm1(delta) * mass)


@register
class KGWLLR(KGW):
    name = "kgw-llr"
    config_class = KGWLLRConfig
    sweep = (0.5, 0.7, 1.0, 1.2, 1.4, 1.5, 1.7)  # from the paper's 0.5..1.7 grid; 1.4 is representative
    scores_ignore_strength = False  # the LLR reads delta
    shares_statistics = True  # but only at the end: a token's green mass and hit read the key alone
    score_is_llr = True

    def score(self, base, tokenizer, texts, batch_size=16) -> list[MethodScore]:
        stats = self.key_statistics(base, tokenizer, texts, batch_size)
        return [MethodScore(**self.score_from_statistics(s)) for s in stats]

    def key_statistics(self, base, tokenizer, texts, batch_size=16) -> list[dict]:
        """Per text ``n_tokens`` and, where it has ``min_tokens``, each scored token's green mass p(G) and hit
        (float32 tensors)."""
        seqs, _, _ = scored_sequences(tokenizer, texts)
        start = len(bos_prefix(tokenizer)) + 1  # first token whose predecessor is in the text
        counts = [max(len(s) - start, 0) for s in seqs]
        results = [{"n_tokens": c} for c in counts]
        todo = sorted((i for i, c in enumerate(counts) if c >= self.config.min_tokens), key=lambda i: -len(seqs[i]))
        for b in range(0, len(todo), batch_size):
            batch = todo[b : b + batch_size]
            per_token = self._batch_green(base, [seqs[i] for i in batch], start, tokenizer.pad_token_id or 0)
            for i, (mass, hit) in zip(batch, per_token, strict=True):
                results[i].update(mass=mass, hit=hit)
        return results

    def score_from_statistics(self, statistics: dict) -> dict:
        if "mass" not in statistics:
            return asdict(MethodScore(None, None, statistics["n_tokens"]))
        llr = green_llr(statistics["mass"], statistics["hit"], self.config.delta)
        return asdict(MethodScore(float(llr.mean()), None, statistics["n_tokens"]))

    @torch.inference_mode()
    def _batch_green(self, base, seqs: list[list[int]], start: int, pad: int) -> list[tuple[torch.Tensor, ...]]:
        """One decoder forward for the batch; each sequence's per-token green mass and hit (float32 (n_i,))."""
        device = model_device(base)
        ids, mask = right_padded(seqs, pad)
        hidden = lab_hidden(base, ids.to(device), mask.to(device))  # (B, T, d)
        rows = torch.cat([torch.full((len(s) - start,), i) for i, s in enumerate(seqs)])
        cols = torch.cat([torch.arange(start, len(s)) for s in seqs])
        prevs, targets = ids[rows, cols - 1], ids[rows, cols]
        mass, hit = torch.empty(len(rows)), torch.empty(len(rows))
        for c in range(0, len(rows), self.config.chunk):
            part = slice(c, c + self.config.chunk)
            logits = head(base)(hidden[rows[part].to(device), (cols[part] - 1).to(device)])
            green = self.greens.rows(prevs[part].tolist()).to(device)
            mass[part], hit[part] = (t.cpu() for t in green_statistics(logits, green, targets[part].to(device)))
        sizes = [len(s) - start for s in seqs]
        return list(zip(mass.split(sizes), hit.split(sizes), strict=True))
