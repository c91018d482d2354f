"""S: closed-form ridge regression onto one-hot k-means labels of projected states."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from sklearn.cluster import KMeans, MiniBatchKMeans

from openstamp.config import SelectorConfig
from openstamp.key.kmeans import assign, kmeans

_FULL_KMEANS_LIMIT = 200_000  # above this many states, use incremental (mini-batch) k-means as the paper does


def ridge(
    z: torch.Tensor,
    labels: torch.Tensor,
    n_classes: int,
    lam: float,
    intercept: bool = False,
    dz: torch.Tensor | None = None,
    mu: float = 0.0,
    gz: torch.Tensor | None = None,
    nu: float = 0.0,
) -> torch.Tensor:
    """Solve min_S sum_i ||S z_i - y_i||^2 + lam ||S||_F^2 + mu sum_j ||S dz_j||^2 + nu sum_k ||S gz_k||^2 in
    closed form (float64):

        S = Y^T Z (Z^T Z + lam I + mu dZ^T dZ + nu gZ^T gZ)^-1

    The third term is the context-consistency penalty: ``dz`` holds differences between a state computed on its
    full window and the same state computed with the window's first part cut, so S learns to select alike for
    both (what a prompt-free detector, which sees less context than the generator did, needs).

    The last is the input-side Fisher penalty: ``gz`` holds input-embedding gradients (``hidden.input_gradients``),
    so sum_k ||S gz_k||^2 = M tr(S F S^T). A re-tied key moves token x's input embedding by
    dW[x] = delta (G[x] - c) S; over random keys E[dW[x] F dW[x]^T] = delta^2 gamma (1 - gamma) tr(S F S^T) to
    first order, so this term prices the cost that the head's LLR does not see.

    Args:
        z: (N, d) inputs.
        labels: (N,) class ids in [0, n_classes).
        intercept: append a constant feature (analysis only: a weight patch has no bias).
        dz: (M, d) state differences, or None; ``mu`` weighs them (0: the plain ridge).
        gz: (K, d) input-embedding gradients, or None; ``nu`` weighs them.
    Returns:
        S, (n_classes, d) or (n_classes, d + 1) with ``intercept``.
    """
    x = z.double()
    if intercept:
        x = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
    y = torch.zeros(len(x), n_classes, dtype=x.dtype)
    y[torch.arange(len(x)), labels] = 1.0
    gram = x.T @ x + lam * torch.eye(x.shape[1], dtype=x.dtype)
    if dz is not None and mu > 0:
        if intercept:
            raise ValueError("the consistency penalty takes no intercept")
        gram += mu * (dz.double().T @ dz.double())
    if gz is not None and nu > 0:
        if intercept:
            raise ValueError("the Fisher penalty takes no intercept")
        gram += nu * (gz.double().T @ gz.double())
    return torch.linalg.solve(gram, x.T @ y).T.float()


def consistency_weight(cfg: SelectorConfig, n_fit: int, n_deltas: int) -> float:
    """mu = ``cfg.consistency`` * N / M: at 1, a state difference weighs as much as a fitted state."""
    return cfg.consistency * n_fit / max(n_deltas, 1)


def fisher_weight(cfg: SelectorConfig, z: torch.Tensor, gz: torch.Tensor) -> float:
    """nu = ``cfg.fisher`` * tr(Z^T Z) / tr(gZ^T gZ): at 1 the penalty's trace equals the states'."""
    return cfg.fisher * float((z.double() ** 2).sum()) / max(float((gz.double() ** 2).sum()), 1e-30)


def ridge_lambda(cfg: SelectorConfig, trace: float, width: int) -> float:
    """The ridge penalty: ``cfg.shrinkage`` f times the mean diagonal of Z^T Z (``trace`` / ``width``), floored at
    ``cfg.ridge_lambda``. Shrinkage pulls S towards smaller, smoother selections before its rows are rescaled."""
    return max(cfg.shrinkage * trace / width, cfg.ridge_lambda)


def kmeans_device(cfg: SelectorConfig) -> str | None:
    """Where torch k-means runs, or None for scikit-learn's (``cfg.kmeans``: auto picks torch on a GPU)."""
    gpu = torch.cuda.is_available()
    if cfg.kmeans == "sklearn" or (cfg.kmeans == "auto" and not gpu):
        return None
    return "cuda" if gpu else "cpu"


@dataclass
class Clusters:
    """Training labels (N,), a labelling function for new states, and how they were found."""

    labels: torch.Tensor
    predict: Callable[[torch.Tensor], torch.Tensor]
    method: str


