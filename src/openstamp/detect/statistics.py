"""Step 3 of detection: the per-token statistics of a batch's scored tokens, and the tail bound's p-value.

Pure glue over ``llr.py`` (the formulas are there) and ``tail.py``: the head (U~ or U, with its bias) and
the key give each token's LLR, its centred parts for the permutation test, and its green-list membership.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from openstamp.config import DetectConfig
from openstamp.detect.forward import Forward
from openstamp.detect.llr import TokenStats, token_stats
from openstamp.detect.tail import chernoff_pvalue, tail_terms
from openstamp.key.key import WatermarkKey


@dataclass(frozen=True)
class Head:
    """The head a detector scores with: U~ (``is_watermarked``) or the original U, and the key."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    key: WatermarkKey
    is_watermarked: bool


def batch_statistics(head: Head, fwd: Forward, config: DetectConfig, rows: torch.Tensor | None = None) -> TokenStats:
    """Token statistics of every scored token of a forward pass (or of its ``rows``), on the CPU."""
    hidden, targets = (fwd.hidden, fwd.targets) if rows is None else (fwd.hidden[rows], fwd.targets[rows])
    stats = token_stats(
        hidden,
        targets,
        head.weight,
        head.key,
        bias=head.bias,
        head_is_watermarked=head.is_watermarked,
        with_null=config.p_values,
        chunk=config.chunk_tokens,
        block=config.vocab_block,
        top_k=config.centring_top_k,
    )
    return to_cpu(stats)


def tail_pvalue(head: Head, stats: TokenStats, fwd: Forward, span: slice, config: DetectConfig) -> float | None:
    """The Chernoff bound over random keys on one text's centred LLR (``tail.py``); one pass over the vocabulary."""
    terms = tail_terms(
        fwd.hidden[span],
        fwd.targets[span],
        head.weight,
        head.key,
        stats.selector[span],
        stats.lse_orig[span],
        float(stats.centred[span].double().sum()),
        bias=head.bias,
        head_is_watermarked=head.is_watermarked,
        block=config.vocab_block,
    )
    return chernoff_pvalue(terms, head.key.delta, head.key.gamma)


def to_cpu(stats: TokenStats) -> TokenStats:
    return TokenStats(**{k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in stats.__dict__.items()})
