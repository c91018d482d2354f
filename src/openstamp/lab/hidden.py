"""The lab's hidden states: a prefix cache and a decoder precision, set per thread around ``lab_hidden``.

An evaluation scores the same texts with many detectors of one model; :class:`HiddenCache` runs the
decoder once for them. The product never sees this module: the lab hands :func:`lab_hidden` to the
product's ``hidden=`` parameters (``openstamp.lab.detector.LabDetector``, ``window_nll``).
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import torch
from transformers import PreTrainedModel

from openstamp.model.hidden import final_hidden


@torch.inference_mode()
def lab_hidden(
    model: PreTrainedModel,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """``openstamp.model.hidden.final_hidden`` with this thread's lab settings: the innermost ``reusing``
    cache is looked up first, and the decoder runs in ``autocast_decoder``'s dtype. (B, T) -> (B, T, d).

    The lab passes it where the product takes a ``hidden=`` function (``LabDetector``, ``window_nll``).
    """
    cache = active_cache()
    if cache is None:
        return _decoder(model, input_ids, attention_mask, position_ids)
    key = (*cache.key(input_ids, attention_mask, position_ids), decoder_dtype())  # states of one precision only
    if (hit := cache.get(model, key)) is not None:
        return hit
    lengths = padded_row_lengths(attention_mask, position_ids)
    found = cache.prefixes(model, input_ids, lengths, decoder_dtype()) if lengths is not None else []
    reused = [row for row in found if row is not None]
    if not reused:
        cache.misses += 1
        out = _decoder(model, input_ids, attention_mask, position_ids)
        cache.put(model, key, out, input_ids, lengths)
        return out
    # rows that start a cached row take its states; the others (cut where a cached row was not) run alone
    out = reused[0].new_zeros((*input_ids.shape, reused[0].shape[-1]))
    for i, row in enumerate(found):
        if row is not None:
            out[i, : len(row)] = row
    missing = [i for i, row in enumerate(found) if row is None and lengths[i] > 0]
    if not missing:
        cache.prefix_hits += 1
        return out
    cache.misses += 1
    width = max(lengths[i] for i in missing)
    ids, mask = input_ids[missing, :width], attention_mask[missing, :width]
    rest = _decoder(model, ids, mask, None)
    cache.put(model, (*cache.key(ids, mask, None), decoder_dtype()), rest, ids, [lengths[i] for i in missing])
    for j, i in enumerate(missing):
        out[i, : lengths[i]] = rest[j, : lengths[i]]
    return out


def _decoder(model, input_ids, attention_mask, position_ids) -> torch.Tensor:
    return final_hidden(model, input_ids, attention_mask, position_ids, dtype=decoder_dtype())


def padded_row_lengths(mask: torch.Tensor, position_ids: torch.Tensor | None) -> list[int] | None:
    """Each row's length when every row is right-padded and counts positions from 0; None otherwise (left padding)."""
    lengths = mask.sum(-1)
    columns = torch.arange(mask.shape[-1], device=mask.device).expand_as(mask)
    if not torch.equal(mask, (columns < lengths[:, None]).to(mask.dtype)):
        return None
    if position_ids is not None and not torch.equal(position_ids * mask, columns * mask):
        return None
    return lengths.tolist()


