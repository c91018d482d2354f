"""Tokenisation conventions shared by key building, generation and detection.

Texts are encoded without special tokens; a model whose tokenizer adds a BOS token by
default gets that BOS in front of every sequence, exactly once.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase


def bos_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """``[bos_id]`` if the tokenizer prepends BOS by default, else ``[]``."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return []
    probe = tokenizer("a").input_ids
    return [bos] if probe and probe[0] == bos else []


def encode(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list[list[int]]:
    """Token ids of each text, without special tokens."""
    if not texts:
        return []
    return tokenizer(list(texts), add_special_tokens=False).input_ids


def never_green_ids(tokenizer: PreTrainedTokenizerBase, vocab_size: int) -> list[int]:
    """Ids that are in no green list: special tokens and unembedding rows beyond the tokenizer.

    A watermark should not change how often a model emits control tokens (EOS, chat
    markers), and rows past the tokenizer's vocabulary are padding that never decodes.
    """
    special = {i for i in tokenizer.all_special_ids if i is not None and 0 <= i < vocab_size}
    padding = set(range(min(len(tokenizer), vocab_size), vocab_size))
    return sorted(special | padding)


def prompt_windows(
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    prompt_tokens: int,
    continuation_tokens: int,
    limit: int | None = None,
) -> list[tuple[list[int], list[int]]]:
    """Consecutive (prompt, human continuation) token windows, in document order.

    Each document yields as many non-overlapping windows of ``prompt_tokens +
    continuation_tokens`` tokens as it holds; at most ``limit`` windows in all.
    """
    size = prompt_tokens + continuation_tokens
    windows = []
    for ids in encode(tokenizer, texts):
        for start in range(0, len(ids) - size + 1, size):
            windows.append((ids[start : start + prompt_tokens], ids[start + prompt_tokens : start + size]))
            if limit is not None and len(windows) >= limit:
                return windows
    return windows


def document_windows(tokenizer: PreTrainedTokenizerBase, documents: list, seq_len: int) -> torch.Tensor:
    """Consecutive full windows of every document, BOS first: long (N, seq_len)."""
    prefix = bos_prefix(tokenizer)
    body = seq_len - len(prefix)
    rows = [
        prefix + ids[start : start + body]
        for ids in encode(tokenizer, [d.text for d in documents])
        for start in range(0, len(ids) - body + 1, body)
    ]
    if not rows:
        raise ValueError(f"no document holds {seq_len} tokens; lower seq_len or use a longer corpus")
    return torch.tensor(rows, dtype=torch.long)


def token_frequencies(tokenizer: PreTrainedTokenizerBase, documents: list, vocab_size: int) -> torch.Tensor:
    """How often each token id occurs in ``documents`` (objects with ``.text``), as fp32 weights summing to 1, (V,)."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for ids in tokenizer([d.text for d in documents], add_special_tokens=False).input_ids:
        counts += torch.bincount(torch.tensor(ids, dtype=torch.long), minlength=vocab_size)[:vocab_size].double()
    if counts.sum() == 0:
        raise ValueError("the documents hold no tokens to weigh the centring by")
    return (counts / counts.sum()).float()
