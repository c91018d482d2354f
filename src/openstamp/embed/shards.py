"""Hidden states on disk, for keys of large models: written in shards, read back a chunk at a time.

``collect_states`` keeps every sampled state in one (N, d) tensor: 24 GB for the paper's 1.5M
states of a 4096-wide model. Here each forward batch's states go to a safetensors shard as
soon as they are computed, and ``openstamp.embed.selector`` fits the selector in passes over
them. ``StateShards`` answers the same questions as the in-memory ``States`` (``len``,
``document``, ``texts_at``, ``load``), so the key's recipe reads either alike.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from openstamp.config import StatesConfig
from openstamp.embed.states import state_windows, window_batches

CHUNK = 8192  # states per streamed chunk


@dataclass
class StateShards:
    """States written as ``states-NNNNN.safetensors`` (hidden (n, d) fp32, document (n,)) plus texts."""

    directory: Path
    counts: list[int]
    hidden_size: int

    def __len__(self) -> int:
        return sum(self.counts)

    def path(self, i: int) -> Path:
        return self.directory / f"states-{i:05d}.safetensors"

    @functools.cached_property
    def document(self) -> torch.Tensor:
        """(N,) document index of every state (8 bytes a state), as ``States.document``."""
        return torch.cat([load_file(self.path(i))["document"] for i in range(len(self.counts))])

    def texts_at(self, index: torch.Tensor) -> list[str]:
        """The prefix texts of the states in ``index``, in that order."""
        wanted = set(index.tolist())
        out = {}
        with (self.directory / "texts.jsonl").open(encoding="utf-8") as fh:
            for row, line in enumerate(fh):
                if row in wanted:
                    out[row] = json.loads(line)
        return [out[i] for i in index.tolist()]

    def chunks(self, index: torch.Tensor, size: int | None = None) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(positions in ``index``, hidden (n, d)) for the states in ``index``, ``size`` (``CHUNK``) at a time."""
        size = size or CHUNK
        order = torch.argsort(index)
        sorted_index = index[order]
        buffer, where, start = [], [], 0
        for i, count in enumerate(self.counts):
            lo, hi = torch.searchsorted(sorted_index, torch.tensor([start, start + count])).tolist()
            if hi > lo:
                hidden = load_file(self.path(i))["hidden"]
                buffer.append(hidden[sorted_index[lo:hi] - start])
                where.append(order[lo:hi])
            start += count
            while buffer and sum(len(b) for b in buffer) >= size:
                h, w = torch.cat(buffer), torch.cat(where)
                yield w[:size], h[:size]
                buffer, where = ([h[size:]], [w[size:]]) if len(h) > size else ([], [])
        if buffer:
            yield torch.cat(where), torch.cat(buffer)

    def load(self, index: torch.Tensor) -> torch.Tensor:
        """The hidden states of ``index`` in memory, in that order (for P's training set)."""
        out = torch.empty(len(index), self.hidden_size)
        for where, hidden in self.chunks(index):
            out[where] = hidden
        return out


@torch.inference_mode()
def write_state_shards(model, tokenizer, documents, cfg: StatesConfig, directory: Path, progress: bool = True):
    """Like :func:`openstamp.embed.states.collect_states`, but each batch's states go straight to disk."""
    directory.mkdir(parents=True, exist_ok=True)
    windows = state_windows(model, tokenizer, documents, cfg, progress)
    n = min(cfg.n_states, len(windows) * cfg.positions_per_window)
    counts, row = [], 0
    bar = tqdm(total=n, desc="hidden states (sharded)", unit="state", disable=not progress)
    with (directory / "texts.jsonl").open("w", encoding="utf-8") as texts:
        for batch, h in window_batches(model, tokenizer, windows, cfg.batch_size):
            rows, docs, spans = [], [], []
            for i, w in enumerate(batch):
                take = w.positions[: n - row - len(docs)]
                rows.append(h[i, take])
                docs.extend([w.document] * len(take))
                spans.extend(w.ids[max(0, t + 1 - cfg.context_tokens) : t + 1] for t in take)
            shard = {"hidden": torch.cat(rows).contiguous(), "document": torch.tensor(docs, dtype=torch.long)}
            save_file(shard, directory / f"states-{len(counts):05d}.safetensors")
            for text in tokenizer.batch_decode(spans, skip_special_tokens=True):
                texts.write(json.dumps(text) + "\n")
            counts.append(len(docs))
            row += len(docs)
            bar.update(len(docs))
            if row >= n:
                break
    bar.close()
    return StateShards(directory, counts, h.shape[-1])
