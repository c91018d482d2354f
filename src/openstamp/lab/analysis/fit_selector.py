"""A selector fitted for detection per unit of cost: S optimised directly, from the ridge solution.

The key's logit change at a state h (projected, P applied) is ``dz(h) = delta G S h`` over the vocabulary, with
G (|V|, L) the centred green lists and S (L, d) the selector. On N states of the model's own samples, with
next-token distributions p_i:

    separation(S) = mean_i Var_{p_i}(dz(h_i))        the expected per-token LLR of the watermarked model's text
                                                     minus that of text p fits (KL(pw || p) + KL(p || pw), second
                                                     order): what a mean-LLR detector separates on
    cost(S)       = mean_i ||dz(h_i)||^2 / |V|       the cost proxy, E_h[||dW h||^2] per vocabulary row

The ridge selector (``openstamp.key.selector``) is fitted to pick each state's k-means cluster, not to separate.
``fit_for_detection`` maximises, by Adam from S0 = the ridge solution,

    J(S) = log separation(S) - log cost(S) - rho ||S - S0||_F^2 / ||S0||_F^2

(the first two terms: separation per unit of cost, scale-free; the last keeps S near the ridge's selections, so
the key still varies its green lists with the context) and rescales the result to S0's cost. Both terms are
quadratic in A = S h, with ``M_i = Cov_{p_i}(G)`` (L, L) the covariance of the green memberships under p_i:
separation = delta^2 mean_i a_i^T M_i a_i and cost = delta^2 mean_i a_i^T (G^T G / |V|) a_i.

What it can gain: the proxy weighs a logit change on every token alike, the separation only where p puts mass, so
at one proxy cost S moves towards contexts and lists whose change lands on likely tokens. The second-order
own-perplexity cost on text the model fits is separation / 2 whatever S, so a gain per unit of the proxy is a gain
per unit of own perplexity only where human text and the unseen parts of the cost (a tied model's input side)
depart from that; the frontier protocol measures it. Synthetic states here; on a model, N L^2 floats of M_i (chunk
the states) and p from the original head.

What it breaks: the permutation p-value (``openstamp.detect.llr.cross_pvalue``) is exact because the ridge S never
sees G, so re-mapping which list each cluster selects gives keys as likely as the real one. On text the model writes
without the key, T = delta tr(C) has variance delta^2 sum_t a_t^T M_t a_t: the separation, which the fit raises for
the lists it was fitted to and not for their re-mappings. So T spreads wider than its permutations and small
p-values come too often (tests/test_fit_selector.py). A fitted S needs a null that refits S for every random key,
and by the paragraph above, on text the model fits, it gains nothing per unit of own perplexity to pay for one.
On human text the cost has a first-order part: a token's NLL rises by about Var_p(dz) / 2 minus its centred score
dz_x - E_p[dz] (``openstamp.detect.llr``'s ``centred``), so an S that costs less own perplexity on human text does it
by scoring human text higher, which is what the detector counts as false positives.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Objective:
    """The quadratic forms of separation and cost, for one set of states.

    Attributes:
        states: (N, d) hidden states h_i.
        cov: (N, L, L) covariance of the green memberships under each state's next-token distribution.
        gram: (L, L) G^T G / |V|.
        delta: the key's strength.
    """

    states: torch.Tensor
    cov: torch.Tensor
    gram: torch.Tensor
    delta: float

    @classmethod
    def build(cls, states: torch.Tensor, logits: torch.Tensor, green: torch.Tensor, delta: float) -> Objective:
        """states (N, d); logits (N, |V|) the original model's at those states; green (|V|, L) centred lists."""
        p, g = torch.softmax(logits.double(), -1), green.double()
        mean = p @ g  # (N, L)
        cov = torch.einsum("nv,vk,vl->nkl", p, g, g) - mean[:, :, None] * mean[:, None, :]
        return cls(states.double(), cov, g.T @ g / len(g), delta)

    def separation(self, S: torch.Tensor) -> torch.Tensor:
        """mean_i Var_{p_i}(dz(h_i)) for S (L, d)."""
        a = self.states @ S.double().T  # (N, L)
        return self.delta**2 * ((a[:, None, :] @ self.cov).squeeze(1) * a).sum(-1).mean()

    def cost(self, S: torch.Tensor) -> torch.Tensor:
        """mean_i ||dz(h_i)||^2 / |V| for S (L, d)."""
        a = self.states @ S.double().T
        return self.delta**2 * ((a @ self.gram) * a).sum(-1).mean()


def fit_for_detection(
    objective: Objective, S0: torch.Tensor, rho: float = 1.0, steps: int = 300, lr: float = 0.01
) -> tuple[torch.Tensor, dict]:
    """Maximise J(S) (module docstring) from ``S0`` (L, d), then rescale to ``S0``'s cost.

    Returns:
        S (L, d) float32 at the ridge's cost, and the separation, cost and separation per cost before and after.
    """
    if rho < 0 or steps < 0 or lr <= 0:
        raise ValueError(f"need rho >= 0, steps >= 0 and lr > 0, got {rho}, {steps}, {lr}")
    start = S0.double()
    norm = (start**2).sum()
    S = start.clone().requires_grad_(True)
    optimiser = torch.optim.Adam([S], lr=lr * float(start.abs().mean()))
    for _ in range(steps):
        optimiser.zero_grad()
        loss = -(objective.separation(S).log() - objective.cost(S).log()) + rho * ((S - start) ** 2).sum() / norm
        loss.backward()
        optimiser.step()
    S = S.detach()
    with torch.no_grad():
        S = S * (objective.cost(start) / objective.cost(S)).sqrt()
        before, after = (float(objective.separation(s)) for s in (start, S))
        cost = float(objective.cost(start))
    stats = {
        "cost": cost,
        "separation_ridge": before,
        "separation_fitted": after,
        "per_cost_ridge": before / cost,
        "per_cost_fitted": after / cost,
        "cosine": float((S * start).sum() / ((S**2).sum() * norm).sqrt()),  # 1: the ridge's direction
    }
    return S.float(), stats
