"""Perplexity of completions given their prompts, under an oracle model with its own tokenizer.

The eval keeps one file per completion set (``save_perplexities``), recording the oracle and the dtype it ran in:
bfloat16 gives per-text perplexities within 1.5% of float32's at about twice the speed on a CPU with AVX512-BF16
(docs/notebook/2026-11-26-bfloat16-in-the-eval.md), so a set is scored again when the dtype asked for
changes.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.detect.llr import target_logprobs
from openstamp.lab.hidden import lab_hidden
from openstamp.model.load import model_device
from openstamp.model.patch import head
from openstamp.model.text import bos_prefix
from openstamp.storage import atomic_write_json, read_json


def save_perplexities(path: Path, values: list[float], oracle: str, dtype: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, {"oracle": oracle, "dtype": dtype, "values": values})


def load_perplexities(path: Path, legacy_dtype: str) -> dict:
    """{"oracle", "dtype", "values"}; a file from before the dtype was recorded (a bare list) ran in the eval's
    model dtype (``legacy_dtype``)."""
    data = read_json(path, "perplexity cache")
    return {"oracle": None, "dtype": legacy_dtype, "values": data} if isinstance(data, list) else data


@torch.inference_mode()
def perplexities(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    completions: list[str],
    batch_size: int = 8,
    progress: bool = False,
) -> list[float]:
    """exp(mean NLL of the completion's tokens given the prompt), one per pair.

    The oracle tokenises prompt and completion itself (prompt tokens condition, completion
    tokens are scored). Returns nan for an empty completion.
    """
    bos = bos_prefix(tokenizer)
    pairs = []
    for p, c in zip(prompts, completions, strict=True):
        prompt_ids = bos + tokenizer(p, add_special_tokens=False).input_ids
        pairs.append((prompt_ids, tokenizer(c, add_special_tokens=False).input_ids))
    device, weight = model_device(model), head(model).weight
    bias = getattr(head(model), "bias", None)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    out = [math.nan] * len(pairs)
    order = sorted(range(len(pairs)), key=lambda i: -(len(pairs[i][0]) + len(pairs[i][1])))
    for b in tqdm(range(0, len(order), batch_size), desc="oracle perplexity", disable=not progress):
        batch = [i for i in order[b : b + batch_size] if pairs[i][1]]
        if not batch:
            continue
        seqs = [pairs[i][0] + pairs[i][1] for i in batch]
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for j, s in enumerate(seqs):
            ids[j, : len(s)], mask[j, : len(s)] = torch.tensor(s), 1
        hidden = lab_hidden(model, ids.to(device), mask.to(device))
        rows, cols, targets, spans = [], [], [], []
        for j, i in enumerate(batch):
            start = max(len(pairs[i][0]), 1)
            idx = torch.arange(start, len(seqs[j]))
            spans.append((len(targets), len(targets) + len(idx)))
            rows += [j] * len(idx)
            cols += (idx - 1).tolist()
            targets += seqs[j][start:]
        logp = target_logprobs(hidden[rows, cols], torch.tensor(targets, device=device), weight, bias)
        for (a, z), i in zip(spans, batch, strict=True):
            out[i] = math.exp(-float(logp[a:z].mean()))
    return out
