"""A tail p-value for the centred statistic, below the permutation test's floor: pure tensor code.

With the exact m (``llr.py``), the centred statistic of one text is linear in the green lists:

    T = delta * sum_t s_t . (G[x_t] - sum_v p_t(v) G[v])  =  delta * sum_{v in E, l} G[v, l] c[v, l]

    c[v, l] = A[l, v] - B[l, v],   A[l, v] = sum_{t: x_t = v} s_t[l],   B[l, v] = sum_t s_t[l] p_t(v)

where p_t is the original model's next-token distribution, s_t = S P h_t the selector values and E
the tokens that can be green (not special, not padding). The coefficients c depend on the text,
S, P and the original model only, never on the secret.

**Null hypothesis.** The text was written without knowledge of the key. The secret is drawn
uniformly, and the PRF makes every G[v, l] (v in E) an independent Bernoulli(gamma) variable
(the same model of the key under which the permutation test is exact). Then

    E T = delta * gamma * sum_{v in E, l} c[v, l] = delta * gamma * sum_t (sum_l s_t[l]) (1[x_t in E] - p_t(E))

and T - E T is a sum of independent, bounded, centred terms delta (G[v, l] - gamma) c[v, l].

**The bound (Chernoff).** For every lambda >= 0, P(T - E T >= u) <= exp(-lambda u + log E e^{lambda (T - ET)}).
The log moment generating function is split in two exact-or-larger parts:

* the tokens the text contains (Q, at most L x len(text) terms) enter exactly through the
  Bernoulli log-MGF  psi(a) = log(1 - gamma + gamma e^a) - gamma a,  a = lambda delta c;
* every other token (c = -B there) enters through Bennett's bound for a centred variable with
  variance sigma^2 that is at most b: log E e^{lambda X} <= sigma^2 (e^{lambda b} - 1 - lambda b) / b^2,
  with the sum of variances delta^2 gamma (1 - gamma) sum_{v not in Q} ||B[:, v]||^2 (exact, from
  ||B||_F^2 accumulated over the vocabulary) and b = delta max(gamma, 1 - gamma) max_{v not in Q, l} |B[l, v]|.

The bound is minimised over lambda (the function is convex). It is valid for any text under the
null above, at every level, so it needs no Monte-Carlo and reaches 1e-12 and below when the text
supports it. It is conservative: the Monte-Carlo tail over random keys is never above it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import minimize_scalar

from openstamp.key.key import WatermarkKey

P_FLOOR = 1e-12  # smallest p-value reported; smaller bounds are rounded up to it


@dataclass
class TailTerms:
    """What the Chernoff bound needs from one text.

    deviation: T - E T; coefficients: fp64 (U, L) c[v, l] of the U green-eligible tokens the
    text contains; rest_sumsq: sum of c^2 over all other eligible tokens; rest_max: max |c| there.
    """

    deviation: float
    coefficients: torch.Tensor
    rest_sumsq: float
    rest_max: float


@torch.inference_mode()
def tail_terms(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    key: WatermarkKey,
    selector: torch.Tensor,
    lse_orig: torch.Tensor,
    statistic: float,
    *,
    bias: torch.Tensor | None = None,
    head_is_watermarked: bool = True,
    block: int = 4096,
) -> TailTerms:
    """One pass over the vocabulary for one text.

    Args:
        hidden: (T, d) hidden states before the scored tokens; targets: (T,) the tokens.
        weight: (V, d) lm_head weight (U~, or U if ``head_is_watermarked`` is False).
        selector: (T, L) s; lse_orig: (T,) log-sum-exp of the original logits.
        statistic: the observed centred statistic T (with the exact m).
    """
    device = hidden.device
    green_t = key.green_float.to(device).T  # (L, V)
    never = torch.tensor(key.never_green, dtype=torch.long, device=device)
    eligible = torch.ones(key.vocab_size, dtype=torch.bool, device=device)
    eligible[never] = False
    s = selector.to(device).float()
    lse = lse_orig.to(device)[:, None]
    tokens = torch.unique(targets[eligible[targets]])  # Q: the eligible tokens of the text
    in_text = torch.zeros(key.vocab_size, dtype=torch.bool, device=device)
    in_text[tokens] = True
    b_text = torch.zeros(s.shape[1], len(tokens), dtype=torch.float64, device=device)
    rest_sumsq, rest_max = 0.0, 0.0
    mass = torch.zeros(len(hidden), dtype=torch.float64, device=device)  # p_t(E)
    for b in range(0, weight.shape[0], block):
        z = F.linear(hidden, weight[b : b + block], None if bias is None else bias[b : b + block]).float()
        if head_is_watermarked:
            z.addmm_(s, green_t[:, b : b + block], alpha=-key.delta)
        p = z.sub_(lse).exp_()  # the original probabilities, in place
        p[:, never[(never >= b) & (never < b + block)] - b] = 0.0  # only the eligible tokens
        mass += p.sum(-1, dtype=torch.float64)
        part = s.T @ p  # (L, block): B restricted to this block
        here = in_text[b : b + block]
        if here.any():
            columns = torch.searchsorted(tokens, torch.nonzero(here).flatten() + b)
            b_text[:, columns] = part[:, here].double()
            part[:, here] = 0.0
        if part.numel():  # every other token: the sum of squares and the largest |c|
            rest_sumsq += float(part.square().sum(dtype=torch.float64))
            low, high = torch.aminmax(part)
            rest_max = max(rest_max, -float(low), float(high))
    a_text = torch.zeros_like(b_text)
    is_eligible = eligible[targets]
    a_text.index_add_(1, torch.searchsorted(tokens, targets[is_eligible]), s[is_eligible].double().T)
    coefficients = (a_text - b_text).T  # (U, L)
    weights = s.double().sum(-1)
    mean = key.delta * key.gamma * float((weights * (is_eligible.double() - mass)).sum())
    return TailTerms(statistic - mean, coefficients.cpu(), rest_sumsq, rest_max)


def chernoff_pvalue(terms: TailTerms, delta: float, gamma: float) -> float:
    """min over lambda >= 0 of exp(-lambda u + log-MGF bound), u = T - E T; 1 when u <= 0."""
    u = terms.deviation
    if not u > 0:
        return 1.0
    c = terms.coefficients.double().numpy().ravel() * delta
    variance = delta**2 * gamma * (1 - gamma) * terms.rest_sumsq
    b = delta * max(gamma, 1 - gamma) * terms.rest_max
    log_gamma, log_rest = math.log(gamma), math.log1p(-gamma)

    def log_bound(lam: float) -> float:
        exact = np.logaddexp(log_rest, log_gamma + lam * c) - gamma * lam * c
        if b > 0:
            x = lam * b
            bennett = variance * (math.expm1(x) - x) / b**2 if x < 700 else math.inf
        else:
            bennett = variance * lam**2 / 2
        return -lam * u + float(exact.sum()) + bennett

    scale = max(float(np.abs(c).max(initial=0.0)), b, 1e-12)
    result = minimize_scalar(log_bound, bounds=(0.0, 50.0 / scale), method="bounded", options={"xatol": 1e-6 / scale})
    return float(min(1.0, math.exp(min(result.fun, 0.0))))


def combined_pvalue(p_permutation: float, n_permutations: int, p_tail: float | None) -> float:
    """The permutation p-value, refined by the tail bound only where it sits at its floor 1/(K+1).

    Valid at every level alpha: for alpha >= 1/(K+1) the decision p <= alpha is the permutation
    test's; below the floor it needs the tail bound's p <= alpha, which is itself valid.
    """
    floor = 1.0 / (n_permutations + 1)
    if p_tail is None or p_permutation > floor:
        return p_permutation
    return max(min(p_permutation, p_tail), P_FLOOR)


@dataclass
class TailSums:
    """``tail_terms`` of a set of texts, accumulated batch by batch (the pooled statistic's bound).

    T of a set of texts is the sum of theirs, and so are c = A - B and E T; only the split of the
    vocabulary into the tokens the set contains (exact part) and the rest (Bennett) is the set's.
    coefficients: fp64 (L, V) c, the one dense array (L x V x 8 bytes); in_text: bool (V,) Q;
    mean: E T so far.
    """

    coefficients: torch.Tensor
    in_text: torch.Tensor
    mean: float = 0.0

    @classmethod
    def empty(cls, key: WatermarkKey) -> TailSums:
        L, V = key.n_lists, key.vocab_size
        return cls(torch.zeros(L, V, dtype=torch.float64), torch.zeros(V, dtype=torch.bool))

    @torch.inference_mode()
    def add(self, hidden, targets, weight, key, selector, lse_orig, *, bias=None, head_is_watermarked=True,
            block: int = 4096) -> None:  # fmt: skip
        """Add N scored tokens: hidden (N, d), targets (N,), selector (N, L) s, lse_orig (N,) (as ``tail_terms``)."""
        device = hidden.device
        green_t = key.green_float.to(device).T
        never = torch.tensor(key.never_green, dtype=torch.long, device=device)
        eligible = torch.ones(key.vocab_size, dtype=torch.bool, device=device)
        eligible[never] = False
        s, lse = selector.to(device).float(), lse_orig.to(device)[:, None]
        mass = torch.zeros(len(hidden), dtype=torch.float64, device=device)  # p_t(E)
        for b in range(0, weight.shape[0], block):
            z = F.linear(hidden, weight[b : b + block], None if bias is None else bias[b : b + block]).float()
            if head_is_watermarked:
                z.addmm_(s, green_t[:, b : b + block], alpha=-key.delta)
            p = z.sub_(lse).exp_()
            p[:, never[(never >= b) & (never < b + block)] - b] = 0.0
            mass += p.sum(-1, dtype=torch.float64)
            self.coefficients[:, b : b + block] -= (s.T @ p).double().cpu()  # B
        is_eligible = eligible[targets]
        self.coefficients.index_add_(1, targets[is_eligible].cpu(), s[is_eligible].double().T.cpu())  # A
        self.in_text[targets[is_eligible].cpu()] = True
        weights = s.double().sum(-1)
        self.mean += key.delta * key.gamma * float((weights * (is_eligible.double() - mass)).sum())

    def merge_(self, other: TailSums) -> TailSums:
        """Add ``other``'s sums in place (T of two disjoint sets of tokens is the sum of theirs); returns self."""
        self.coefficients += other.coefficients
        self.in_text |= other.in_text
        self.mean += other.mean
        return self

    def terms(self, statistic: float) -> TailTerms:
        """The bound's terms for the accumulated set, whose centred statistic is ``statistic``."""
        rest = self.coefficients[:, ~self.in_text]
        rest_max = float(rest.abs().max()) if rest.numel() else 0.0
        coefficients = self.coefficients[:, self.in_text].T.contiguous()
        return TailTerms(statistic - self.mean, coefficients, float(rest.square().sum()), rest_max)
