"""Final hidden states (the input of lm_head) at sampled token positions, with prefix texts.

Each document is cut into windows; one forward pass per window gives the hidden state
of every prefix in it, of which a fixed number of positions is sampled.
"""

from __future__ import annotations

import contextlib
import math
import threading
import warnings
import weakref
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.config import StatesConfig
from openstamp.corpus import Document
from openstamp.generate import sample_completions
from openstamp.models import model_device
from openstamp.text import bos_prefix, encode

SAMPLED_PROMPT = 16  # corpus tokens that start each window of the model's own text (sampled_windows)


@dataclass
class States:
    """Sampled states. hidden: fp32 (N, d); texts: N prefix texts; document: (N,) document index."""

    hidden: torch.Tensor
    texts: list[str]
    document: torch.Tensor

    def __len__(self) -> int:
        return len(self.texts)

    def subset(self, index: torch.Tensor) -> States:
        return States(self.hidden[index], [self.texts[i] for i in index.tolist()], self.document[index])


@dataclass(frozen=True)
class Window:
    document: int
    ids: list[int]
    positions: list[int]


def plan_windows(
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    cfg: StatesConfig,
    sampled: list[list[int]] = (),
    encoded: list[list[int]] | None = None,
) -> list[Window]:
    """Choose windows and positions deterministically from ``cfg.seed``.

    The candidates are every window of every document, then each of ``sampled`` (whole windows of
    token ids, :func:`sampled_windows`) as a document of its own, numbered after ``documents``.
    ``encoded``: the documents' token ids where the caller has them already.
    """
    rng = np.random.default_rng(cfg.seed)
    prefix = bos_prefix(tokenizer)
    body = cfg.window_tokens - len(prefix)
    candidates = []
    for d, ids in enumerate(encoded if encoded is not None else encode_documents(tokenizer, documents)):
        for start in range(0, len(ids), body):
            chunk = prefix + ids[start : start + body]
            if len(chunk) >= cfg.min_context + cfg.positions_per_window:
                candidates.append((d, chunk))
    candidates += [(len(documents) + j, list(chunk)) for j, chunk in enumerate(sampled)]
    needed = math.ceil(cfg.n_states / cfg.positions_per_window)
    if not candidates:
        raise ValueError("no document is long enough for one window; use longer documents or smaller windows")
    if len(candidates) < needed:
        warnings.warn(
            f"the corpus gives {len(candidates)} windows, fewer than the {needed} needed for "
            f"{cfg.n_states} states; using {len(candidates) * cfg.positions_per_window} states",
            stacklevel=2,
        )
    order = rng.permutation(len(candidates))[:needed]
    windows = []
    for i in order:
        d, chunk = candidates[i]
        positions = rng.choice(np.arange(cfg.min_context, len(chunk)), cfg.positions_per_window, replace=False)
        windows.append(Window(d, chunk, sorted(positions.tolist())))
    return windows


def sampled_windows(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    cfg: StatesConfig,
    progress: bool = True,
    encoded: list[list[int]] | None = None,
) -> list[list[int]]:
    """``cfg.generated_windows`` windows of the model's own text, for states like those it meets in detection.

    Each is BOS (where the tokenizer uses one), ``SAMPLED_PROMPT`` tokens from a random place in a random
    document (drawn from ``cfg.seed``), then pure samples (temperature 1) up to ``cfg.window_tokens``.
    ``encoded``: the documents' token ids where the caller has them already.
    """
    if cfg.generated_windows == 0:
        return []
    prefix = bos_prefix(tokenizer)
    encoded = encoded if encoded is not None else encode_documents(tokenizer, documents)
    encoded = [ids for ids in encoded if len(ids) >= SAMPLED_PROMPT]
    if not encoded:
        raise ValueError(f"states.generated_windows needs a document of at least {SAMPLED_PROMPT} tokens to start from")
    rng = np.random.default_rng([cfg.seed, 1])  # a stream of its own, apart from plan_windows'
    prompts = []
    for d in rng.integers(len(encoded), size=cfg.generated_windows).tolist():
        start = int(rng.integers(len(encoded[d]) - SAMPLED_PROMPT + 1))
        prompts.append(encoded[d][start : start + SAMPLED_PROMPT])
    new_tokens = cfg.window_tokens - len(prefix) - SAMPLED_PROMPT
    if new_tokens < 1:
        raise ValueError(f"states.generated_windows needs window_tokens above {len(prefix) + SAMPLED_PROMPT}")
    sampled = sample_completions(model, tokenizer, prompts, new_tokens, seed=cfg.seed, progress=progress)
    return [prefix + p + s for p, s in zip(prompts, sampled, strict=True)]


