"""The product's ``Detector`` with the lab's shortcuts, attached from outside: a subclass that lives here.

- Its decoder states come from ``lab_hidden`` (the eval's prefix cache and decoder precision).
- Its per-token statistics are kept in a ``StatsMemo`` while a hidden-state cache is active: a text cut from
  one scored before (the length curve) takes that text's first rows, and only the others go through the
  vocabulary. Chat items (masked) are never memoised.
- Within ``p_values_down_to(level)`` it skips the tail bound where the permutation test's floor 1/(K+1) is
  at or below ``level``: the bound changes only p-values at that floor, and every p <= ``level`` decision is
  the same without it. The results' ``test`` then names the permutation test alone.
"""

from __future__ import annotations

import contextlib
import threading

import torch

from openstamp.detect.detector import Detector
from openstamp.detect.forward import Forward
from openstamp.detect.items import Item
from openstamp.detect.llr import TokenStats, join_stats, stats_rows
from openstamp.detect.result import DetectionResult
from openstamp.detect.statistics import batch_statistics
from openstamp.lab.evaluation.memo import StatsMemo
from openstamp.lab.hidden import active_cache, decoder_dtype, lab_hidden

_NEEDED = threading.local()  # the smallest p-value level this thread's callers decide at (p_values_down_to)


@contextlib.contextmanager
def p_values_down_to(level: float):
    """Within the block (this thread), a ``LabDetector``'s p-values are needed only to decide p <= ``level``."""
    previous = needed_level()
    _NEEDED.level = level
    try:
        yield
    finally:
        _NEEDED.level = previous


def needed_level() -> float:
    """The level set by the innermost ``p_values_down_to`` in this thread (0: every p-value is wanted)."""
    return getattr(_NEEDED, "level", 0.0)


class LabDetector(Detector):
    """``Detector`` with ``hidden=lab_hidden``, a statistics memo and ``p_values_down_to``; same results."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("hidden", lab_hidden)
        super().__init__(*args, **kwargs)
        self.memo = StatsMemo()

    def wants_tail(self, result: DetectionResult) -> bool:
        return 1.0 / (self.config.n_permutations + 1) > needed_level()

    def statistics(self, items: list[Item], fwd: Forward) -> TokenStats:
        memo = self.memo if self.memo.bind(active_cache(), decoder_dtype()) else None
        if memo is None:
            return super().statistics(items, fwd)
        seqs, firsts = [it.context + it.text for it in items], [it.first for it in items]
        found = [
            None if it.mask is not None else memo.find(seq, first)
            for it, seq, first in zip(items, seqs, firsts, strict=True)
        ]
        missing = [j for j, f in enumerate(found) if f is None]
        if not missing:
            return join_stats(found)
        spans = fwd.spans
        every = len(missing) == len(seqs)
        rows = None if every else torch.cat([torch.arange(spans[j].start, spans[j].stop) for j in missing])
        computed = batch_statistics(self.head, fwd, self.config, None if rows is None else rows.to(self.device))
        start = 0
        for j in missing:
            found[j] = stats_rows(computed, start, start + spans[j].stop - spans[j].start)
            start += spans[j].stop - spans[j].start
            if items[j].mask is None:
                memo.keep(seqs[j], firsts[j], found[j])
        return computed if every else join_stats(found)