class HiddenCache:
    """Final hidden states already computed, by model and batch (``lab_hidden`` inside ``reusing``).

    Scoring the same texts with several detectors of one model (an eval's human continuations, once
    per method and strength) then runs the decoder once. An entry is used only for the very model
    object that made it (a weak reference), and only while the caller keeps that model's decoder
    unchanged: weight-level methods apply their watermark outside ``reusing`` and revert it exactly,
    unless the watermark leaves the decoder alone (``WatermarkMethod.keeps_hidden``). States computed under
    ``autocast_decoder`` serve only calls in the same dtype (the dtype ends each key).

    A causal decoder's state at a position depends on the tokens up to it alone, so a right-padded
    row that starts a cached row's tokens takes that row's first states (the same numbers, up to
    float rounding in kernels of another shape): the texts of a length curve, each cut from a text
    scored before, run no decoder. Bounded by ``max_bytes``: the least recently used entries go first.
    """

    INDEX = 4  # a cached row is found by its first INDEX tokens (a row shorter than that, only by an equal one)

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes, self.entries, self.bytes = max_bytes, {}, 0
        self.hits, self.prefix_hits, self.misses = 0, 0, 0
        self.rows: dict[tuple, list[tuple]] = {}  # first tokens -> [(entry key, row, token ids)]

    @staticmethod
    def key(*tensors: torch.Tensor | None) -> tuple:
        return tuple(None if t is None else (tuple(t.shape), t.cpu().numpy().tobytes()) for t in tensors)

    def get(self, model, key: tuple) -> torch.Tensor | None:
        entry = self.entries.get(key)
        if entry is None or entry[0]() is not model:
            return None
        self.hits += 1
        self.entries[key] = self.entries.pop(key)  # the most recently used goes last
        return entry[1]

    def prefixes(self, model, ids: torch.Tensor, lengths: list[int], precision=None) -> list[torch.Tensor | None]:
        """Per row of a right-padded batch: the cached states of a row it is a prefix of, or None.

        ``precision`` is the last element of the keys it may take rows from (final_hidden's decoder dtype)."""
        found = []
        for row, length in zip(ids.tolist(), lengths, strict=True):
            row, hit = row[:length], None
            for key, i, tokens in self.rows.get(tuple(row[: self.INDEX]), ()):
                entry = self.entries.get(key)
                if entry is None or entry[0]() is not model or key[-1] != precision:
                    continue
                if len(tokens) >= length and tokens[:length] == row:
                    hit = entry[1][i, :length]
                    self.entries[key] = self.entries.pop(key)  # a prefix use counts as a use: it goes last
                    break
            found.append(hit)
        return found

    def put(self, model, key: tuple, hidden: torch.Tensor, ids=None, lengths: list[int] | None = None) -> None:
        """Keep a batch's states; with its ``ids`` and right-padded row ``lengths``, its rows serve prefixes too."""
        size = hidden.numel() * hidden.element_size()
        if size > self.max_bytes:
            return
        self._drop(key)
        while self.entries and self.bytes + size > self.max_bytes:  # dicts keep insertion order: least recent first
            self._drop(next(iter(self.entries)))
        rows = []
        if ids is not None and lengths is not None:
            for i, (row, length) in enumerate(zip(ids.tolist(), lengths, strict=True)):
                tokens = row[:length]
                self.rows.setdefault(tuple(tokens[: self.INDEX]), []).append((key, i, tokens))
                rows.append(tuple(tokens[: self.INDEX]))
        self.entries[key] = (weakref.ref(model), hidden, rows)
        self.bytes += size

    def _drop(self, key: tuple) -> None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        self.bytes -= entry[1].numel() * entry[1].element_size()
        for first in entry[2]:
            kept = [r for r in self.rows.get(first, ()) if r[0] != key]
            if kept:
                self.rows[first] = kept
            else:
                self.rows.pop(first, None)


_LOCAL = threading.local()  # each thread's stack of active caches: a service thread never sees the eval's


def _active() -> list[HiddenCache]:
    if not hasattr(_LOCAL, "stack"):
        _LOCAL.stack = []
    return _LOCAL.stack


def active_cache() -> HiddenCache | None:
    """The cache ``lab_hidden`` uses in this thread now (the innermost ``reusing``), or None."""
    active = _active()
    return active[-1] if active else None


def decoder_dtype() -> str | None:
    """The dtype ``lab_hidden`` runs the decoder in under autocast in this thread now, or None (the model's)."""
    return getattr(_LOCAL, "dtype", None)


@contextlib.contextmanager
def autocast_decoder(dtype: str | None):
    """Within the block (this thread), ``lab_hidden`` runs the decoder under ``torch.autocast`` in ``dtype``
    (bfloat16 or float16; float32 or None: in the model's own dtype) and returns float32 states.

    Only the decoder: whatever multiplies its states (a detector's head statistics) stays in float32. A p-value
    of the permutation test stays exact, since the states are still a fixed function of the text, whatever
    their precision; the scores move by the decoder's rounding (docs/notebook/2026-11-26-bfloat16-in-the-eval.md).
    """
    previous = decoder_dtype()
    _LOCAL.dtype = None if dtype in (None, "float32") else dtype
    try:
        yield
    finally:
        _LOCAL.dtype = previous


@contextlib.contextmanager
def reusing(cache: HiddenCache):
    """Within the block, ``lab_hidden`` in this thread looks its batches up in ``cache`` first."""
    _active().append(cache)
    try:
        yield cache
    finally:
        _active().pop()
