"""P: a d x d projection trained so that in-batch cosine similarities of projected hidden
states match those of sentence embeddings of their prefix texts (paper eq. 2)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from openstamp.config import ProjectionConfig


def similarity_kl(projected: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """Mean over i of KL(softmax(s^P_i / T) || softmax(s^e_i / T)).

    ``s_i`` holds the cosine similarities of element i to every *other* element of the
    batch (the paper's text says "all other elements"; the diagonal is a constant 1 in
    both spaces and is masked out).

    Args:
        projected: (B, d) projected hidden states P h.
        targets: (B, k) sentence embeddings.
    Returns:
        scalar loss.
    """
    a = F.normalize(projected, dim=-1)
    b = F.normalize(targets, dim=-1)
    eye = torch.eye(a.shape[0], dtype=torch.bool, device=a.device)
    # a large finite mask (not -inf) keeps 0 * (log p - log q) finite on the diagonal
    log_p = F.log_softmax((a @ a.T / temperature).masked_fill(eye, -1e4), dim=-1)
    log_q = F.log_softmax((b @ b.T / temperature).masked_fill(eye, -1e4), dim=-1)
    terms = log_p.exp() * (log_p - log_q)
    return terms.masked_fill(eye, 0.0).sum(-1).mean()


def similarity_correlation(projected: torch.Tensor, targets: torch.Tensor) -> float:
    """Pearson correlation between pairwise cosine similarities in the two spaces (off-diagonal)."""
    a = F.normalize(projected.double(), dim=-1)
    b = F.normalize(targets.double(), dim=-1)
    mask = ~torch.eye(a.shape[0], dtype=torch.bool, device=a.device)
    x, y = (a @ a.T)[mask], (b @ b.T)[mask]
    return float(torch.corrcoef(torch.stack([x, y]))[0, 1])


def _batched_kl(P: torch.Tensor, h: torch.Tensor, e: torch.Tensor, cfg: ProjectionConfig) -> float:
    losses = [
        float(similarity_kl(h[i : i + cfg.batch_size] @ P.T, e[i : i + cfg.batch_size], cfg.temperature))
        for i in range(0, len(h) - cfg.batch_size + 1, cfg.batch_size)
    ]
    return sum(losses) / max(len(losses), 1)


def train_projection(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    cfg: ProjectionConfig,
    progress: bool = True,
    device: str | torch.device | None = None,
) -> tuple[torch.Tensor, dict]:
    """Train P from the identity with AdamW, on ``device`` (default: a GPU when one is present).

    Args:
        hidden: (N, d) hidden states, fp32.
        targets: (N, k) sentence embeddings of the states' prefix texts.
    Returns:
        P as an fp32 (d, d) tensor, and stats (held-out loss and similarity correlation
        before and after training, loss per epoch).
    """
    if hidden.shape[0] != targets.shape[0]:
        raise ValueError("hidden states and targets must have the same number of rows")
    n = hidden.shape[0]
    generator = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(n, generator=generator)  # only batching order; the key's PRF never uses this
    n_held = max(int(n * cfg.heldout_fraction), min(cfg.batch_size, n // 2))
    held, train = order[:n_held], order[n_held:]
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    h, e = hidden.float().to(device), targets.float().to(device)
    held, train = held.to(device), train.to(device)
    eval_cfg = dataclasses.replace(cfg, batch_size=min(cfg.batch_size, n_held))
    batch_size = min(cfg.batch_size, len(train))
    P = torch.nn.Parameter(torch.eye(h.shape[1], device=device))
    stats = {
        "heldout_kl_identity": _batched_kl(P.detach(), h[held], e[held], eval_cfg),
        "heldout_corr_identity": similarity_correlation(h[held][:512], e[held][:512]),
    }
    optimizer = torch.optim.AdamW([P], lr=cfg.lr, weight_decay=cfg.weight_decay)
    epoch_losses = []
    bar = tqdm(range(cfg.epochs), desc="training P", disable=not progress, unit="epoch")
    for _ in bar:
        perm = train[torch.randperm(len(train), generator=generator).to(device)]
        total, steps = 0.0, 0
        for i in range(0, len(perm) - batch_size + 1, batch_size):
            idx = perm[i : i + batch_size]
            loss = similarity_kl(h[idx] @ P.T, e[idx], cfg.temperature)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, steps = total + loss.item(), steps + 1
        epoch_losses.append(total / max(steps, 1))
        bar.set_postfix(loss=f"{epoch_losses[-1]:.4f}")
    P = P.detach().clone()
    stats.update(device=str(device))
    stats.update(
        heldout_kl=_batched_kl(P, h[held], e[held], eval_cfg),
        heldout_corr=similarity_correlation(h[held][:512] @ P.T, e[held][:512]),
        train_loss_per_epoch=epoch_losses,
        n_train=len(train),
        n_heldout=n_held,
    )
    return P.cpu(), stats
