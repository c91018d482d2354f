"""Per-token statistics a detector computed, kept by token sequence, for texts cut from texts it scored.

A causal model's statistics of a token depend on the tokens before it alone, so a text whose token sequence
starts a scored one (same context, the length curve's cut texts) has the first rows of that text's statistics.
The detector keeps them only while a hidden-state cache is active (``openstamp.lab.hidden.reusing``), under the same
contract: the model is left as it is while the cache lives. A new active cache starts an empty memo.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

from openstamp.detect.llr import TokenStats, stats_rows


class StatsMemo:
    """Token statistics by sequence (context + text ids), least recently used dropped beyond ``max_tokens`` rows
    (a row holds 2 L + 6 numbers: 150,000 rows of a key with L 253 take about 310 MB; an eval's three sets of 200
    texts of 200 tokens are 120,000)."""

    INDEX = 4  # a kept sequence is found by its first INDEX tokens

    def __init__(self, max_tokens: int = 150_000) -> None:
        self.max_tokens, self.tokens, self.hits = max_tokens, 0, 0
        self.kept: OrderedDict[tuple[int, ...], tuple[int, TokenStats]] = OrderedDict()  # seq -> (first, stats)
        self.index: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        self.owner: tuple[weakref.ref, str | None] | None = None  # the hidden-state cache and decoder dtype of its rows

    def bind(self, cache, precision: str | None = None) -> bool:
        """Use the memo under ``cache`` (None: no cache is active, keep nothing) with the decoder in ``precision``
        (``openstamp.lab.hidden.decoder_dtype``); a new cache or another precision empties it."""
        if cache is None:
            return False
        if self.owner is None or self.owner[0]() is not cache or self.owner[1] != precision:
            self.kept.clear()
            self.index.clear()
            self.tokens, self.owner = 0, (weakref.ref(cache), precision)
        return True

    def find(self, seq: list[int], first: int) -> TokenStats | None:
        """The statistics of ``seq``'s tokens from ``first`` on, where a kept sequence starts with ``seq``."""
        want = tuple(seq)
        for full in self.index.get(want[: self.INDEX], ()):
            start, stats = self.kept[full]
            if start == first and len(full) >= len(want) and full[: len(want)] == want:
                self.kept.move_to_end(full)
                self.hits += 1
                return stats_rows(stats, 0, len(want) - first)
        return None

    def keep(self, seq: list[int], first: int, stats: TokenStats) -> None:
        full = tuple(seq)
        if full in self.kept or len(stats.llr) > self.max_tokens:
            return
        while self.kept and self.tokens + len(stats.llr) > self.max_tokens:
            self._drop(next(iter(self.kept)))
        stats = TokenStats(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in stats.__dict__.items()})
        self.kept[full] = (first, stats)  # a copy: a view would keep its whole batch alive
        self.index.setdefault(full[: self.INDEX], []).append(full)
        self.tokens += len(stats.llr)

    def _drop(self, full: tuple[int, ...]) -> None:
        _, stats = self.kept.pop(full)
        self.tokens -= len(stats.llr)
        rest = [s for s in self.index[full[: self.INDEX]] if s != full]
        if rest:
            self.index[full[: self.INDEX]] = rest
        else:
            del self.index[full[: self.INDEX]]
