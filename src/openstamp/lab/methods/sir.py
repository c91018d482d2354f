"""SIR (Liu et al. 2024, "A Semantic Invariant Robust Watermark for LLMs"), a decode-time watermark.

The watermark logits of a context depend on its *meaning*: its sentence embedding ``e``
(MiniLM by default) goes through a trained transform ``T`` (see ``sir_train``) to ``m = 300``
units, which are centred and pushed to +-1, and a keyed mapping ``pi: V -> {0..m-1}`` spreads
them over the vocabulary::

    u(ctx) = tanh(sharpness * (T(e(ctx)) - median T(e(ctx))))      (m,), sharpness = 1000
    s(ctx, v) = u(ctx)[pi(v)]                                       in [-1, 1]; 0 for special/padding ids

Two departures from the reference code, both to make the null mean exactly 0 for each key
(the code's choices gave mean scores of -0.10 .. +0.04 on uniformly random tokens of the tiny
model, depending on the key): the units are centred on their *median* (the code: mean; skewed
outputs then have more units of one sign), and ``pi`` is a keyed *balanced* mapping (a keyed
permutation of the scored ids dealt round-robin to the units; the code draws each token's
unit independently, so units carry unequal numbers of tokens). Half the units are +1 and each
carries the same number of tokens, so ``mean_v s(ctx, v) ~ 0`` in every context.

Generation adds ``delta * s(ctx, .)`` to the logits (before temperature and top-p). Paraphrases
have similar embeddings, hence similar scores: that is SIR's robustness.

Context rule (the same in generation and detection). For the t-th token of the *generated*
text ``y_0 y_1 ...`` (no prompt: the detector never sees it), the context is ``y_0 .. y_{c-1}``
decoded to a string, with ``c(t) = t`` inside the first chunk (t < chunk) and
``c(t) = chunk * floor(t / chunk)`` after it, so the embedding is recomputed only every ``chunk``
tokens (and cached). ``y_0`` has no context: it gets no bias and is not scored. The reference
code chunks by words and skips contexts under 40 words; we chunk by the model's tokens (the
paper's chunk length 10) and score every token after the first.

Detection. Each observed token gets ``s_t = s(ctx_t, y_t)``. With ``unique`` (the default) the
terms are the k distinct tokens' mean scores ``a_v = mean_{t: y_t = v} s_t`` (as kgw scores
distinct pairs); without it, the n per-token scores (the reference code's mean). The score is
the mean term, and the p-value a one-sided self-normalised z-test::

    z = sum_j a_j / sqrt(sum_j a_j^2)        p = 1 - Phi(z)

Under the null (text independent of the key) the terms have mean 0 (the units are centred and
the mapping balanced), so z ~ N(0, 1); the second moment about 0 is the null variance
estimate (a text of all-(+1) terms gives z = sqrt(k), never a division by 0). The reference
code thresholds the mean and gives no p-value. Why distinct tokens: a repeated token's scores
are nearly equal (semantically close contexts give close units), so counting each occurrence
overdisperses z, and for one key a frequent token whose unit is mostly +1 (or -1) shifts a
text's mean; on the tiny test model the byte tokens of U+FFFD, which re-tokenising sampled
invalid UTF-8 produces, dominated the all-token mean and hid the watermark from detection.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from scipy.stats import norm
from transformers import AutoTokenizer, LogitsProcessor, PreTrainedTokenizerBase

from openstamp.config import option
from openstamp.corpus import Document
from openstamp.lab.methods.base import Carrier, MethodScore, WatermarkMethod, register
from openstamp.lab.methods.common import keyed_uint32, load_key, method_secret, save_key
from openstamp.lab.methods.sir_train import TransformNet, embed, train_transform, transform_from_state
from openstamp.model.patch import head
from openstamp.model.text import encode, never_green_ids

_DOMAIN = b"openstamp/eval/sir/mapping/v1"


def context_length(t: int, chunk: int) -> int:
    """How many generated tokens form the context of the t-th one (t >= 1)."""
    return t if t < chunk else chunk * (t // chunk)


class ContextScorer:
    """The key in use: ``s(ctx, .)`` for token contexts, with the units of recent contexts cached.

    Args:
        transform: the trained ``T``.
        mapping: long (|V|,), each token's unit; -1 for ids that are never scored.
        tokenizer: decodes contexts to text for the embedder.
        embedder: the embedder's name (``minilm``, ``bow``, a sentence-transformers name).
        sharpness: the factor inside tanh.
        cache_size: contexts whose units are kept.
    """

    def __init__(
        self,
        transform: TransformNet,
        mapping: torch.Tensor,
        tokenizer: PreTrainedTokenizerBase,
        embedder: str,
        sharpness: float,
        cache_size: int = 8192,
    ) -> None:
        self.transform, self.mapping, self.tokenizer = transform, mapping, tokenizer
        self.embedder, self.sharpness, self.cache_size = embedder, sharpness, cache_size
        self.vocab_size = len(mapping)
        self._cache: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()

    @torch.no_grad()
    def units_of_texts(self, texts: list[str]) -> torch.Tensor:
        """float32 (N, m): ``u`` of each context text."""
        out = self.transform(embed(texts, self.embedder)).float()
        return torch.tanh(self.sharpness * (out - out.quantile(0.5, dim=-1, keepdim=True)))

    def units(self, contexts: list[tuple[int, ...]]) -> torch.Tensor:
        """float32 (N, m): ``u`` of each token context, computed once per distinct context."""
        missing = list(dict.fromkeys(c for c in contexts if c not in self._cache))
        if missing:
            texts = [self.tokenizer.decode(list(c), skip_special_tokens=True) for c in missing]
            for context, row in zip(missing, self.units_of_texts(texts), strict=True):
                self._cache[context] = row
        rows = []
        for c in contexts:
            self._cache.move_to_end(c)
            rows.append(self._cache[c])
        while len(self._cache) > max(self.cache_size, len(contexts)):
            self._cache.popitem(last=False)
        return torch.stack(rows)

    def token_scores(self, units: torch.Tensor) -> torch.Tensor:
        """(N, m) units -> float32 (N, |V|) scores ``s``, 0 for ids never scored."""
        scores = units[:, self.mapping.clamp_min(0)]
        return scores.masked_fill(self.mapping < 0, 0.0)


class SIRProcessor(LogitsProcessor):
    """Adds ``delta * s(ctx, .)`` to each row; ctx follows the chunk rule over the generated tokens.

    The processor remembers where the current ``generate`` call began (the padded prompt's
    width): a call whose ids do not extend the previous call's by one token starts a new text.
    """

    def __init__(self, scorer: ContextScorer, delta: float, chunk: int) -> None:
        self.scorer, self.delta, self.chunk = scorer, delta, chunk
        self._previous: torch.Tensor | None = None
        self._start = 0

    def _continues(self, input_ids: torch.Tensor) -> bool:
        prev = self._previous
        return (
            prev is not None
            and prev.shape[0] == input_ids.shape[0]
            and prev.shape[1] + 1 == input_ids.shape[1]
            and torch.equal(prev, input_ids[:, :-1].cpu())
        )

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """input_ids: long (B, L); scores: (B, |V|) -> biased scores (B, |V|)."""
        if scores.shape[-1] != self.scorer.vocab_size:
            raise ValueError(f"scores have {scores.shape[-1]} columns, the key has {self.scorer.vocab_size}")
        if not self._continues(input_ids):
            self._start = input_ids.shape[1]
        self._previous = input_ids.detach().cpu().clone()
        t = input_ids.shape[1] - self._start
        if t == 0:
            return scores
        end = self._start + context_length(t, self.chunk)
        contexts = [tuple(row) for row in input_ids[:, self._start : end].tolist()]
        bias = self.scorer.token_scores(self.scorer.units(contexts))
        return scores + self.delta * bias.to(device=scores.device, dtype=scores.dtype)


@dataclass(frozen=True, kw_only=True)
class SIRConfig:
    delta: float = option(1.0, "scale of the semantic scores added to the logits (the swept strength; the paper: 1.0)")
    chunk: int = option(10, "tokens between recomputations of the context embedding (the paper: 10)")
    embedder: str = option("minilm", "sentence embedder: 'minilm' (packaged), 'bow' (light, for tests), a name or path")
    hidden: int = option(500, "width of the transform's hidden layers (the reference code: 500)")
    layers: int = option(4, "linear layers of the transform, residual blocks between the first and last (code: 4)")
    units: int = option(300, "output units m of the transform, spread over the vocabulary (the reference code: 300)")
    sharpness: float = option(1000.0, "factor inside tanh pushing the centred units to +-1 (the reference code: 1000)")
    train_texts: int = option(512, "text windows of the key documents the transform is trained on")
    train_window: int = option(64, "longest training window in tokens (lengths are uniform in [chunk, this])")
    steps: int = option(300, "Adam steps of transform training")
    batch_size: int = option(64, "windows per training step (every pair in a batch is a similarity term)")
    lr: float = option(1e-3, "Adam learning rate")
    sim_scale: float = option(20.0, "scale inside tanh of the similarity target (paper and code: 20)")
    norm_weight: float = option(0.1, "weight of the normalisation loss (the reference code: 0.1)")
    unique: bool = option(True, "score each distinct token once (its mean score); False: every token (the code)")
    min_tokens: int = option(16, "texts with fewer scored tokens get no score")

    def __post_init__(self) -> None:
        if not (math.isfinite(self.delta) and self.delta > 0):
            raise ValueError(f"delta must be positive, got {self.delta}")
        positive = ("chunk", "hidden", "units", "train_texts", "steps", "min_tokens")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.layers < 2 or self.batch_size < 2 or self.train_window < self.chunk:
            raise ValueError("need layers >= 2, batch_size >= 2 and train_window >= chunk")
        if not (self.sharpness > 0 and self.lr > 0 and self.sim_scale > 0 and self.norm_weight >= 0):
            raise ValueError("sharpness, lr and sim_scale must be positive, norm_weight non-negative")


def training_texts(
    tokenizer: PreTrainedTokenizerBase, documents: list[Document], cfg: SIRConfig, seed: int
) -> list[str]:
    """Up to ``cfg.train_texts`` windows of the documents, of uniform length in [chunk, train_window]."""
    rng = np.random.default_rng(seed)
    windows = []
    for ids in encode(tokenizer, [d.text for d in documents]):
        for start in range(0, max(len(ids) - cfg.chunk + 1, 0), cfg.train_window):
            length = int(rng.integers(cfg.chunk, cfg.train_window + 1))
            windows.append(ids[start : start + length])
    if len(windows) < 2:
        raise ValueError(f"the key documents hold fewer than two windows of {cfg.chunk} tokens")
    chosen = sorted(rng.permutation(len(windows))[: cfg.train_texts].tolist())
    return [tokenizer.decode(windows[i], skip_special_tokens=True) for i in chosen]


def keyed_mapping(seed: int, vocab_size: int, units: int, excluded: list[int]) -> torch.Tensor:
    """long (|V|,): a keyed balanced mapping of the scored ids onto the m units, -1 for the excluded ids.

    The scored ids are ordered by a keyed permutation (argsort of a SHAKE-256 stream) and dealt
    round-robin: ``pi(v) = rank(v) mod m``, so each unit carries floor or ceil(|V'| / m) tokens.
    """
    scored = torch.ones(vocab_size, dtype=torch.bool)
    scored[torch.as_tensor(excluded, dtype=torch.long)] = False
    ids = torch.nonzero(scored).squeeze(1)
    words = keyed_uint32(method_secret("sir", seed), _DOMAIN, 0, vocab_size)[ids.numpy()]
    order = ids[torch.from_numpy(np.argsort(words, kind="stable"))]
    mapping = torch.full((vocab_size,), -1, dtype=torch.long)
    mapping[order] = torch.arange(len(order)) % units
    return mapping


@register
class SIR(WatermarkMethod):
    name = "sir"
    config_class = SIRConfig
    strength = "delta"
    scores_ignore_strength = True  # the z-test of the semantic scores: delta only generates
    sweep = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0)  # the paper uses 1.0
    key_fields = ("scorer",)
    carrier = Carrier.DECODER
    scorer: ContextScorer

    def build(self, model, tokenizer, documents, seed) -> None:
        cfg = self.config
        vocab = head(model).weight.shape[0]
        mapping = keyed_mapping(seed, vocab, cfg.units, never_green_ids(tokenizer, vocab))
        embeddings = embed(training_texts(tokenizer, documents, cfg, seed), cfg.embedder)
        net, self.train_losses = train_transform(
            embeddings,
            hidden=cfg.hidden,
            layers=cfg.layers,
            out_dim=cfg.units,
            steps=cfg.steps,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            scale=cfg.sim_scale,
            norm_weight=cfg.norm_weight,
            seed=seed,
        )
        self.scorer = ContextScorer(net, mapping, tokenizer, cfg.embedder, cfg.sharpness)

    def save(self, directory: Path) -> None:
        state = {f"transform.{k}": v for k, v in self.scorer.transform.state_dict().items()}
        save_key(directory, self.config, {"mapping": self.scorer.mapping, **state})
        self.scorer.tokenizer.save_pretrained(str(Path(directory) / "tokenizer"))

    def load(self, directory: Path) -> None:
        self.config, t = load_key(directory, self.config_class)
        net = transform_from_state({k.removeprefix("transform."): v for k, v in t.items() if k != "mapping"})
        tokenizer = AutoTokenizer.from_pretrained(str(Path(directory) / "tokenizer"))
        self.scorer = ContextScorer(net, t["mapping"], tokenizer, self.config.embedder, self.config.sharpness)

    def logits_processor(self) -> LogitsProcessor:
        return SIRProcessor(self.scorer, self.config.delta, self.config.chunk)

    def score(self, base, tokenizer, texts, batch_size=16) -> list[MethodScore]:
        seqs = encode(tokenizer, texts)
        per_token = self.token_scores(seqs)
        return [self.z_test(s, torch.tensor(y[1:], dtype=torch.long)) for s, y in zip(per_token, seqs, strict=True)]

    def token_scores(self, seqs: list[list[int]]) -> list[torch.Tensor]:
        """float32 (len(y) - 1,) for each token sequence y: ``s(ctx_t, y_t)`` for t >= 1."""
        chunk = self.config.chunk
        contexts = [tuple(y[: context_length(t, chunk)]) for y in seqs for t in range(1, len(y))]
        targets = torch.tensor([tok for y in seqs for tok in y[1:]], dtype=torch.long)
        if not contexts:
            return [torch.zeros(0) for _ in seqs]
        units = self.scorer.units(contexts)
        mapped = self.scorer.mapping[targets]
        values = units.gather(1, mapped.clamp_min(0)[:, None]).squeeze(1).masked_fill(mapped < 0, 0.0)
        return list(values.split([max(len(y) - 1, 0) for y in seqs]))

    def z_test(self, values: torch.Tensor, tokens: torch.Tensor) -> MethodScore:
        """The detection of one text from its per-token scores and tokens (n,): mean score, z, one-sided p."""
        count = len(values)
        if count < self.config.min_tokens:
            return MethodScore(None, None, count)
        v = values.double()
        terms = distinct_means(v, tokens) if self.config.unique else v
        energy = float(terms.pow(2).sum())
        z = float(terms.sum()) / math.sqrt(energy) if energy > 0 else 0.0
        extra = {"z": z, "n_terms": float(len(terms)), "mean_all_tokens": float(v.mean())}
        return MethodScore(float(terms.mean()), float(norm.sf(z)), count, extra)


def distinct_means(values: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """(n,) scores and (n,) token ids -> (k,): the mean score of each of the k distinct tokens."""
    uniq, inverse = torch.unique(tokens, return_inverse=True)
    sums = torch.zeros(len(uniq), dtype=values.dtype).index_add_(0, inverse, values)
    return sums / torch.bincount(inverse, minlength=len(uniq)).to(values.dtype)
