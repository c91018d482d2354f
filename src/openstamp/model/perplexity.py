"""A model's own perplexity on human text: what a watermark costs the model it is put in.

For a window of prompt tokens x_<s and human continuation x_s..x_T-1 (one tokenizer, the model's):

    NLL(window) = -1/(T - s) sum_{t=s}^{T-1} log softmax(f(x_<t, z_t))[x_t]

where z_t are the logits at position t-1 and f is the identity for a weight-level watermark
(the patched model's own logits) or the decode-time method's logits processor, applied exactly
as at generation: f(x_<t, z_t) = processor(x_<t, z_t). The reported perplexity is
exp(mean NLL over windows); with windows of one length that is exp(NLL per token). The change
against the original model is own_ppl / own_ppl(original) - 1, with a paired percentile
bootstrap over windows.

The eval passes ``hidden=openstamp.lab.hidden.lab_hidden``, which runs the decoder in ``EvalConfig.own_ppl_dtype``
(bfloat16 where the processor computes it natively); the head, the processor, the softmax and the NLL stay
float32. Both sides of the change run alike, so the decoder's rounding largely cancels in it
(how far it moves, and the speed: docs/notebook/2026-11-26-bfloat16-in-the-eval.md).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import LogitsProcessor, PreTrainedModel

from openstamp.model.hidden import HiddenFn, final_hidden
from openstamp.model.load import model_device
from openstamp.model.patch import head


@torch.inference_mode()
def window_nll(
    model: PreTrainedModel,
    windows: list[tuple[list[int], list[int]]],
    processor: LogitsProcessor | None = None,
    batch_size: int = 8,
    progress: bool = False,
    chunk_logits: int = 2**25,
    hidden: HiddenFn = final_hidden,
) -> list[float]:
    """Mean NLL of each window's continuation given its prompt, in nats (nan when it is empty).

    Args:
        windows: (prompt ids, continuation ids) pairs; the prompt should start with BOS where
            the model expects one.
        chunk_logits: the most logits held at once (batch x positions x vocabulary): lm_head runs on
            that many positions of a batch in one matrix product, not one position at a time (which
            reads the whole head once per position), and ``processor`` then sees them position by position.
        hidden: what computes the decoder's states (the lab passes its cached, autocast ``lab_hidden``).
    """
    device, lm_head = model_device(model), head(model)
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    out = [math.nan] * len(windows)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, (prompt, cont) in enumerate(windows):
        if cont:
            groups.setdefault((max(len(prompt), 1), len(prompt) + len(cont)), []).append(i)
    batches = [(k, idx[b : b + batch_size]) for k, idx in groups.items() for b in range(0, len(idx), batch_size)]
    for (start, length), batch in tqdm(batches, desc="own perplexity", disable=not progress):
        ids = torch.tensor([windows[i][0] + windows[i][1] for i in batch], device=device)
        states = hidden(model, ids, torch.ones_like(ids))
        total = torch.zeros(len(batch), dtype=torch.float64, device=device)
        step = max(1, chunk_logits // (len(batch) * weight.shape[0]))
        for first in range(start, length, step):
            last = min(first + step, length)  # positions first..last-1 are scored, from the states before them
            logits = F.linear(states[:, first - 1 : last - 1].to(weight.dtype), weight, bias).float()
            if processor is not None:
                for t in range(first, last):
                    logits[:, t - first] = processor(ids[:, :t], logits[:, t - first].contiguous())
            logp = torch.log_softmax(logits, -1).gather(-1, ids[:, first:last, None]).squeeze(-1)
            total -= logp.double().sum(1)
        for j, i in enumerate(batch):
            out[i] = float(total[j]) / (length - start)
    return out


def perplexity(nll: list[float]) -> float:
    """exp(mean NLL) over the windows that have one."""
    values = np.array(nll, dtype=np.float64)
    values = values[np.isfinite(values)]
    return float(np.exp(values.mean())) if len(values) else float("nan")


def change(nll: list[float], reference: list[float], n_boot: int = 2000, seed: int = 0) -> dict:
    """own PPL / reference own PPL - 1, with a paired 95% bootstrap interval over windows."""
    a, b = np.array(nll, dtype=np.float64), np.array(reference, dtype=np.float64)
    keep = np.isfinite(a) & np.isfinite(b)
    a, b = a[keep], b[keep]
    if len(a) == 0:
        return {"change": float("nan"), "ci": (float("nan"), float("nan"))}
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(a), (n_boot, len(a)))
    boot = np.exp(a[draws].mean(1) - b[draws].mean(1)) - 1
    low, high = np.quantile(boot, [0.025, 0.975])
    return {"change": float(np.exp(a.mean() - b.mean()) - 1), "ci": (float(low), float(high))}
