"""Batched sampling from any causal LM (the watermark lives in the weights, so no hooks)."""

from __future__ import annotations

import torch
from tqdm.auto import tqdm
from transformers import LogitsProcessor, LogitsProcessorList, PreTrainedModel, PreTrainedTokenizerBase

from openstamp.models import model_device
from openstamp.text import bos_prefix


@torch.inference_mode()
def sample_completions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[list[int]],
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    batch_size: int = 32,
    logits_processor=None,
    progress: bool = True,
) -> list[list[int]]:
    """Sample exactly ``max_new_tokens`` new tokens after each prompt (EOS is suppressed).

    Prompts are token ids without BOS (it is added here when the tokenizer uses one).
    Batch ``b`` is seeded with ``seed + b``, so results do not depend on earlier batches.
    ``temperature=0`` decodes greedily.
    """
    if isinstance(logits_processor, LogitsProcessor):
        logits_processor = LogitsProcessorList([logits_processor])
    device = model_device(model)
    prefix = bos_prefix(tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    outputs: list[list[int]] = []
    starts = range(0, len(prompts), batch_size)
    for b, start in enumerate(tqdm(starts, desc="generating", unit="batch", disable=not progress)):
        batch = [prefix + p for p in prompts[start : start + batch_size]]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, p in enumerate(batch):  # left padding
            ids[i, width - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, width - len(p) :] = 1
        torch.manual_seed(seed + b)
        sampling = (
            {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
            if temperature > 0
            else {"do_sample": False}
        )
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            pad_token_id=pad,
            logits_processor=logits_processor,
            **sampling,
        )
        outputs.extend(out[:, width:].tolist())
    return outputs