def cluster(z: torch.Tensor, cfg: SelectorConfig) -> Clusters:
    """Seeded k-means into ``cfg.n_lists`` clusters: torch on a GPU, scikit-learn on the CPU."""
    if len(z) < cfg.n_lists:
        raise ValueError(f"{len(z)} states cannot form {cfg.n_lists} clusters; sample more states or lower L")
    device = kmeans_device(cfg)
    if device is not None:
        centroids, labels, rounds = kmeans(z, cfg.n_lists, cfg.seed, cfg.kmeans_max_iter, device)
        return Clusters(labels, lambda x: assign(x, centroids, device), f"torch on {device}, {rounds} rounds")
    kind = KMeans if len(z) <= _FULL_KMEANS_LIMIT else MiniBatchKMeans
    extra = {"n_init": 1} if kind is KMeans else {"n_init": 3, "batch_size": 4096}
    km = kind(n_clusters=cfg.n_lists, random_state=cfg.seed, max_iter=cfg.kmeans_max_iter, **extra)
    km.fit(z.numpy().astype(np.float32))

    def predict(x: torch.Tensor) -> torch.Tensor:
        return torch.from_numpy(km.predict(x.numpy().astype(np.float32)).astype(np.int64))

    return Clusters(torch.from_numpy(km.labels_.astype(np.int64)), predict, f"scikit-learn {kind.__name__}")


def rescale_rows(S: torch.Tensor, z: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale row l so that (S z)_l averages 1 over the states of cluster l.

    Returns the scaled S and the factors (L,). A row whose own-cluster mean is not
    positive keeps factor 1 (reported through the factors).
    """
    own = (z @ S.T)[torch.arange(len(z)), labels]
    sums = torch.zeros(S.shape[0]).index_add_(0, labels, own)
    counts = torch.bincount(labels, minlength=S.shape[0]).clamp(min=1)
    means = sums / counts
    factors = torch.where(means > 1e-3, 1.0 / means, torch.ones_like(means))
    return S * factors[:, None], factors


def accuracy(S: torch.Tensor, z: torch.Tensor, labels: torch.Tensor) -> float:
    """Fraction of states whose selector argmax is their own cluster."""
    if len(z) == 0:
        return float("nan")
    return float(((z @ S.T).argmax(-1) == labels).float().mean())


def fit_selector(
    z_train: torch.Tensor,
    z_heldout: torch.Tensor,
    cfg: SelectorConfig,
    dz: torch.Tensor | None = None,
    gz: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict]:
    """Cluster, drop small clusters, ridge-regress (with the consistency penalty when ``dz`` is given, the Fisher
    penalty when ``gz`` is), rescale.

    Args:
        z_train: (N, d) projected training states.
        z_heldout: (M, d) projected held-out states (for reporting only).
        dz: (K, d) projected state differences for the consistency penalty (``cfg.consistency``), or None.
        gz: (K, d) projected input-embedding gradients for the Fisher penalty (``cfg.fisher``), or None.
    Returns:
        S with one row per kept cluster, (L_eff, d), and a stats dict.
    """
    clusters = cluster(z_train, cfg)
    labels = clusters.labels
    sizes = torch.bincount(labels, minlength=cfg.n_lists)
    kept = torch.nonzero(sizes >= cfg.min_cluster_size).flatten()
    if len(kept) < 2:
        raise ValueError("fewer than 2 clusters have enough states; sample more states or lower L")
    remap = torch.full((cfg.n_lists,), -1, dtype=torch.long)
    remap[kept] = torch.arange(len(kept))
    train_labels = remap[labels]
    in_kept = train_labels >= 0
    z_fit, y_fit = z_train[in_kept], train_labels[in_kept]
    lam = ridge_lambda(cfg, float((z_fit.double() ** 2).sum()), z_fit.shape[1])
    mu = consistency_weight(cfg, len(z_fit), len(dz)) if dz is not None else 0.0
    nu = fisher_weight(cfg, z_fit, gz) if gz is not None else 0.0
    S = ridge(z_fit, y_fit, len(kept), lam, dz=dz, mu=mu, gz=gz, nu=nu)
    factors = torch.ones(len(kept))
    if cfg.rescale:
        S, factors = rescale_rows(S, z_fit, y_fit)
    held_labels = remap[clusters.predict(z_heldout)]
    held_in = held_labels >= 0
    stats = {
        "n_lists_requested": cfg.n_lists,
        "n_lists": len(kept),
        "n_dropped_clusters": cfg.n_lists - len(kept),
        "cluster_sizes": sorted(sizes[kept].tolist(), reverse=True),
        "train_accuracy": accuracy(S, z_fit, y_fit),
        "heldout_accuracy": accuracy(S, z_heldout[held_in], held_labels[held_in]),
        "heldout_states": int(held_in.sum()),
        "rescale_factor_mean": float(factors.mean()),
        "rescale_factor_min": float(factors.min()),
        "rescale_factor_max": float(factors.max()),
        "kmeans": clusters.method,
        "ridge_lambda": lam,
        "consistency_mu": mu,
        "fisher_nu": nu,
    }
    return S, stats
