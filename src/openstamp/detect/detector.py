"""Batched, prompt-free detection with one backbone forward pass per batch.

``Detector`` tokenises texts (or takes token ids), runs the decoder once, and hands the
final hidden states of the scored positions to the pure statistics in ``llr.py``.
"""

from __future__ import annotations

import contextlib
import math
import threading
from dataclasses import dataclass

import torch
from scipy.stats import binom
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.config import DetectConfig
from openstamp.detect.calibrate import calibrated_threshold, length_band
from openstamp.detect.chat import Chat, render_chat
from openstamp.detect.llr import TokenStats, join_stats, permutation_pvalue, stats_rows, token_stats
from openstamp.detect.result import DetectionResult
from openstamp.detect.tail import chernoff_pvalue, combined_pvalue, tail_terms
from openstamp.hidden import active_cache, decoder_dtype, final_hidden
from openstamp.key.key import WatermarkKey
from openstamp.key.prf import permutations
from openstamp.models import load_model, model_device
from openstamp.patch import check_key, head, tied_head_mode, watermarked_copy
from openstamp.text import bos_prefix

PERMUTATION_TEST = "permutation test of the centred LLR over list assignments (K={k})"
TAIL_TEST = PERMUTATION_TEST + "; below 1/(K+1): Chernoff bound over random keys"
_NEEDED = threading.local()  # the smallest p-value level this thread's callers decide at (p_values_down_to)


@contextlib.contextmanager
def p_values_down_to(level: float):
    """Within the block (this thread), p-values are needed only to decide p <= ``level``.

    Where the permutation test's floor 1/(K+1) is at or below ``level``, the tail bound (one pass over the
    vocabulary per text) is not computed: it changes only p-values at that floor, and every p <= ``level``
    decision is the same without it. The results' ``test`` then names the permutation test alone.
    """
    previous = getattr(_NEEDED, "level", 0.0)
    _NEEDED.level = level
    try:
        yield
    finally:
        _NEEDED.level = previous


