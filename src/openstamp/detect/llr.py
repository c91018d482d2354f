"""Per-token watermark statistics from final hidden states: pure tensor code.

With ``w = dW h = delta * G s`` (s = S P h) computed through the low-rank factors in fp32,
the watermarked logits are ``U~ h`` and the original logits ``U~ h - w``. For each scored
token x:

* ``llr``       log p_wm(x) - log p_orig(x) = w_x - lse(z_wm) + lse(z_orig)   (paper eq. 3)
* ``centred``   delta * s . (G[x] - m): the watermark logit of x minus its expectation under
                the original model, m_l = sum_v p_orig(v) G[v, l] (the green mass of list l,
                exact over the whole vocabulary, accumulated block by block like the
                log-sum-exp). On text sampled from the original model each token's term has
                mean zero for any fixed key. It is the statistic of the permutation test and
                of the tail bound in ``tail.py``. ``top_k`` restores the older, cheaper estimate
                (exact over the top-k tokens, gamma times the rest).
* ``discrete``  the LLR with the argmax list only: delta*G[x,l] - log(1 + (e^delta - 1) p_orig(G_l))
* ``green``     x is in the argmax list (the binomial detector's indicator)

The vocabulary is processed in blocks with an online log-sum-exp (as in flash attention), so
each block of logits stays in cache and no (tokens, |V|) tensor is ever materialised.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from openstamp.key.key import WatermarkKey


@dataclass
class TokenStats:
    """Statistics of N scored tokens (flat over texts).

    llr, centred, discrete: fp32 (N,); green: bool (N,); selected: long (N,);
    selector: fp32 (N, L) s; residual: fp32 (N, L) G[x] - m (None without ``with_null``);
    lse_orig: fp32 (N,) log-sum-exp of the original logits (the tail bound re-uses it).
    """

    llr: torch.Tensor
    centred: torch.Tensor
    discrete: torch.Tensor
    green: torch.Tensor
    selected: torch.Tensor
    selector: torch.Tensor
    residual: torch.Tensor | None
    lse_orig: torch.Tensor | None = None


def token_stats(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    key: WatermarkKey,
    *,
    bias: torch.Tensor | None = None,
    head_is_watermarked: bool = True,
    with_null: bool = True,
    top_k: int | None = None,
    chunk: int = 512,
    block: int = 2048,
) -> TokenStats:
    """Compute per-token statistics.

    Args:
        hidden: (N, d) final hidden states whose next tokens are scored.
        targets: (N,) the next tokens.
        weight: (V, d) the model's lm_head weight, U~ (or U if ``head_is_watermarked`` is False).
        bias: optional (V,) lm_head bias (unchanged by the watermark).
        with_null: also compute the centred score and its permutation ingredients.
        top_k: None for the exact m over the whole vocabulary; k for the estimate that is exact
            over the original model's top-k tokens and takes gamma for the rest.
        chunk: tokens per pass; block: vocabulary rows per block.
    """
    green = key.green_float.to(hidden.device)  # (V, L)
    green_t = green.T.contiguous()  # (L, V)
    counted = None
    if with_null and top_k is None:  # [G | 1]: one product gives every list's mass and the normaliser
        counted = torch.cat([green, torch.ones(len(green), 1, device=hidden.device)], 1)
        green = counted[:, :-1]
    parts = [
        _chunk_stats(
            hidden[i : i + chunk],
            targets[i : i + chunk],
            weight,
            bias,
            key,
            green,
            green_t,
            counted,
            head_is_watermarked,
            with_null,
            top_k,
            block,
        )
        for i in range(0, len(hidden), chunk)
    ]
    if not parts:
        L, empty = key.n_lists, torch.empty(0)
        residual = torch.empty(0, L) if with_null else None
        return TokenStats(empty, empty, empty, empty.bool(), empty.long(), torch.empty(0, L), residual, empty)
    return join_stats(parts)


def stats_rows(stats: TokenStats, start: int, stop: int) -> TokenStats:
    """Rows ``start:stop`` of every per-token field."""
    return TokenStats(**{k: (v[start:stop] if isinstance(v, torch.Tensor) else v) for k, v in stats.__dict__.items()})


def join_stats(parts: list[TokenStats]) -> TokenStats:
    """The rows of ``parts`` one after another."""
    first = parts[0]
    return TokenStats(
        **{
            k: (torch.cat([getattr(p, k) for p in parts]) if isinstance(v, torch.Tensor) else v)
            for k, v in first.__dict__.items()
        }
    )


class _OnlineLSE:
    """Running log-sum-exp over vocabulary blocks; ``update`` returns the rescale factor."""

    def __init__(self, n: int, device: torch.device) -> None:
        self.max = torch.full((n,), -math.inf, device=device)
        self.sum = torch.zeros(n, device=device)

    def update(self, z: torch.Tensor, exp_in_place: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        new = torch.maximum(self.max, z.amax(-1))
        scale = torch.exp(self.max - new)
        e = z.sub_(new[:, None]).exp_() if exp_in_place else torch.exp(z - new[:, None])
        self.sum.mul_(scale).add_(e.sum(-1))
        self.max = new
        return e, scale

    def value(self) -> torch.Tensor:
        return self.sum.log() + self.max


def _chunk_stats(h, x, weight, bias, key, green, green_t, counted, head_is_watermarked, with_null, top_k, block):
    """One chunk of tokens, one pass over the vocabulary in blocks.

    Per block: the watermarked log-sum-exp in one fused kernel, the original logits by one rank-L update, and
    their exponentials (against a running max) multiplied once by [G | 1], which gives the green mass of every
    list and the softmax normaliser together (the argmax list's mass is one of its columns). Without the exact
    m (``with_null`` False, or ``top_k``) the normaliser and the argmax list's mass are summed instead.
    """
    n, L, delta, device = len(h), green.shape[1], key.delta, h.device
    s = key.selector_values(h)  # (n, L) fp32
    selected = s.argmax(-1)
    lse_wm = torch.full((n,), -math.inf, device=device)
    running = torch.full((n,), -math.inf, device=device)  # the original logits' running max
    exact = counted is not None
    if exact:
        mass = torch.zeros(n, L + 1, device=device)  # sum of exp(z_orig - running max) times [G | 1], per token
    else:
        total, selected_mass = torch.zeros(n, device=device), torch.zeros(n, device=device)
    top_values, top_index = [], []
    for b in range(0, weight.shape[0], block):
        z = F.linear(h, weight[b : b + block], None if bias is None else bias[b : b + block]).float()
        if head_is_watermarked:  # z = U~ h; the original logits are z - w
            lse_wm = torch.logaddexp(lse_wm, torch.logsumexp(z, -1))
            z.addmm_(s, green_t[:, b : b + block], alpha=-delta)
        else:  # z = U h; the watermarked logits are z + w
            z_wm = torch.addmm(z, s, green_t[:, b : b + block], alpha=delta)
            lse_wm = torch.logaddexp(lse_wm, torch.logsumexp(z_wm, -1))
        if with_null and not exact:
            k = min(top_k, z.shape[1])
            values, index = torch.topk(z, k, dim=-1)
            top_values.append(values)
            top_index.append(index + b)
        new = torch.maximum(running, z.amax(-1))
        scale = torch.exp(running - new)
        running = new
        e = z.sub_(new[:, None]).exp_()  # exp(z_orig - running max)
        if exact:
            mass.mul_(scale[:, None]).addmm_(e, counted[b : b + block])
        else:
            total.mul_(scale).add_(e.sum(-1))
            selected_mass.mul_(scale).add_((e * green_t[selected, b : b + block]).sum(-1))
    if exact:
        total, green_mass = mass[:, L], mass[:, :L]
        selected_mass = green_mass.gather(1, selected[:, None]).squeeze(1)
    lse_orig = total.log() + running
    g_x = green[x]  # (n, L) membership of each scored token in every list
    llr = delta * (s * g_x).sum(-1) - lse_wm + lse_orig
    is_green = g_x.gather(1, selected[:, None]).squeeze(1) > 0
    discrete = delta * is_green.float() - torch.log1p(math.expm1(delta) * selected_mass / total)
    residual, centred = None, torch.full_like(llr, float("nan"))
    if exact:
        residual = g_x - green_mass / total[:, None]
        centred = delta * (s * residual).sum(-1)
    elif with_null:
        values, index = torch.cat(top_values, 1), torch.cat(top_index, 1)
        values, pick = torch.topk(values, min(top_k, values.shape[1]), dim=-1)
        index = index.gather(1, pick)
        p_top = torch.exp(values - lse_orig[:, None])  # (n, k) original probabilities
        m = torch.bmm(p_top[:, None, :], green[index]).squeeze(1) + key.gamma * (1 - p_top.sum(-1, keepdim=True))
        residual = g_x - m
        centred = delta * (s * residual).sum(-1)
    return TokenStats(llr, centred, discrete, is_green, selected, s, residual, lse_orig)


def permutation_pvalue(
    selector: torch.Tensor, residual: torch.Tensor, perms: torch.Tensor, delta: float
) -> tuple[float, float, float]:
    """Permutation test of one text's centred score.

    The statistic is T = delta * sum_t s_t . (G[x_t] - m_t). Re-mapping which green list
    each cluster selects (column permutation pi of G) gives T_pi = delta * sum_l C[l, pi(l)]
    with C = S^T R (L x L), so each permutation costs O(L) once C is formed.

    Args:
        selector: (T, L) s of the text's scored tokens.
        residual: (T, L) G[x] - m of the same tokens.
        perms: (K, L) permutations.
    Returns:
        (statistic T, Monte-Carlo p-value (1 + #{T_pi >= T}) / (K + 1), z of T against the
        permutation distribution).
    """
    return cross_pvalue(cross_matrix(selector, residual), perms, delta)


def cross_matrix(selector: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """C = S^T R, the (L, L) fp64 matrix the permutation test reads, from (T, L) s and G[x] - m of a set of
    scored tokens. It is a sum over tokens, so the C of several texts is the sum of theirs."""
    return selector.double().T @ residual.double()


def cross_pvalue(C: torch.Tensor, perms: torch.Tensor, delta: float) -> tuple[float, float, float]:
    """``permutation_pvalue`` from the (L, L) fp64 matrix C = S^T R, which is additive over tokens: the
    C of a set of texts is the sum of theirs, and one permutation re-maps every token's list at once."""
    observed = delta * float(torch.diagonal(C).sum())
    rows = torch.arange(C.shape[0])
    null = delta * C[rows, perms].sum(-1)  # (K,)
    tolerance = 1e-9 * max(1.0, abs(observed))
    p = (1 + int((null >= observed - tolerance).sum())) / (len(perms) + 1)
    sd = float(null.std()) if len(null) > 1 else float("nan")
    z = (observed - float(null.mean())) / sd if sd > 0 else float("nan")
    return observed, p, z


def target_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    *,
    chunk: int = 512,
    block: int = 4096,
) -> torch.Tensor:
    """log softmax(W h + b)[target] for each row, without materialising (N, |V|) logits.

    Args:
        hidden: (N, d); targets: (N,); weight: (V, d).
    Returns:
        fp32 (N,).
    """
    out = []
    for i in range(0, len(hidden), chunk):
        h, x = hidden[i : i + chunk], targets[i : i + chunk]
        lse = _OnlineLSE(len(h), h.device)
        for b in range(0, weight.shape[0], block):
            lse.update(
                F.linear(h, weight[b : b + block], None if bias is None else bias[b : b + block]).float(),
                exp_in_place=True,
            )
        picked = (h * weight[x]).sum(-1).float() + (0.0 if bias is None else bias[x].float())
        out.append(picked - lse.value())
    return torch.cat(out) if out else torch.empty(0)