def encode_documents(tokenizer: PreTrainedTokenizerBase, documents: list[Document]) -> list[list[int]]:
    """Each document's token ids (no special tokens)."""
    return encode(tokenizer, [doc.text for doc in documents])


def state_windows(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    cfg: StatesConfig,
    progress: bool = True,
) -> list[Window]:
    """The windows a key's states are read from: the corpus's and, with ``cfg.generated_windows``, the model's own
    text started from it (:func:`plan_windows` over :func:`sampled_windows`), the corpus tokenized once."""
    encoded = encode_documents(tokenizer, documents)
    sampled = sampled_windows(model, tokenizer, documents, cfg, progress, encoded=encoded)
    return plan_windows(tokenizer, documents, cfg, sampled, encoded=encoded)


@torch.inference_mode()
def final_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """The decoder's last hidden state, i.e. what lm_head multiplies. (B, T) -> (B, T, d).

    Pass ``position_ids`` for left-padded batches.
    """
    cache = active_cache()
    if cache is None:
        return _decoder(model, input_ids, attention_mask, position_ids)
    key = (*cache.key(input_ids, attention_mask, position_ids), decoder_dtype())  # states of one precision only
    if (hit := cache.get(model, key)) is not None:
        return hit
    lengths = padded_row_lengths(attention_mask, position_ids)
    found = cache.prefixes(model, input_ids, lengths, decoder_dtype()) if lengths is not None else []
    reused = [row for row in found if row is not None]
    if not reused:
        cache.misses += 1
        out = _decoder(model, input_ids, attention_mask, position_ids)
        cache.put(model, key, out, input_ids, lengths)
        return out
    # rows that start a cached row take its states; the others (cut where a cached row was not) run alone
    out = reused[0].new_zeros((*input_ids.shape, reused[0].shape[-1]))
    for i, row in enumerate(found):
        if row is not None:
            out[i, : len(row)] = row
    missing = [i for i, row in enumerate(found) if row is None and lengths[i] > 0]
    if not missing:
        cache.prefix_hits += 1
        return out
    cache.misses += 1
    width = max(lengths[i] for i in missing)
    ids, mask = input_ids[missing, :width], attention_mask[missing, :width]
    rest = _decoder(model, ids, mask, None)
    cache.put(model, (*cache.key(ids, mask, None), decoder_dtype()), rest, ids, [lengths[i] for i in missing])
    for j, i in enumerate(missing):
        out[i, : lengths[i]] = rest[j, : lengths[i]]
    return out


def _decoder(model, input_ids, attention_mask, position_ids) -> torch.Tensor:
    dtype = decoder_dtype()
    with torch.autocast(input_ids.device.type, dtype=getattr(torch, dtype or "float32"), enabled=dtype is not None):
        out = model.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
    return out if dtype is None else out.float()


def padded_row_lengths(mask: torch.Tensor, position_ids: torch.Tensor | None) -> list[int] | None:
    """Each row's length when every row is right-padded and counts positions from 0; None otherwise (left padding)."""
    lengths = mask.sum(-1)
    columns = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    if not torch.equal(mask, (columns < lengths[:, None]).to(mask.dtype)):
        return None
    if position_ids is not None and not torch.equal(position_ids * mask, columns * mask):
        return None
    return lengths.tolist()