@dataclass
class _Item:
    context: list[int]  # BOS and prompt: conditions the scores, never scored
    text: list[int]
    offsets: list[tuple[int, int]] | None
    source: str | None
    truncated: bool
    mask: list[bool] | None = None  # which of ``text``'s tokens are scored (chat turns, skipped first tokens)

    @property
    def first(self) -> int:  # index in context + text of the first scorable token; it needs some context
        return len(self.context) if self.context else 1

    def scored(self) -> list[bool]:
        """(len(context + text) - first,) which scorable tokens count."""
        every = [True] * (len(self.context) + len(self.text) - self.first)
        return every if self.mask is None else self.mask[len(self.mask) - len(every) :]

    @property
    def n_scored(self) -> int:
        return sum(self.scored())

    def targets(self) -> list[int]:
        """The scored tokens, in order."""
        seq = (self.context + self.text)[self.first :]
        return [t for t, keep in zip(seq, self.scored(), strict=True) if keep]


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
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        key: WatermarkKey,
        config: DetectConfig | None = None,
    ) -> None:
        self.config = config or DetectConfig()
        which = check_key(model, key) if self.config.check_key else "watermarked"
        if which == "original" and tied_head_mode(key) == "retie":  # the release's embeddings are U~ too
            model, which = watermarked_copy(model, key), "watermarked"  # the caller's model stays as it is
        self.model, self.tokenizer, self.key = model, tokenizer, key
        self.head_is_watermarked = which == "watermarked"
        self.weight = head(model).weight.detach()
        self.bias = getattr(head(model), "bias", None)
        self.device = model_device(model)
        self.bos = bos_prefix(tokenizer)
        self.never_green = torch.zeros(key.vocab_size, dtype=torch.bool)
        self.never_green[torch.tensor(key.never_green, dtype=torch.long)] = True
        self.perms = permutations(key.secret, key.n_lists, self.config.n_permutations) if self.config.p_values else None
        self.threshold = self._threshold()
        # per-token statistics of scored texts, kept while a hidden-state cache is active: a StatsMemo-like object
        # (find, keep, bind) that a caller scoring cut texts sets, as the lab's evaluation does; None keeps nothing
        self.memo = None

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
    ) -> Detector:
        """Load a model (directory, hub id or packaged alias) and a key directory."""

        watermark_key = WatermarkKey.load(key)
        loaded, tokenizer = load_model(model, dtype=dtype, device=device, cache_dir=cache_dir)
        return cls(loaded, tokenizer, watermark_key, config)

    @property
    def key_ids(self) -> list[str]:
        """The ids of the keys this detector scores against (one; ``MultiKeyDetector`` has several)."""
        return [self.key.key_id]

    def _threshold(self) -> float | None:
        if self.config.threshold is not None:
            return self.config.threshold
        if self.config.calibrated:
            return calibrated_threshold(self.key, self.config.alpha)
        return None

    # -- public API ----------------------------------------------------------------------------

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
        items = self._prepare(texts, prompts, token_scores)
        return self._run(items, lambda batch: self._batch_results(batch, self._forward(batch), token_scores), progress)

    def _run(self, items: list[_Item], score, progress: bool) -> list:
        """Results of ``items``: too-short ones directly, the others by ``score`` (batch of items -> results)."""
        results: list = [None] * len(items)
        for i, item in enumerate(items):
            if item.n_scored < self.config.min_tokens:
                results[i] = DetectionResult(
                    status="too_short",
                    n_tokens=item.n_scored,
                    truncated=item.truncated,
                    rule=f"needs at least {self.config.min_tokens} scored tokens",
                )
        todo = sorted((i for i, r in enumerate(results) if r is None), key=lambda i: -len(items[i].text))
        bar = tqdm(total=len(todo), desc="detecting", unit="text", disable=not progress)
        for b in range(0, len(todo), self.config.batch_size):
            batch = todo[b : b + self.config.batch_size]
            for i, result in zip(batch, score([items[i] for i in batch]), strict=True):
                results[i] = result
            bar.update(len(batch))
        bar.close()
        return results

    def _batch_results(self, items: list[_Item], forward, token_scores: bool) -> list[DetectionResult]:
        """This key's results for a batch, from the hidden states of ``_forward`` (which other keys may share)."""
        stats, spans, hidden, targets = self._stats(items, *forward)
        results = []
        for item, span in zip(items, spans, strict=True):
            result = self._result(item, stats, span, token_scores)
            self._refine_tail(result, stats, span, hidden[span], targets[span])
            results.append(result)
        return results

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

    # -- steps ---------------------------------------------------------------------------------

    def _prepare(self, texts, prompts, token_scores: bool) -> list[_Item]:
        if isinstance(texts, str):
            raise TypeError("detect() takes a list of texts; wrap a single text in a list")
        prompts = list(prompts) if prompts is not None else [None] * len(texts)
        if len(prompts) != len(texts):
            raise ValueError(f"{len(texts)} texts but {len(prompts)} prompts")
        return [self._item(text, prompt, token_scores) for text, prompt in zip(texts, prompts, strict=True)]

    def _item(self, text, prompt, token_scores: bool) -> _Item:
        offsets, source = None, None
        if isinstance(text, Chat):
            if prompt is not None:
                raise ValueError("a conversation carries its own context; give no prompt with messages")
            return self._chat_item(text)
        if isinstance(text, str):
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=token_scores)
            ids, source = enc.input_ids, text
            offsets = [tuple(o) for o in enc["offset_mapping"]] if token_scores else None
        elif isinstance(text, (list, tuple)) and all(isinstance(t, int) for t in text):
            ids = list(text)
            if any(not 0 <= t < self.key.vocab_size for t in ids):
                raise ValueError(f"token ids must lie in [0, {self.key.vocab_size})")
        else:
            raise TypeError(f"each text must be a string or a list of token ids (or a Chat), got {type(text).__name__}")
        if isinstance(prompt, str):
            prompt = self.tokenizer(prompt, add_special_tokens=False).input_ids
        context = self.bos + list(prompt or [])
        limit, truncated = self.config.max_tokens, False
        if len(context) + len(ids) > limit:  # keep the prompt's end, then the text's start
            truncated = True
            room = max(limit - len(self.bos) - len(ids), 0)
            context = self.bos + (context[len(self.bos) :][-room:] if room else [])
            ids = ids[: limit - len(context)]
            offsets = offsets[: len(ids)] if offsets else offsets
        mask, skip = None, min(self.config.skip_tokens, len(ids))
        if skip and not prompt:  # no prompt: the first tokens were chosen with a context the detector lacks
            mask = [False] * skip + [True] * (len(ids) - skip)
        return _Item(context, ids, offsets, source, truncated, mask=mask)

    def _chat_item(self, chat: Chat) -> _Item:
        """The rendered conversation: context up to the first assistant token, then the rest, masked."""
        rendered = render_chat(
            self.tokenizer, chat.messages, drop_system=chat.drop_system, drop_reasoning=chat.drop_reasoning
        )
        ids, mask = rendered.ids, rendered.mask
        truncated = len(ids) > self.config.max_tokens  # keep the start: later turns are cut
        ids, mask = ids[: self.config.max_tokens], mask[: self.config.max_tokens]
        first = next((i for i, m in enumerate(mask) if m), len(ids))
        first = max(first, 1)  # the first token is never scorable
        return _Item(ids[:first], ids[first:], None, None, truncated, mask=mask[first:])

    def _score_batch(self, items: list[_Item]) -> tuple[TokenStats, list[slice], torch.Tensor, torch.Tensor]:
        """One forward pass for the batch; statistics, hidden states and targets of every scored token."""
        return self._stats(items, *self._forward(items))

    @torch.inference_mode()
    def _forward(self, items: list[_Item]) -> tuple[list[slice], torch.Tensor, torch.Tensor]:
        """One forward pass: the spans of each item's scored tokens, their hidden states (N, d) and targets (N,).

        Every key that shares this detector's model can score the same hidden states."""
        seqs = [it.context + it.text for it in items]
        width = max(len(s) for s in seqs)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        starts = []
        for i, seq in enumerate(seqs):
            start = 0 if self.config.padding_side == "right" else width - len(seq)
            ids[i, start : start + len(seq)] = torch.tensor(seq)
            mask[i, start : start + len(seq)] = 1
            starts.append(start)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = final_hidden(self.model, ids.to(self.device), mask.to(self.device), positions.to(self.device))
        rows, cols, targets, spans = [], [], [], []
        for i, (it, start) in enumerate(zip(items, starts, strict=True)):
            idx = torch.arange(start + it.first, start + len(seqs[i]))[torch.tensor(it.scored(), dtype=torch.bool)]
            spans.append(slice(len(targets), len(targets) + len(idx)))
            rows.append(torch.full_like(idx, i))
            cols.append(idx - 1)  # the hidden state before a token predicts it
            targets.extend(it.targets())
        h = hidden[torch.cat(rows).to(self.device), torch.cat(cols).to(self.device)]
        return spans, h, torch.tensor(targets, device=self.device)

    def _stats(self, items, spans, h, targets) -> tuple[TokenStats, list[slice], torch.Tensor, torch.Tensor]:
        """The batch's token statistics; while a hidden-state cache is active, a text cut from one scored before
        takes that text's first rows (``self.memo``, where set), and only the others go through the vocabulary.
        Chat items (masked) are never memoised."""
        memo = self.memo if self.memo is not None and self.memo.bind(active_cache(), decoder_dtype()) else None
        seqs, firsts = [it.context + it.text for it in items], [it.first for it in items]
        found = [
            None if memo is None or it.mask is not None else memo.find(seq, first)
            for it, seq, first in zip(items, seqs, firsts, strict=True)
        ]
        missing = [j for j, f in enumerate(found) if f is None]
        if not missing:
            return join_stats(found), spans, h, targets
        rows = torch.cat([torch.arange(spans[j].start, spans[j].stop) for j in missing]).to(self.device)
        every = len(missing) == len(seqs)
        computed = _to_cpu(
            token_stats(
                h if every else h[rows],
                targets if every else targets[rows],
                self.weight,
                self.key,
                bias=self.bias,
                head_is_watermarked=self.head_is_watermarked,
                with_null=self.config.p_values,
                chunk=self.config.chunk_tokens,
                block=self.config.vocab_block,
                top_k=self.config.centring_top_k,
            )
        )
        start = 0
        for j in missing:
            found[j] = stats_rows(computed, start, start + spans[j].stop - spans[j].start)
            start += spans[j].stop - spans[j].start
            if memo is not None and items[j].mask is None:
                memo.keep(seqs[j], firsts[j], found[j])
        return (computed if every else join_stats(found)), spans, h, targets

    def _refine_tail(self, result: DetectionResult, stats: TokenStats, span: slice, hidden, targets) -> None:
        """Below the permutation floor, bound the p-value with the Chernoff tail over random keys."""
        floor = 1.0 / (self.config.n_permutations + 1)
        if result.p_value is None or not self.config.tail_bound or result.p_value > floor:
            return
        if floor <= getattr(_NEEDED, "level", 0.0):  # p_values_down_to: no decision needs a finer p-value
            return
        terms = tail_terms(
            hidden,
            targets,
            self.weight,
            self.key,
            stats.selector[span],
            stats.lse_orig[span],
            float(stats.centred[span].double().sum()),
            bias=self.bias,
            head_is_watermarked=self.head_is_watermarked,
            block=self.config.vocab_block,
        )
        p_tail = chernoff_pvalue(terms, self.key.delta, self.key.gamma)
        result.detectors["tail_p"] = p_tail
        result.p_value = combined_pvalue(result.p_value, self.config.n_permutations, p_tail)
        result.test = TAIL_TEST.format(k=self.config.n_permutations)

    def _result(self, item: _Item, stats: TokenStats, span: slice, token_scores: bool) -> DetectionResult:
        llr = stats.llr[span]
        n = len(llr)
        detectors = {
            "llr": float(llr.mean()),
            "discrete_llr": float(stats.discrete[span].mean()),
            "green_fraction": float(stats.green[span].float().mean()),
            **self._binomial(item, stats, span),
        }
        p_value, test = None, None
        if self.perms is not None:
            statistic, p_value, z = permutation_pvalue(
                stats.selector[span], stats.residual[span], self.perms, self.key.delta
            )
            detectors.update(centred_llr=statistic / n, permutation_z=z, permutation_p=p_value)
            test = PERMUTATION_TEST.format(k=len(self.perms))
        score = detectors["llr"]
        band = length_band(self.key, n)
        threshold = self.threshold
        if self.config.calibrated and self.config.threshold is None and band is not None:
            threshold = calibrated_threshold(self.key, self.config.alpha, n)
        if threshold is not None:
            decision, rule = score > threshold, f"llr > {threshold:.4g}"
        elif p_value is not None:
            decision, rule = p_value <= self.config.alpha, f"p <= {self.config.alpha:g}"
        else:
            decision, rule = None, "no threshold: pass a threshold, calibrate the key, or enable p-values"
        result = DetectionResult(
            status="ok",
            n_tokens=n,
            score=score,
            p_value=p_value,
            test=test,
            decision=decision,
            rule=rule,
            detectors=detectors,
            truncated=item.truncated,
            length_band=band,
        )
        if token_scores:
            result.token_scores = [round(float(v), 5) for v in llr]
            result.tokens = self._pieces(item)
        return result

    def _binomial(self, item: _Item, stats: TokenStats, span: slice) -> dict[str, float]:
        """Green count over unique (token, selected list) pairs; exact binomial p-value.

        Repeated pairs are counted once (their memberships are not independent), and
        tokens that are in no list are left out, so under a random key each counted pair
        is green with probability exactly gamma.
        """
        targets = item.targets()
        pairs = {}
        for t, sel, g in zip(targets, stats.selected[span].tolist(), stats.green[span].tolist(), strict=True):
            if not self.never_green[t]:
                pairs[(t, sel)] = g
        n, k, gamma = len(pairs), sum(pairs.values()), self.key.gamma
        if n == 0:
            return {"binomial_z": float("nan"), "binomial_p": float("nan"), "binomial_pairs": 0}
        z = (k - gamma * n) / math.sqrt(n * gamma * (1 - gamma))
        return {"binomial_z": z, "binomial_p": float(binom.sf(k - 1, n, gamma)), "binomial_pairs": n}

    def _pieces(self, item: _Item) -> list[str]:
        first = 0 if item.context else 1
        if item.offsets is not None and item.source is not None:
            pieces = [item.source[a:b] for a, b in item.offsets[first:]]
            return pieces if item.mask is None else [p for p, keep in zip(pieces, item.scored(), strict=True) if keep]
        return [self.tokenizer.decode([t]) for t in item.targets()]


def _to_cpu(stats: TokenStats) -> TokenStats:
    return TokenStats(**{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in stats.__dict__.items()})
