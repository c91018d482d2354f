"""Batched sampling from any causal LM (the watermark lives in the weights, so no hooks).

Sampling draws each token by inverse transform: one uniform number per row against the cumulative
distribution, instead of ``torch.multinomial``, whose CPU kernel draws an exponential variable for every
token of the vocabulary (94 ms of every 0.6 s step at batch 100 x 49,152 tokens, against 2.5 ms here). It is
a logits processor that runs last, after any watermark's, and leaves one token standing for ``generate``'s
greedy pick: the distribution is the one ``do_sample`` would draw from (temperature, then top-p).
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm
from transformers import (
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopPLogitsWarper,
)

from openstamp.model.load import model_device
from openstamp.model.text import bos_prefix


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
    if temperature > 0:  # drawn by InverseCDFSampler, the last processor; generate then picks its one token
        logits_processor = LogitsProcessorList([*(logits_processor or []), InverseCDFSampler(temperature, top_p)])
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
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            pad_token_id=pad,
            logits_processor=logits_processor,
            do_sample=False,
        )
        outputs.extend(out[:, width:].tolist())
    return outputs


class InverseCDFSampler(LogitsProcessor):
    """Draw the next token of each row from softmax(scores / temperature), nucleus-filtered at ``top_p``.

    The scores that come back are 0 at the drawn token and -inf elsewhere, so a greedy pick takes it. The
    token is the first whose cumulative probability exceeds u * total, u uniform in [0, 1) from torch's
    global generator: a token of probability 0 is never drawn, and each token's chance is its probability
    up to float32 rounding of the running sum (at most about 6e-8).
    """

    def __init__(self, temperature: float = 1.0, top_p: float = 1.0) -> None:
        if not temperature > 0:
            raise ValueError("InverseCDFSampler needs temperature > 0 (temperature 0 is greedy decoding)")
        self.warpers = LogitsProcessorList(
            [TemperatureLogitsWarper(temperature)] + ([TopPLogitsWarper(top_p)] if top_p < 1.0 else [])
        )

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        probs = torch.softmax(self.warpers(input_ids, scores).float(), dim=-1)
        cumulative = probs.cumsum(-1)
        total = cumulative[:, -1:]
        u = torch.rand(total.shape, device=scores.device) * total
        u = torch.minimum(u, torch.nextafter(total, torch.zeros_like(total)))  # rounding must not reach the end
        drawn = torch.searchsorted(cumulative, u, right=True)
        out = torch.full_like(scores, -float("inf"))
        return out.scatter_(1, drawn, 0.0)
