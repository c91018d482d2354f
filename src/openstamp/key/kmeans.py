"""k-means in torch, for fitting the selector on a GPU (scikit-learn's runs on the CPU only).

Lloyd's algorithm with k-means++ seeding (Arthur & Vassilvitskii, 2007):

* seeding: the first centre is a uniformly drawn state; each next centre is drawn with
  probability proportional to D(z)^2, the squared distance to the nearest centre so far
  (greedily: the best of 2 + ln k such draws);
* assignment: label(z) = argmin_c ||z - mu_c||^2 = argmin_c (||mu_c||^2 - 2 z . mu_c);
* update: mu_c = mean of the states labelled c. An emptied cluster is re-seeded at the
  state farthest from its centre;
* stop when sum_c ||mu_c' - mu_c||^2 <= tol * mean_j Var(z_j) (scikit-learn's rule), or after
  ``max_iter`` rounds.

Random draws come from a seeded CPU ``torch.Generator``, so one seed gives one seeding on
any device; the arithmetic runs on ``device`` in chunks of states. :func:`kmeans_streamed`
runs the same rounds over data that does not fit in memory: each round is one pass that sums
the states of each cluster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch

CHUNK = 65_536  # states per distance computation: (CHUNK, k) floats at a time


def assign(z: torch.Tensor, centroids: torch.Tensor, device: str | torch.device = "cpu") -> torch.Tensor:
    """Nearest-centre labels (N,) of states z (N, d), computed on ``device``, returned on the CPU."""
    c = centroids.to(device, torch.float32)
    c_norm = (c * c).sum(1)
    out = []
    for start in range(0, len(z), CHUNK):
        x = z[start : start + CHUNK].to(device, torch.float32)
        out.append((c_norm - 2 * x @ c.T).argmin(1).cpu())
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def _min_sq_dist(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return ((x * x).sum(1, keepdim=True) - 2 * x @ c.T + (c * c).sum(1)).clamp(min=0).min(1).values


def seed_centres(z: torch.Tensor, k: int, generator: torch.Generator, device: str | torch.device) -> torch.Tensor:
    """Greedy k-means++ seeding of k centres among the states z (N, d).

    Each step draws 2 + ln(k) candidates by D^2 and keeps the one that lowers sum D^2 most,
    as scikit-learn does.
    """
    x = z.to(device, torch.float32)
    trials = 2 + int(math.log(k))
    first = int(torch.randint(len(x), (1,), generator=generator))
    centres = [x[first]]
    dist = _min_sq_dist(x, x[first : first + 1])
    for _ in range(1, k):
        weights = dist.double().cpu()
        total = float(weights.sum())
        if total <= 0:  # fewer distinct states than k: repeat one
            picks = torch.randint(len(x), (1,), generator=generator)
        else:
            picks = torch.multinomial(weights / total, trials, replacement=True, generator=generator)
        candidates = [torch.minimum(dist, _min_sq_dist(x, x[p : p + 1])) for p in picks.tolist()]
        best = min(range(len(candidates)), key=lambda i: float(candidates[i].sum()))
        centres.append(x[int(picks[best])])
        dist = candidates[best]
    return torch.stack(centres)


def _sums(chunks: Iterable[torch.Tensor], centroids: torch.Tensor, device) -> tuple[torch.Tensor, ...]:
    """One pass: per-cluster sums and counts, and the farthest state from its centre."""
    k, d = centroids.shape
    sums = torch.zeros(k, d, dtype=torch.float64, device=device)
    counts = torch.zeros(k, dtype=torch.float64, device=device)
    far, far_dist = torch.zeros(d, device=device), -1.0
    c_norm = (centroids * centroids).sum(1)
    for chunk in chunks:
        x = chunk.to(device, torch.float32)
        scores = c_norm - 2 * x @ centroids.T
        best, labels = scores.min(1)
        sums.index_add_(0, labels, x.double())
        counts += torch.bincount(labels, minlength=k).double()
        dist = best + (x * x).sum(1)
        i = int(dist.argmax())
        if float(dist[i]) > far_dist:
            far, far_dist = x[i].clone(), float(dist[i])
    return sums, counts, far


def _lloyd(chunks: Callable[[], Iterable[torch.Tensor]], centroids, max_iter, tol_abs, device):
    rounds = 0
    while rounds < max_iter:
        rounds += 1
        sums, counts, far = _sums(chunks(), centroids, device)
        new = torch.where(counts[:, None] > 0, sums / counts.clamp(min=1)[:, None], centroids.double()).float()
        empty = torch.nonzero(counts == 0).flatten()
        if len(empty):
            new[empty[0]] = far  # one per round; the next round re-seeds any other
        shift = float(((new - centroids) ** 2).sum())
        centroids = new
        if shift <= tol_abs and not len(empty):
            break
    return centroids, rounds


def kmeans(
    z: torch.Tensor,
    k: int,
    seed: int = 0,
    max_iter: int = 100,
    device: str | torch.device = "cpu",
    tol: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Cluster states z (N, d) into k groups.

    Returns:
        centroids (k, d) and labels (N,) on the CPU, and the number of Lloyd rounds run.
    """
    if len(z) < k:
        raise ValueError(f"{len(z)} states cannot form {k} clusters")
    generator = torch.Generator().manual_seed(seed)
    centroids = seed_centres(z, k, generator, device)
    tol_abs = tol * float(z.double().var(0).mean())

    def chunks():
        return (z[s : s + CHUNK] for s in range(0, len(z), CHUNK))

    centroids, rounds = _lloyd(chunks, centroids, max_iter, tol_abs, device)
    return centroids.cpu(), assign(z, centroids, device), rounds


def kmeans_streamed(
    chunks: Callable[[], Iterable[torch.Tensor]],
    sample: torch.Tensor,
    k: int,
    seed: int = 0,
    max_iter: int = 20,
    device: str | torch.device = "cpu",
    tol: float = 1e-4,
) -> tuple[torch.Tensor, int]:
    """k-means over data read chunk by chunk: ``chunks()`` yields (n, d) tensors, anew each round.

    Args:
        sample: (M, d) states (M >= k) for the k-means++ seeding and the tolerance scale.
    Returns:
        centroids (k, d) on the CPU and the number of rounds (passes over the data) run.
    """
    if len(sample) < k:
        raise ValueError(f"{len(sample)} states cannot form {k} clusters")
    generator = torch.Generator().manual_seed(seed)
    centroids = seed_centres(sample, k, generator, device)
    tol_abs = tol * float(sample.double().var(0).mean())
    centroids, rounds = _lloyd(chunks, centroids, max_iter, tol_abs, device)
    return centroids.cpu(), rounds
