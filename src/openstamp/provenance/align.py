"""Pair the base's vocabulary rows with the suspect's: by token string, or by index where a side has no vocabulary.

A derivative may extend its tokenizer (new rows appended, or special tokens added), reorder it, or trim
padding rows. Row i of the base and row j of the suspect are compared when they hold the same token string
(the first id of a string that a vocabulary repeats). Rows beyond a tokenizer (padding rows, never green) have
no string and are left out; so are tokens only one side has. When either side has no vocabulary (a bare
.safetensors file) rows pair by index, over the first min(V_base, V_suspect) rows, with a warning.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

LOW_OVERLAP = 0.9  # warn when fewer than this fraction of the base's vocabulary aligns


@dataclass
class Alignment:
    """base_rows[i] of the base and suspect_rows[i] of the suspect hold the same token; both long (n,)."""

    base_rows: torch.Tensor
    suspect_rows: torch.Tensor
    how: str  # identical, by-string or by-index
    warnings: list[str] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return len(self.base_rows)


def align(
    base_tokens: list[str] | None, base_rows: int, suspect_tokens: list[str] | None, suspect_rows: int
) -> Alignment:
    """Align two vocabularies. ``*_tokens``: the string of each id (or None); ``*_rows``: rows of each matrix."""
    if base_tokens is None or suspect_tokens is None:
        n = min(base_rows, suspect_rows)
        which = "the suspect" if suspect_tokens is None else "the base"
        warning = f"{which} has no vocabulary: rows are paired by index ({n} rows)"
        if base_rows != suspect_rows:
            warning += f"; the matrices differ in size ({base_rows} and {suspect_rows} rows), so pairs may be wrong"
        index = torch.arange(n)
        return Alignment(index, index.clone(), "by-index", [warning])
    base_tokens, suspect_tokens = base_tokens[:base_rows], suspect_tokens[:suspect_rows]
    if base_tokens == suspect_tokens:
        index = torch.arange(len(base_tokens))
        return Alignment(index, index.clone(), "identical")
    position: dict[str, int] = {}
    for j, token in enumerate(suspect_tokens):
        position.setdefault(token, j)
    seen: set[str] = set()
    pairs = []
    for i, token in enumerate(base_tokens):
        if token in position and token not in seen:
            seen.add(token)
            pairs.append((i, position[token]))
    if not pairs:
        raise ValueError("the suspect and the base share no vocabulary: no token string is in both")
    base_index, suspect_index = torch.tensor(pairs, dtype=torch.long).T
    warnings = []
    if len(pairs) < LOW_OVERLAP * len(base_tokens):
        warnings.append(
            f"only {len(pairs)} of the base's {len(base_tokens)} tokens are in the suspect's vocabulary: "
            "the test sees that part of the offset only"
        )
    return Alignment(base_index, suspect_index, "by-string", warnings)
