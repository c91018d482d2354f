"""Hidden states on disk, for keys of large models: written in shards, fitted by streaming.

``collect_states`` keeps every sampled state in one (N, d) tensor: 24 GB for the paper's 1.5M
states of a 4096-wide model. Here each forward batch's states go to a safetensors shard as
soon as they are computed, and the selector is fitted in passes over the shards:

* k-means: on a GPU, full Lloyd rounds in torch, one pass over the shards each
  (:func:`openstamp.key.kmeans.kmeans_streamed`); on the CPU, scikit-learn's
  ``MiniBatchKMeans.partial_fit``, chunk by chunk, for a few epochs;
* ridge: the Gram matrix ``X^T X`` and ``X^T Y`` are summed over chunks, then solved
  (on the GPU when there is one), which gives exactly the in-memory solution;
* row rescaling, accuracies and the effective strength: one more pass each.

Memory is bounded by one chunk and the (d, d) Gram matrix, whatever the number of states.
Only P's training set (``projection.n_states`` states and their texts) is loaded whole.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from openstamp.config import SelectorConfig, StatesConfig
from openstamp.hidden import state_windows, window_batches
from openstamp.key.kmeans import assign, kmeans_streamed
from openstamp.key.selector import accuracy, kmeans_device, ridge_lambda

KMEANS_EPOCHS = 5  # passes of mini-batch k-means over the training states
KMEANS_ROUNDS = 30  # most Lloyd rounds (passes) of streamed torch k-means
SEED_STATES = 50  # states per cluster drawn for the k-means++ seeding of streamed torch k-means
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

    def texts(self, index: torch.Tensor) -> list[str]:
        wanted = set(index.tolist())
        out = {}
        with (self.directory / "texts.jsonl").open(encoding="utf-8") as fh:
            for row, line in enumerate(fh):
                if row in wanted:
                    out[row] = json.loads(line)
        return [out[i] for i in index.tolist()]

    def chunks(self, index: torch.Tensor, size: int = CHUNK) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(positions in ``index``, hidden (n, d)) for the states in ``index``, a chunk at a time."""
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
    """Like :func:`openstamp.hidden.collect_states`, but each batch's states go straight to disk."""
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


def _project(hidden: torch.Tensor, projection: torch.Tensor | None) -> torch.Tensor:
    return hidden if projection is None else hidden @ projection.T


def fit_selector_streaming(
    shards: StateShards,
    train: torch.Tensor,
    held: torch.Tensor,
    projection: torch.Tensor | None,
    cfg: SelectorConfig,
    device: str | torch.device = "cpu",
) -> tuple[torch.Tensor, dict]:
    """:func:`openstamp.key.selector.fit_selector` in passes over the shards.

    Args:
        train, held: (N,), (M,) state indices. projection: P, (k, d), or None for P = I.
    Returns:
        S with one row per kept cluster, (L_eff, k), and the same stats as the in-memory fit.
    """
    if len(train) < cfg.n_lists:
        raise ValueError(f"{len(train)} states cannot form {cfg.n_lists} clusters; sample more states or lower L")
    size = max(CHUNK, 3 * cfg.n_lists)
    predict, method = _streamed_kmeans(shards, train, projection, cfg, size)

    def labelled(index):
        for where, h in shards.chunks(index, size):
            z = _project(h, projection)
            yield where, z, predict(z)

    sizes = torch.zeros(cfg.n_lists, dtype=torch.long)
    for _, _, labels in labelled(train):
        sizes += torch.bincount(labels, minlength=cfg.n_lists)
    kept = torch.nonzero(sizes >= cfg.min_cluster_size).flatten()
    if len(kept) < 2:
        raise ValueError("fewer than 2 clusters have enough states; sample more states or lower L")
    remap = torch.full((cfg.n_lists,), -1, dtype=torch.long)
    remap[kept] = torch.arange(len(kept))
    k = shards.hidden_size if projection is None else projection.shape[0]
    gram = torch.zeros(k, k, dtype=torch.float64, device=device)
    xty = torch.zeros(k, len(kept), dtype=torch.float64, device=device)
    for _, z, labels in labelled(train):
        y, keep = remap[labels], remap[labels] >= 0
        x = z[keep].to(device, torch.float64)
        gram += x.T @ x
        xty.index_add_(1, y[keep].to(device), x.T)
    lam = ridge_lambda(cfg, float(gram.trace()), k)
    gram += lam * torch.eye(k, dtype=torch.float64, device=device)
    S = torch.linalg.solve(gram, xty).T.float().cpu()
    factors = torch.ones(len(kept))
    if cfg.rescale:
        sums = torch.zeros(len(kept))
        for _, z, labels in labelled(train):
            y, keep = remap[labels], remap[labels] >= 0
            sums.index_add_(0, y[keep], (z[keep] @ S.T)[torch.arange(int(keep.sum())), y[keep]])
        means = sums / sizes[kept].clamp(min=1)
        factors = torch.where(means > 1e-3, 1.0 / means, torch.ones_like(means))
        S = S * factors[:, None]
    train_acc, held_acc = _accuracy(labelled(train), S, remap), _accuracy(labelled(held), S, remap)
    stats = {
        "n_lists_requested": cfg.n_lists,
        "n_lists": len(kept),
        "n_dropped_clusters": cfg.n_lists - len(kept),
        "cluster_sizes": sorted(sizes[kept].tolist(), reverse=True),
        "train_accuracy": train_acc[0],
        "heldout_accuracy": held_acc[0],
        "heldout_states": held_acc[1],
        "rescale_factor_mean": float(factors.mean()),
        "rescale_factor_min": float(factors.min()),
        "rescale_factor_max": float(factors.max()),
        "kmeans": method,
        "ridge_lambda": lam,
        "consistency_mu": 0.0,  # the penalties need states in memory: build_key refuses them with shards
        "fisher_nu": 0.0,
    }
    return S, stats


def _streamed_kmeans(shards: StateShards, train: torch.Tensor, projection, cfg: SelectorConfig, size: int):
    """k-means over the shards: a labelling function and a description of the fit."""
    device = kmeans_device(cfg)
    if device is not None:
        sample = _project(shards.load(train[: SEED_STATES * cfg.n_lists]), projection)
        centroids, rounds = kmeans_streamed(
            lambda: (_project(h, projection) for _, h in shards.chunks(train, size)),
            sample,
            cfg.n_lists,
            cfg.seed,
            min(cfg.kmeans_max_iter, KMEANS_ROUNDS),
            device,
        )
        return (lambda z: assign(z, centroids, device)), f"torch on {device}, streamed, {rounds} rounds"
    from sklearn.cluster import MiniBatchKMeans

    km = MiniBatchKMeans(n_clusters=cfg.n_lists, random_state=cfg.seed, batch_size=size, n_init=3)
    for _ in range(KMEANS_EPOCHS):
        for _, h in shards.chunks(train, size):
            if len(h) >= cfg.n_lists:
                km.partial_fit(_project(h, projection).numpy().astype(np.float32))

    def predict(z: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(km.predict(z.numpy().astype(np.float32)).astype(np.int64))

    return predict, f"scikit-learn mini-batch, streamed, {KMEANS_EPOCHS} epochs"


def _accuracy(chunks, S: torch.Tensor, remap: torch.Tensor) -> tuple[float, int]:
    hits, total = 0.0, 0
    for _, z, labels in chunks:
        y, keep = remap[labels], remap[labels] >= 0
        n = int(keep.sum())
        if n:
            hits += accuracy(S, z[keep], y[keep]) * n
            total += n
    return (hits / total if total else float("nan")), total
