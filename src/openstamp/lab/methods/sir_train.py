"""SIR's transform network and its training (Liu et al. 2024, "A Semantic Invariant Robust Watermark").

The transform ``T`` maps a context's sentence embedding ``e`` (k,) to ``m`` watermark logits
(the reference code's architecture, with its sizes as defaults)::

    h_0 = W_0 e + b_0                               (no activation: as in the reference code)
    h_l = h_{l-1} + relu(W_l h_{l-1} + b_l)         l = 1 .. layers - 2 (residual blocks)
    T(e) = W_L h + b_L                              (m,)

It is trained on the embeddings ``e_1 .. e_N`` of text windows so that the similarity of two
contexts' outputs follows the similarity of their embeddings, shifted and sharpened (the
embeddings of any two texts are already similar, cos ~ 0.1 .. 0.6 for MiniLM)::

    target_ij = tanh(scale * (cos(e_i, e_j) - shift))        shift = median_{i != j} cos(e_i, e_j)
    L_sim     = mean_{i != j in batch} | cos(T(e_i), T(e_j)) - target_ij |
    L_norm    = mean_i (mean_k T_ik)^2 + mean_k (mean_i T_ik)^2 + mean_{i,k} | 1 - |T_ik| |
    L         = L_sim + norm_weight * L_norm

``L_norm`` is the normalisation loss: each output (row) and each output unit over the contexts
(column) is balanced around 0, so no token is favoured whatever the context, and every unit
has magnitude ~1.

Where the paper and its reference code (THU-BPM/Robust_Watermark, train_watermark_model.py)
disagree, or where we chose differently, and why:

* shift: the paper subtracts the *mean* pairwise similarity, the code the *median*; we take
  the median of the training set (the code's; robust to duplicate windows). scale = 20 (both).
* pairs: the code pairs batch a's row i with batch b's row i (32 pairs a step); we use every
  pair i != j of one batch (the paper's double sum), more signal per step.
* balance: the code sums the squared row and column means (weight 0.1); we average them
  (independent of batch size and m) with the same weight.
* magnitude: the paper pulls |T_ik| towards 1 (``|R - |T_ik||`` with R = 1); the code only
  penalises |T_ik| < 0.05 (weight 1). We use the paper's term: the scores used at decoding
  are ``tanh(1000 (T - mean T))`` anyway, so only signs matter there, and a unit scale keeps
  the pre-tanh margins away from 0.
* optimiser: the code runs SGD (lr 0.006, weight decay 0.2, 2,000 epochs); we use Adam
  (lr 1e-3, 300 steps of 64 windows by default), which reaches a lower loss in seconds on a CPU.
* embedder: the paper uses compositional-BERT-large (1,024-d); we use the packaged MiniLM (384-d).

``bow`` is a light, deterministic stand-in embedder for tests: the normalised sum of keyed
Gaussian vectors of a text's lower-cased words (a bag of words), 64-d.
"""

from __future__ import annotations

import functools
import hashlib

import torch
from torch import nn

from openstamp.embed.sentences import encode_texts
from openstamp.lab.methods.common import keyed_normal

BOW_DIM = 64


class ResidualBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.relu(self.fc(x))


class TransformNet(nn.Module):
    """``T``: (N, k) embeddings -> (N, m) watermark logits (see the module docstring)."""

    def __init__(self, in_dim: int, hidden: int, layers: int, out_dim: int) -> None:
        super().__init__()
        blocks = [ResidualBlock(hidden) for _ in range(layers - 2)]
        self.layers = nn.Sequential(nn.Linear(in_dim, hidden), *blocks, nn.Linear(hidden, out_dim))

    @property
    def out_dim(self) -> int:
        return self.layers[-1].out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x.to(self.layers[0].weight.dtype))


def transform_from_state(state: dict[str, torch.Tensor]) -> TransformNet:
    """Rebuild a ``TransformNet`` from its state dict (the sizes are read off the weights)."""
    n = 1 + max(int(name.split(".")[1]) for name in state)
    first, last = state["layers.0.weight"], state[f"layers.{n - 1}.weight"]
    net = TransformNet(first.shape[1], first.shape[0], n, last.shape[0])
    net.load_state_dict(state)
    return net.eval()


def _cosine_matrix(x: torch.Tensor) -> torch.Tensor:
    """(N, d) -> (N, N) pairwise cosine similarities."""
    unit = x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    return unit @ unit.T


def similarity_loss(inputs: torch.Tensor, outputs: torch.Tensor, shift: float, scale: float) -> torch.Tensor:
    """``L_sim``: inputs (N, k), outputs (N, m), N >= 2 -> scalar (the mean over pairs i != j)."""
    target = torch.tanh(scale * (_cosine_matrix(inputs) - shift))
    off = ~torch.eye(len(inputs), dtype=torch.bool, device=inputs.device)
    return (_cosine_matrix(outputs) - target).abs()[off].mean()


def normalisation_loss(outputs: torch.Tensor) -> torch.Tensor:
    """``L_norm``: outputs (N, m) -> scalar (row and column balance plus unit magnitude)."""
    balance = outputs.mean(1).pow(2).mean() + outputs.mean(0).pow(2).mean()
    return balance + (1 - outputs.abs()).abs().mean()


def median_similarity(embeddings: torch.Tensor) -> float:
    """The median cosine similarity over pairs i != j of (N, k) embeddings: the target's shift."""
    sims = _cosine_matrix(embeddings.double())
    return float(sims[~torch.eye(len(sims), dtype=torch.bool)].median())


def train_transform(
    embeddings: torch.Tensor,
    *,
    hidden: int,
    layers: int,
    out_dim: int,
    steps: int,
    batch_size: int,
    lr: float,
    scale: float,
    norm_weight: float,
    seed: int,
) -> tuple[TransformNet, list[float]]:
    """Train ``T`` on (N, k) embeddings with Adam; returns the net (eval mode) and per-step losses."""
    if len(embeddings) < 2:
        raise ValueError("SIR needs at least two training texts")
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    net = TransformNet(embeddings.shape[1], hidden, layers, out_dim)
    shift = median_similarity(embeddings)
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    losses, size = [], min(batch_size, len(embeddings))
    for _ in range(steps):
        batch = embeddings[torch.randperm(len(embeddings), generator=generator)[:size]]
        out = net(batch)
        loss = similarity_loss(batch, out, shift, scale) + norm_weight * normalisation_loss(out)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    return net.eval(), losses


# -- embedders ----------------------------------------------------------------------------------


@functools.lru_cache(maxsize=65536)
def _word_vector(word: str) -> torch.Tensor:
    secret = hashlib.sha256(word.encode()).digest()
    return keyed_normal(secret, b"openstamp/eval/sir/bow/v1", BOW_DIM)


def bow_embed(texts: list[str]) -> torch.Tensor:
    """The ``bow`` embedder: L2-normalised sums of keyed word vectors, float32 (N, 64)."""
    rows = []
    for text in texts:
        words = text.lower().split()
        total = torch.stack([_word_vector(w) for w in words]).sum(0) if words else torch.zeros(BOW_DIM)
        rows.append(total / total.norm().clamp_min(1e-12))
    return torch.stack(rows) if rows else torch.zeros(0, BOW_DIM)


def embed(texts: list[str], name: str) -> torch.Tensor:
    """Sentence embeddings, float32 (N, k): ``bow`` here, any other name through openstamp.embed.sentences."""
    if name == "bow":
        return bow_embed(texts)

    if not texts:
        return torch.zeros(0, 0)
    return encode_texts(texts, name, progress=False)
