"""Step 2 of detection: one backbone pass for a batch of items, keeping the states before each scored token.

Every key that shares the model can score the same :class:`Forward` (``MultiKeyDetector`` runs it once).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from openstamp.detect.items import Item
from openstamp.model.hidden import HiddenFn, final_hidden


@dataclass
class Forward:
    """spans[i]: item i's rows; hidden (N, d): the state before each scored token; targets (N,): the tokens."""

    spans: list[slice]
    hidden: torch.Tensor
    targets: torch.Tensor


@torch.inference_mode()
def forward(
    model: PreTrainedModel,
    items: list[Item],
    *,
    pad_id: int,
    padding_side: str = "right",
    device: torch.device | str = "cpu",
    hidden: HiddenFn = final_hidden,
) -> Forward:
    """Pad the items into one batch (``padding_side``), run ``hidden`` once, keep the scored positions' states."""
    seqs = [it.context + it.text for it in items]
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    starts = []
    for i, seq in enumerate(seqs):
        start = 0 if padding_side == "right" else width - len(seq)
        ids[i, start : start + len(seq)] = torch.tensor(seq)
        mask[i, start : start + len(seq)] = 1
        starts.append(start)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    states = hidden(model, ids.to(device), mask.to(device), positions.to(device))
    rows, cols, targets, spans = [], [], [], []
    for i, (it, start) in enumerate(zip(items, starts, strict=True)):
        idx = torch.arange(start + it.first, start + len(seqs[i]))[torch.tensor(it.scored(), dtype=torch.bool)]
        spans.append(slice(len(targets), len(targets) + len(idx)))
        rows.append(torch.full_like(idx, i))
        cols.append(idx - 1)  # the hidden state before a token predicts it
        targets.extend(it.targets())
    h = states[torch.cat(rows).to(device), torch.cat(cols).to(device)]
    return Forward(spans, h, torch.tensor(targets, device=device))
