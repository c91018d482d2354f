"""How close two same-shaped matrices are, in one pass over row blocks (pure tensor code).

The release audit uses it to find near copies of the unembedding, and model loading to find a
head and input embeddings that are one matrix quantized twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Similarity:
    """How close two same-shaped matrices A and B are."""

    cosine: float  # of the mean-centred matrices (each minus its mean row), flattened
    relative_difference: float  # ||A - B|| / ||B||, Frobenius

    def describe(self) -> str:
        return f"cosine {self.cosine:.3f}, relative difference {self.relative_difference:.3f}"


def similarity(a: Iterator[torch.Tensor], b: Iterator[torch.Tensor]) -> Similarity:
    """:class:`Similarity` of two (V, d) matrices given as matching row blocks, in one pass.

    Each block is cast to float32 and summed into float64 totals (column sums, <A, B>, ||A||^2,
    ||B||^2, ||A - B||^2), so memory is a few blocks whatever V; the centred cosine follows from
    the totals: sum_ij (A - mean A)(B - mean B) = <A, B> - V <mean A, mean B>.
    """
    n, sums = 0, torch.zeros(4, dtype=torch.float64)
    col_a = col_b = None
    for x, y in zip(a, b, strict=True):
        x, y = x.float(), y.float()
        n += len(x)
        col_a = x.sum(0, dtype=torch.float64) + (0 if col_a is None else col_a)
        col_b = y.sum(0, dtype=torch.float64) + (0 if col_b is None else col_b)
        products = (x * y, x * x, y * y, (x - y) ** 2)
        sums += torch.stack([p.sum(dtype=torch.float64) for p in products])
    if col_a is None:
        return Similarity(cosine=0.0, relative_difference=0.0)
    ab = sums[0] - col_a @ col_b / n
    aa, bb = sums[1] - col_a @ col_a / n, sums[2] - col_b @ col_b / n
    cosine = float(ab / (aa * bb).sqrt()) if aa > 0 and bb > 0 else 0.0
    relative = float(sums[3].sqrt() / sums[2].sqrt()) if sums[2] > 0 else float(sums[3] > 0)
    return Similarity(cosine=cosine, relative_difference=relative)
