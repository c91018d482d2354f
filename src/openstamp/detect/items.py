"""Step 1 of detection: texts, token ids or conversations become items, the tokens to score in their context.

An item holds the context (BOS and any prompt: it conditions the scores and is never scored), the text's
token ids, and which of them count. Texts longer than ``DetectConfig.max_tokens`` are cut, keeping the
prompt's end and the text's start; without a prompt the first ``skip_tokens`` are not scored (they were
chosen with a context the detector lacks).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from openstamp.config import DetectConfig
from openstamp.detect.chat import Chat, render_chat


@dataclass
class Item:
    context: list[int]  # BOS and prompt: conditions the scores, never scored
    text: list[int]
    offsets: list[tuple[int, int]] | None
    source: str | None
    truncated: bool
    mask: list[bool] | None = None  # which of ``text``'s tokens are scored (chat turns, skipped first tokens)

    @property
    def first(self) -> int:
        """Index in context + text of the first scorable token; it needs some context."""
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


def prepare(
    tokenizer: PreTrainedTokenizerBase,
    texts,
    prompts,
    config: DetectConfig,
    *,
    bos: list[int],
    vocab_size: int,
    token_scores: bool = False,
) -> list[Item]:
    """One item per text (a string, token ids, or a ``Chat``), each with its prompt (or None)."""
    if isinstance(texts, str):
        raise TypeError("detect() takes a list of texts; wrap a single text in a list")
    prompts = list(prompts) if prompts is not None else [None] * len(texts)
    if len(prompts) != len(texts):
        raise ValueError(f"{len(texts)} texts but {len(prompts)} prompts")
    items = []
    for text, prompt in zip(texts, prompts, strict=True):
        if isinstance(text, Chat):
            if prompt is not None:
                raise ValueError("a conversation carries its own context; give no prompt with messages")
            items.append(chat_item(tokenizer, text, config))
        else:
            items.append(text_item(tokenizer, text, prompt, config, bos, vocab_size, token_scores))
    return items


def text_item(tokenizer, text, prompt, config: DetectConfig, bos: list[int], vocab_size: int, token_scores: bool):
    """The item of a string or a list of token ids (no special tokens), with an optional prompt."""
    offsets, source = None, None
    if isinstance(text, str):
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=token_scores)
        ids, source = enc.input_ids, text
        offsets = [tuple(o) for o in enc["offset_mapping"]] if token_scores else None
    elif isinstance(text, (list, tuple)) and all(isinstance(t, int) for t in text):
        ids = list(text)
        if any(not 0 <= t < vocab_size for t in ids):
            raise ValueError(f"token ids must lie in [0, {vocab_size})")
    else:
        raise TypeError(f"each text must be a string or a list of token ids (or a Chat), got {type(text).__name__}")
    if isinstance(prompt, str):
        prompt = tokenizer(prompt, add_special_tokens=False).input_ids
    context = bos + list(prompt or [])
    limit, truncated = config.max_tokens, False
    if len(context) + len(ids) > limit:  # keep the prompt's end, then the text's start
        truncated = True
        room = max(limit - len(bos) - len(ids), 0)
        context = bos + (context[len(bos) :][-room:] if room else [])
        ids = ids[: limit - len(context)]
        offsets = offsets[: len(ids)] if offsets else offsets
    mask, skip = None, min(config.skip_tokens, len(ids))
    if skip and not prompt:  # no prompt: the first tokens were chosen with a context the detector lacks
        mask = [False] * skip + [True] * (len(ids) - skip)
    return Item(context, ids, offsets, source, truncated, mask=mask)


def chat_item(tokenizer, chat: Chat, config: DetectConfig) -> Item:
    """The rendered conversation: context up to the first assistant token, then the rest, masked."""
    rendered = render_chat(tokenizer, chat.messages, drop_system=chat.drop_system, drop_reasoning=chat.drop_reasoning)
    ids, mask = rendered.ids, rendered.mask
    truncated = len(ids) > config.max_tokens  # keep the start: later turns are cut
    ids, mask = ids[: config.max_tokens], mask[: config.max_tokens]
    first = next((i for i, m in enumerate(mask) if m), len(ids))
    first = max(first, 1)  # the first token is never scorable
    return Item(ids[:first], ids[first:], None, None, truncated, mask=mask[first:])


def pieces(tokenizer, item: Item) -> list[str]:
    """The text of each scored token (from the source's offsets where there are some)."""
    first = 0 if item.context else 1
    if item.offsets is not None and item.source is not None:
        cut = [item.source[a:b] for a, b in item.offsets[first:]]
        return cut if item.mask is None else [p for p, keep in zip(cut, item.scored(), strict=True) if keep]
    return [tokenizer.decode([t]) for t in item.targets()]
