"""Batched, prompt-free detection against one key: prepare, forward, statistics, decision.

Each step is a module of its own, and a public method here that multi-key detection and the
benchmarks call:

    items = detector.prepare(texts)                  # items.py: token ids in their context
    fwd = detector.forward(items)                    # forward.py: one backbone pass per batch
    stats = detector.statistics(items, fwd)          # statistics.py over llr.py: per-token LLR parts
    results = detector.results(items, fwd)           # decision.py: score, p-value, decision

``detect`` runs them batch by batch, longest texts first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.config import DetectConfig
from openstamp.detect import decision
from openstamp.detect.calibrate import stale_thresholds
from openstamp.detect.chat import Chat
from openstamp.detect.forward import Forward, forward
from openstamp.detect.items import Item, pieces, prepare
from openstamp.detect.llr import TokenStats
from openstamp.detect.result import DetectionResult
from openstamp.detect.statistics import Head, batch_statistics, tail_pvalue
from openstamp.errors import KeyMismatchError
from openstamp.key.key import WatermarkKey
from openstamp.key.prf import permutations
from openstamp.model.hidden import HiddenFn, final_hidden
from openstamp.model.load import load_model, model_device
from openstamp.model.patch import check_key, head, tied_head_mode, watermarked_copy
from openstamp.model.text import bos_prefix

log = logging.getLogger(__name__)


class Detector:
    """Score texts against one key with one model (the released checkpoint or the original).

    Args:
        model: the watermarked checkpoint, or the original base model; the key's fingerprint
            tells which, and the other head is derived as U~ = U + dW or U = U~ - dW. For a
            re-tied key the original model is watermarked on a copy, since the release's
            backbone (its input embeddings) differs from the original's too; a key whose release
            had its backbone repaired (``meta["repair"]``) needs the release itself.
        tokenizer: the model's tokenizer.
        key: the private key.
        config: thresholds, limits and batching.
        hidden: what computes the decoder's states (``final_hidden``; the lab passes a cached one).
        base: the original model, where the owner has it beside the release. The hidden states are then
            read from its backbone, whose input embeddings do not depend on the secret, and the head
            U~ = U + dW derived from its U: the permutation p-value is exact for a re-tied key too
            (docs/detection.md, "Which backbone"). It must be the original this key was made for.

    ``backbone`` says which path the detector took: ``original`` (the base's backbone, or a release
    whose backbone is the original's: an untied key) or ``release`` (a re-tied release's, which carries
    U~ in its input embeddings).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        key: WatermarkKey,
        config: DetectConfig | None = None,
        *,
        hidden: HiddenFn = final_hidden,
        base: PreTrainedModel | None = None,
    ) -> None:
        self.config = config or DetectConfig()
        which = check_key(model, key) if self.config.check_key else "watermarked"
        retied = tied_head_mode(key) == "retie"
        if base is not None:
            if _which(base, key) != "original":
                raise KeyMismatchError(
                    "the base model given is not the original this key was made for; give the base checkpoint the "
                    "release was made from, or leave --base out"
                )
            model, which = base, "original"
        elif which == "original" and retied:
            model, which = watermarked_copy(model, key), "watermarked"  # the caller's model stays as it is
        self.backbone = "release" if retied and which == "watermarked" else "original"
        self.model, self.tokenizer, self.key, self.hidden = model, tokenizer, key, hidden
        for why in self.calibration_warnings:
            log.warning(why)
        self.head = Head(head(model).weight.detach(), getattr(head(model), "bias", None), key, which == "watermarked")
        self.device = model_device(model)
        self.bos = bos_prefix(tokenizer)
        self.never_green = torch.zeros(key.vocab_size, dtype=torch.bool)
        self.never_green[torch.tensor(key.never_green, dtype=torch.long)] = True
        self.perms = permutations(key.secret, key.n_lists, self.config.n_permutations) if self.config.p_values else None
        self.threshold = decision.fixed_threshold(key, self.config)

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        key: str,
        config: DetectConfig | None = None,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        cache_dir: str | None = None,
        base: str | None = None,
    ) -> Detector:
        """Load a model (directory, hub id or packaged alias) and a key directory; ``base``: the original
        model beside the release, whose backbone then computes the hidden states."""
        watermark_key = WatermarkKey.load(key)
        loaded, tokenizer = load_model(model, dtype=dtype, device=device, cache_dir=cache_dir)
        original = None
        if base is not None:
            original, _ = load_model(base, dtype=dtype, device=device, cache_dir=cache_dir)
        return cls(loaded, tokenizer, watermark_key, config, base=original)

    @property
    def key_ids(self) -> list[str]:
        """The ids of the keys this detector scores against (one; ``MultiKeyDetector`` has several)."""
        return [self.key.key_id]

    @property
    def calibration_warnings(self) -> list[str]:
        """Why this detector's calibrated thresholds may not hold their alpha: made on another backbone, or before
        split-conformal thresholds (``calibrate.stale_thresholds``). Empty unless ``config.calibrated``."""
        if not self.config.calibrated:
            return []
        record = self.key.meta.get("calibration") or {}
        found = []
        if record.get("backbone") not in (None, self.backbone):
            found.append(
                f"the key's thresholds were calibrated on the {record['backbone']} backbone and this detector reads "
                f"the {self.backbone} one: calibrate again with the same --base as detection"
            )
        if why := stale_thresholds(record):
            found.append(why)
        return found

    @property
    def head_is_watermarked(self) -> bool:
        return self.head.is_watermarked

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def detect(
        self,
        texts: list[str] | list[list[int]],
        prompts: list[str | None] | list[list[int] | None] | None = None,
        *,
        token_scores: bool = False,
        progress: bool = False,
    ) -> list[DetectionResult]:
        """Score each text (a string, or token ids without special tokens).

        A prompt, if given, conditions the scores; only the text itself is scored.
        """
        items = self.prepare(texts, prompts, token_scores=token_scores)
        return self.run(items, lambda batch: self.results(batch, self.forward(batch), token_scores), progress)

    def detect_messages(
        self,
        conversations: list[list[dict]],
        *,
        drop_system: bool = False,
        drop_reasoning: bool = False,
        token_scores: bool = False,
        progress: bool = False,
    ) -> list[DetectionResult]:
        """Score the assistant turns of each conversation (a list of {role, content} messages).

        Each conversation is rendered with the tokenizer's chat template; every assistant token is
        scored with everything before it as context, and nothing else is scored.
        """
        chats = [Chat(list(m), drop_system=drop_system, drop_reasoning=drop_reasoning) for m in conversations]
        return self.detect(chats, token_scores=token_scores, progress=progress)

    def detect_pool(
        self, texts: list, prompts: list | None = None, *, dedupe: bool = False, progress: bool = False
    ) -> DetectionResult:
        """One result for the whole set of texts: the centred LLR summed over all of their tokens, with a p-value
        that is exact however the texts depend on one another (``pool.py``). ``dedupe`` counts each (context
        window, token) pair once."""
        from openstamp.detect.pool import DEDUPE_WINDOW, detect_pool

        return detect_pool(self, texts, prompts, dedupe_window=DEDUPE_WINDOW if dedupe else None, progress=progress)

    # -- the steps -----------------------------------------------------------------------------

    def prepare(self, texts, prompts=None, *, token_scores: bool = False) -> list[Item]:
        """Step 1 (``items.py``): each text, token ids or ``Chat`` as an item to score."""
        return prepare(
            self.tokenizer,
            texts,
            prompts,
            self.config,
            bos=self.bos,
            vocab_size=self.key.vocab_size,
            token_scores=token_scores,
        )

    def forward(self, items: list[Item]) -> Forward:
        """Step 2 (``forward.py``): one backbone pass; every key that shares this model can score it."""
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        return forward(
            self.model,
            items,
            pad_id=pad,
            padding_side=self.config.padding_side,
            device=self.device,
            hidden=self.hidden,
        )

    def statistics(self, items: list[Item], fwd: Forward) -> TokenStats:
        """Step 3 (``statistics.py``): this key's per-token statistics of the batch, on the CPU."""
        return batch_statistics(self.head, fwd, self.config)

    def results(self, items: list[Item], fwd: Forward, token_scores: bool = False) -> list[DetectionResult]:
        """Step 4 (``decision.py``): this key's result of each item, from a forward pass others may share."""
        stats = self.statistics(items, fwd)
        out = []
        for item, span in zip(items, fwd.spans, strict=True):
            result = decision.decide(
                item, stats, span, key=self.key, config=self.config, perms=self.perms, never_green=self.never_green
            )
            if decision.below_floor(result, self.config) and self.wants_tail(result):
                p_tail = tail_pvalue(self.head, stats, fwd, span, self.config)
                decision.with_tail(result, p_tail, self.config.n_permutations)
            result.backbone = self.backbone
            if token_scores:
                result.token_scores = [round(float(v), 5) for v in stats.llr[span]]
                result.tokens = pieces(self.tokenizer, item)
            out.append(result)
        return out

    def wants_tail(self, result: DetectionResult) -> bool:
        """Whether to refine a p-value at the permutation floor with the tail bound (always, here; the lab
        skips it where no decision it makes needs a finer p-value)."""
        return True

    def run(self, items: list[Item], score: Callable[[list[Item]], list], progress: bool = False) -> list:
        """Results of ``items``: too-short ones directly, the others by ``score`` (batch of items -> results),
        in batches of ``config.batch_size``, longest first."""
        results: list = [decision.too_short(item, self.config) for item in items]
        todo = sorted((i for i, r in enumerate(results) if r is None), key=lambda i: -len(items[i].text))
        bar = tqdm(total=len(todo), desc="detecting", unit="text", disable=not progress)
        for b in range(0, len(todo), self.config.batch_size):
            batch = todo[b : b + self.config.batch_size]
            for i, result in zip(batch, score([items[i] for i in batch]), strict=True):
                results[i] = result
            bar.update(len(batch))
        bar.close()
        return results


def _which(model: PreTrainedModel, key: WatermarkKey) -> str | None:
    """``check_key``'s answer, or None where the model matches neither head of the key."""
    try:
        return check_key(model, key)
    except KeyMismatchError:
        return None
