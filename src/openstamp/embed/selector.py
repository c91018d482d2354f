"""Fitting the selector S on a key's states: in memory, or streamed over state shards.

In memory, :func:`openstamp.key.selector.fit_selector` does it all. Over shards (``--states-dir``),
:func:`fit_selector_streaming` does the same in passes:

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

from collections.abc import Callable

import numpy as np
import torch

from openstamp.config import SelectorConfig
from openstamp.embed import shards as shard_files
from openstamp.embed.shards import StateShards
from openstamp.embed.states import States
from openstamp.key.kmeans import assign, kmeans_streamed
from openstamp.key.selector import accuracy, fit_selector, kmeans_device, ridge_lambda

KMEANS_EPOCHS = 5  # passes of mini-batch k-means over the training states
KMEANS_ROUNDS = 30  # most Lloyd rounds (passes) of streamed torch k-means
SEED_STATES = 50  # states per cluster drawn for the k-means++ seeding of streamed torch k-means


def fit_on_states(
    states: States | StateShards,
    train: torch.Tensor,
    held: torch.Tensor,
    projection: torch.Tensor | None,
    cfg: SelectorConfig,
    penalties: Callable[[torch.Tensor | None], tuple[torch.Tensor | None, torch.Tensor | None]] | None = None,
) -> tuple[torch.Tensor, dict]:
    """S fitted on the ``train`` states, scored on ``held``: in memory for ``States``, streamed for shards.

    ``penalties(projection)`` gives the consistency and Fisher penalties' rows (``dz``, ``gz`` of
    ``fit_selector``), which need the states in memory.
    """
    if isinstance(states, StateShards):
        if cfg.consistency > 0 or cfg.fisher > 0:
            raise ValueError(
                "selector.consistency and selector.fisher need states in memory; they do not run with --states-dir yet"
            )
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return fit_selector_streaming(states, train, held, projection, cfg, device)
    z = _project(states.hidden, projection)
    dz, gz = penalties(projection) if penalties is not None else (None, None)
    return fit_selector(z[train], z[held], cfg, dz=dz, gz=gz)


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
    size = max(shard_files.CHUNK, 3 * cfg.n_lists)
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