class HiddenCache:
    """Final hidden states already computed, by model and batch (``final_hidden`` inside ``reusing``).

    Scoring the same texts with several detectors of one model (an eval's human continuations, once
    per method and strength) then runs the decoder once. An entry is used only for the very model
    object that made it (a weak reference), and only while the caller keeps that model's decoder
    unchanged: weight-level methods apply their watermark outside ``reusing`` and revert it exactly,
    unless the watermark leaves the decoder alone (``WatermarkMethod.keeps_hidden``). States computed under
    ``autocast_decoder`` serve only calls in the same dtype (the dtype ends each key).

    A causal decoder's state at a position depends on the tokens up to it alone, so a right-padded
    row that starts a cached row's tokens takes that row's first states (the same numbers, up to
    float rounding in kernels of another shape): the texts of a length curve, each cut from a text
    scored before, run no decoder. Bounded by ``max_bytes``: the least recently used entries go first.
    """

    INDEX = 4  # a cached row is found by its first INDEX tokens (a row shorter than that, only by an equal one)

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes, self.entries, self.bytes = max_bytes, {}, 0
        self.hits, self.prefix_hits, self.misses = 0, 0, 0
        self.rows: dict[tuple, list[tuple]] = {}  # first tokens -> [(entry key, row, token ids)]

    @staticmethod
    def key(*tensors: torch.Tensor | None) -> tuple:
        return tuple(None if t is None else (tuple(t.shape), t.cpu().numpy().tobytes()) for t in tensors)

    def get(self, model, key: tuple) -> torch.Tensor | None:
        entry = self.entries.get(key)
        if entry is None or entry[0]() is not model:
            return None
        self.hits += 1
        self.entries[key] = self.entries.pop(key)  # the most recently used goes last
        return entry[1]

    def prefixes(self, model, ids: torch.Tensor, lengths: list[int], precision=None) -> list[torch.Tensor | None]:
        """Per row of a right-padded batch: the cached states of a row it is a prefix of, or None.

        ``precision`` is the last element of the keys it may take rows from (final_hidden's decoder dtype)."""
        found = []
        for row, length in zip(ids.tolist(), lengths, strict=True):
            row, hit = row[:length], None
            for key, i, tokens in self.rows.get(tuple(row[: self.INDEX]), ()):
                entry = self.entries.get(key)
                if entry is None or entry[0]() is not model or key[-1] != precision:
                    continue
                if len(tokens) >= length and tokens[:length] == row:
                    hit = entry[1][i, :length]
                    self.entries[key] = self.entries.pop(key)  # a prefix use counts as a use: it goes last
                    break
            found.append(hit)
        return found

    def put(self, model, key: tuple, hidden: torch.Tensor, ids=None, lengths: list[int] | None = None) -> None:
        """Keep a batch's states; with its ``ids`` and right-padded row ``lengths``, its rows serve prefixes too."""
        size = hidden.numel() * hidden.element_size()
        if size > self.max_bytes:
            return
        self._drop(key)
        while self.entries and self.bytes + size > self.max_bytes:  # dicts keep insertion order: least recent first
            self._drop(next(iter(self.entries)))
        rows = []
        if ids is not None and lengths is not None:
            for i, (row, length) in enumerate(zip(ids.tolist(), lengths, strict=True)):
                tokens = row[:length]
                self.rows.setdefault(tuple(tokens[: self.INDEX]), []).append((key, i, tokens))
                rows.append(tuple(tokens[: self.INDEX]))
        self.entries[key] = (weakref.ref(model), hidden, rows)
        self.bytes += size

    def _drop(self, key: tuple) -> None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        self.bytes -= entry[1].numel() * entry[1].element_size()
        for first in entry[2]:
            kept = [r for r in self.rows.get(first, ()) if r[0] != key]
            if kept:
                self.rows[first] = kept
            else:
                self.rows.pop(first, None)


_LOCAL = threading.local()  # each thread's stack of active caches: a service thread never sees the eval's


def _active() -> list[HiddenCache]:
    if not hasattr(_LOCAL, "stack"):
        _LOCAL.stack = []
    return _LOCAL.stack


def active_cache() -> HiddenCache | None:
    """The cache ``final_hidden`` uses in this thread now (the innermost ``reusing``), or None."""
    active = _active()
    return active[-1] if active else None


def decoder_dtype() -> str | None:
    """The dtype ``final_hidden`` runs the decoder in under autocast in this thread now, or None (the model's)."""
    return getattr(_LOCAL, "dtype", None)


@contextlib.contextmanager
def autocast_decoder(dtype: str | None):
    """Within the block (this thread), ``final_hidden`` runs the decoder under ``torch.autocast`` in ``dtype``
    (bfloat16 or float16; float32 or None: in the model's own dtype) and returns float32 states.

    Only the decoder: whatever multiplies its states (a detector's head statistics) stays in float32. A p-value
    of the permutation test stays exact, since the states are still a fixed function of the text, whatever
    their precision; the scores move by the decoder's rounding (docs/notebook/2026-11-26-bfloat16-in-the-eval.md).
    """
    previous = decoder_dtype()
    _LOCAL.dtype = None if dtype in (None, "float32") else dtype
    try:
        yield
    finally:
        _LOCAL.dtype = previous


@contextlib.contextmanager
def reusing(cache: HiddenCache):
    """Within the block, ``final_hidden`` in this thread looks its batches up in ``cache`` first."""
    _active().append(cache)
    try:
        yield cache
    finally:
        _active().pop()


