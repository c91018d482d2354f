"""The decoder's final hidden states: what lm_head multiplies (pure: no cache, no global state).

Detection, the key's states and own perplexity all read them here. Whoever needs more (the lab's
prefix cache, ``openstamp.lab.hidden``) passes a function of the same signature, :data:`HiddenFn`,
where these take a ``hidden=`` argument.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from transformers import PreTrainedModel

HiddenFn = Callable[..., torch.Tensor]  # (model, input_ids, attention_mask, position_ids=None) -> (B, T, d)


@torch.inference_mode()
def final_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    *,
    dtype: str | None = None,
) -> torch.Tensor:
    """The decoder's last hidden state. (B, T) -> (B, T, d).

    Pass ``position_ids`` for left-padded batches. ``dtype`` (bfloat16 or float16) runs the decoder
    under ``torch.autocast`` and returns float32 states; None or float32, in the model's own dtype.
    """
    dtype = None if dtype in (None, "float32") else dtype
    with torch.autocast(input_ids.device.type, dtype=getattr(torch, dtype or "float32"), enabled=dtype is not None):
        out = model.get_decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
    return out if dtype is None else out.float()
