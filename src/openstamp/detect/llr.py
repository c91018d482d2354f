"""Per-token watermark statistics from final hidden states: pure tensor code.

With ``w = dW h = delta * G s`` (s = S P h) computed through the low-rank factors in fp32,
the watermarked logits are ``U~ h`` and the original logits ``U~ h - w``. For each scored
token x:

* ``llr``       log p_wm(x) - log p_orig(x) = w_x - lse(z_wm) + lse(z_orig)   (paper eq. 3)
* ``centred``   w_x - E_{p_orig}[w] = delta * s . (G[x] - m), m = G^T p_orig: the part of the
                LLR that depends on the written token; LLR = centred - kappa with
                kappa = log E e^w - E w >= 0 fixed by the context alone
* ``discrete``  the LLR with the argmax list only: delta*G[x,l] - log(1 + (e^delta - 1) m_l)
* ``green``     x is in the argmax list (the binomial detector's indicator)

Nothing here materialises a (B, T, |V|) tensor: rows are processed in chunks.
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
    selector: fp32 (N, L) s; residual: fp32 (N, L) G[x] - m (None without ``with_null``).
    """

    llr: torch.Tensor
    centred: torch.Tensor
    discrete: torch.Tensor
    green: torch.Tensor
    selected: torch.Tensor
    selector: torch.Tensor
    residual: torch.Tensor | None


def token_stats(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    key: WatermarkKey,
    *,
    bias: torch.Tensor | None = None,
    head_is_watermarked: bool = True,
    with_null: bool = True,
    chunk: int = 512,
) -> TokenStats:
    """Compute per-token statistics.

    Args:
        hidden: (N, d) final hidden states whose next tokens are scored.
        targets: (N,) the next tokens.
        weight: (V, d) the model's lm_head weight, U~ (or U if ``head_is_watermarked`` is False).
        bias: optional (V,) lm_head bias (unchanged by the watermark).
        with_null: also compute m = G^T p_orig (one more |V| x L product per token), needed
            for the centred score, the discrete LLR's exact normaliser and the permutation test.
    """
    green_t = key.green_float.to(hidden.device).T.contiguous()  # (L, V)
    green = key.green_float.to(hidden.device)  # (V, L)
    parts = [
        _chunk_stats(
            hidden[i : i + chunk],
            targets[i : i + chunk],
            weight,
            bias,
            key,
            green,
            green_t,
            head_is_watermarked,
            with_null,
        )
        for i in range(0, len(hidden), chunk)
    ]
    if not parts:
        L = key.n_lists
        empty = torch.empty(0)
        return TokenStats(
            empty,
            empty,
            empty,
            empty.bool(),
            empty.long(),
            torch.empty(0, L),
            torch.empty(0, L) if with_null else None,
        )
    return TokenStats(
        *(
            torch.cat([getattr(p, f) for p in parts])
            for f in ("llr", "centred", "discrete", "green", "selected", "selector")
        ),
        residual=torch.cat([p.residual for p in parts]) if with_null else None,
    )


def _chunk_stats(h, x, weight, bias, key, green, green_t, head_is_watermarked, with_null) -> TokenStats:
    delta = key.delta
    s = key.selector_values(h)  # (n, L) fp32
    z = F.linear(h, weight, bias).float()  # model head: U~ h or U h
    w = (s @ green_t).mul_(delta)  # (n, V) watermark logits
    if head_is_watermarked:
        lse_wm = torch.logsumexp(z, -1)
        z.sub_(w)  # z is now the original logits
    else:
        w.add_(z)
        lse_wm = torch.logsumexp(w, -1)
    del w
    lse_orig = torch.logsumexp(z, -1)
    g_x = green[x]  # (n, L) membership of each scored token in every list
    w_x = delta * (s * g_x).sum(-1)
    llr = w_x - lse_wm + lse_orig
    selected = s.argmax(-1)
    is_green = g_x.gather(1, selected[:, None]).squeeze(1) > 0
    p_orig = z.sub_(lse_orig[:, None]).exp_()  # in place: original next-token probabilities
    if with_null:
        m = p_orig @ green  # (n, L) green mass of every list under the original model
        residual = g_x - m
        centred = delta * (s * residual).sum(-1)
        mass_sel = m.gather(1, selected[:, None]).squeeze(1)
    else:
        residual, centred = None, torch.full_like(llr, float("nan"))
        mass_sel = (p_orig * green_t[selected]).sum(-1)
    discrete = delta * is_green.float() - torch.log1p(math.expm1(delta) * mass_sel)
    return TokenStats(llr, centred, discrete, is_green, selected, s, residual)


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
    C = selector.double().T @ residual.double()  # (L, L)
    observed = delta * float(torch.diagonal(C).sum())
    rows = torch.arange(C.shape[0])
    null = delta * C[rows, perms].sum(-1)  # (K,)
    tolerance = 1e-9 * max(1.0, abs(observed))
    p = (1 + int((null >= observed - tolerance).sum())) / (len(perms) + 1)
    sd = float(null.std()) if len(null) > 1 else float("nan")
    z = (observed - float(null.mean())) / sd if sd > 0 else float("nan")
    return observed, p, z