def window_batches(model, tokenizer, windows: list, batch_size: int):
    """Yield each batch of windows with its final hidden states, fp32 on the CPU (B, T, d)."""
    device, pad = model_device(model), tokenizer.pad_token_id or 0
    for b in range(0, len(windows), batch_size):
        batch = windows[b : b + batch_size]
        width = max(len(w.ids) for w in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, w in enumerate(batch):
            ids[i, : len(w.ids)] = torch.tensor(w.ids)
            mask[i, : len(w.ids)] = 1
        yield batch, final_hidden(model, ids.to(device), mask.to(device)).float().cpu()


def collect_states(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    cfg: StatesConfig,
    progress: bool = True,
) -> States:
    """Run the planned windows through the model and keep the sampled positions.

    Memory is bounded by the preallocated (N, d) output and one batch of activations.
    """
    windows = state_windows(model, tokenizer, documents, cfg, progress)
    n = min(cfg.n_states, len(windows) * cfg.positions_per_window)
    hidden = torch.empty(n, model.config.get_text_config().hidden_size, dtype=torch.float32)
    spans: list[list[int]] = []
    document = torch.empty(n, dtype=torch.long)
    row = 0
    bar = tqdm(total=n, desc="hidden states", unit="state", disable=not progress)
    for batch, h in window_batches(model, tokenizer, windows, cfg.batch_size):
        start_row = row
        for i, w in enumerate(batch):
            take = w.positions[: n - row]
            hidden[row : row + len(take)] = h[i, take]
            document[row : row + len(take)] = w.document
            spans.extend(w.ids[max(0, t + 1 - cfg.context_tokens) : t + 1] for t in take)
            row += len(take)
        bar.update(row - start_row)
        if row >= n:
            break
    bar.close()
    texts = tokenizer.batch_decode(spans, skip_special_tokens=True)
    return States(hidden[:row], texts, document[:row])


def context_deltas(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    cfg: StatesConfig,
    cut: int,
    n_windows: int,
) -> torch.Tensor:
    """Each sampled state on its full window minus the same token's state with the window's first ``cut`` tokens
    (after any BOS) removed: what a detector that sees less context than the generator did reads differently.

    The first ``n_windows`` of the windows ``plan_windows`` plans from the corpus alone (``collect_states``'s when
    ``cfg.generated_windows`` is 0), each run a second time cut; positions that keep at least
    ``cfg.min_context`` tokens after the cut. Returns fp32 (M, d).
    """
    prefix = len(bos_prefix(tokenizer))
    full, short = [], []
    for w in plan_windows(tokenizer, documents, cfg)[:n_windows]:
        kept = [p for p in w.positions if p - cut >= prefix + cfg.min_context]
        if kept:
            full.append(Window(w.document, w.ids, kept))
            short.append(Window(w.document, w.ids[:prefix] + w.ids[prefix + cut :], [p - cut for p in kept]))
    if not full:
        raise ValueError(f"no window is long enough to cut {cut} tokens and keep {cfg.min_context} of context")
    rows = []
    for (batch, h), (cut_batch, h_cut) in zip(
        window_batches(model, tokenizer, full, cfg.batch_size),
        window_batches(model, tokenizer, short, cfg.batch_size),
        strict=True,
    ):
        for i, (w, c) in enumerate(zip(batch, cut_batch, strict=True)):
            rows.append(h[i, w.positions] - h_cut[i, c.positions])
    return torch.cat(rows)


def input_gradients(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    cfg: StatesConfig,
    n_windows: int,
) -> torch.Tensor:
    """Rows g_t of the input side's empirical Fisher F = mean_t g_t g_t^T: the gradient of a window's summed
    next-token loss with respect to each input embedding, over the first ``n_windows`` windows ``plan_windows``
    plans from the corpus alone (``collect_states``'s when ``cfg.generated_windows`` is 0; BOS rows left out).

    A re-tied release moves token x's input embedding by dW[x]; to second order that costs 1/2 dW[x] F dW[x]^T of
    loss, which the head's LLR does not see. Returns fp32 (M, d).
    """
    prefix = len(bos_prefix(tokenizer))
    embed = model.get_input_embeddings()
    device = next(model.parameters()).device
    rows = []
    for w in plan_windows(tokenizer, documents, cfg)[:n_windows]:
        ids = torch.tensor([w.ids], device=device)
        with torch.enable_grad():
            inputs = embed(ids).detach().requires_grad_(True)
            logits = model(inputs_embeds=inputs).logits[0, :-1].float()
            loss = torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum")
            (grad,) = torch.autograd.grad(loss, inputs)
        rows.append(grad[0, prefix:].float().cpu())
    if not rows:
        raise ValueError("no window to take input gradients from; the corpus is too small")
    return torch.cat(rows)
