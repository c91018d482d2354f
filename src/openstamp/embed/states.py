"""Final hidden states (the input of lm_head) at sampled token positions, with prefix texts.

Each document is cut into windows; one forward pass per window gives the hidden state
of every prefix in it, of which a fixed number of positions is sampled.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.config import StatesConfig
from openstamp.corpus import Document
from openstamp.model.generate import sample_completions
from openstamp.model.hidden import final_hidden
from openstamp.model.load import model_device
from openstamp.model.text import bos_prefix, encode

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
        return States(self.hidden[index], self.texts_at(index), self.document[index])

    def texts_at(self, index: torch.Tensor) -> list[str]:
        """The prefix texts of the states in ``index`` (as ``StateShards.texts_at``)."""
        return [self.texts[i] for i in index.tolist()]

    def load(self, index: torch.Tensor) -> torch.Tensor:
        """The hidden states of ``index`` (as ``StateShards.load``)."""
        return self.hidden[index]


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
