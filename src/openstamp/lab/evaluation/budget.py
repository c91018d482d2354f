"""The detection budget: how far a watermark's detection can go for what it costs the model.

A watermark moves the next-token distribution from p0 to pw (logits z -> z + d, d the watermark's
per-context logit change). Its per-token LLR is ``lambda_t = log pw(x_t | x_<t) - log p0(x_t | x_<t)``:

* on human text q, ``E[lambda] = -(H(q, pw) - H(q, p0)) = -c`` with ``c = log(1 + own_ppl_change)``
  nats per token: the mean LLR of human text is minus the cost, exactly, when the LLR is the model's
  full one and reads the tokens own perplexity reads;
* on text pw writes, ``E[lambda] = KL(pw || p0)``;
* to second order in d, ``KL(pw || p0) = KL(p0 || pw) = sigma^2 / 2`` with ``sigma^2 = Var_p0(d)``,
  and ``Var(lambda) = sigma^2`` under either model.

If human text is distributed as p0 predicts, ``c = sigma^2 / 2`` (averaged over contexts), and the
LLR summed over n independent tokens separates watermarked text from human text by ``n sigma^2 =
2 n c``, with standard deviation ``sqrt(n) sigma = sqrt(2 n c)`` on both sides. In standard
deviations, and as TPR at FPR alpha (z_a = Phi^-1(1 - alpha)):

    d* = sqrt(2 n c)                 TPR* = Phi(d* - z_a)

The LLR is the Neyman-Pearson test between pw and p0, so at cost c no detector of that change
separates better to this order: ``d*`` is the second-order ceiling. It is not a bound. Third-order
terms (a skewed d: a small green fraction with a large delta), human text that departs from p0, and
dependent tokens move it either way; ``benchmarks/frontier/detection_budget.py`` sets it beside measurements.

A measured TPR at FPR alpha reads as the binormal separation ``d' = Phi^-1(TPR) + z_a`` (equal
variances), and ``d' / d*`` is the detector's efficiency. For a detector whose score is a mean
per-token LLR, with human scores of mean ``-s`` and standard deviation ``sd_h`` and watermarked
scores of mean ``m_w``, the separation in human standard deviations ``(m_w + s) / sd_h`` over d*
factors exactly as

    sqrt(seen) * (1 + signal) / 2 / spread,
    seen = s / c,  signal = m_w / s,  spread = sd_h / sqrt(2 s / n),

each 1 at the ceiling: ``seen`` is the part of the cost the detector's LLR sees on human text (less
than 1 when the release changes the model in ways the score leaves out), ``signal`` the LLR of
generated text against that seen cost, and ``spread`` the human scores' spread against independent
tokens'.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import norm


def cost_nats(own_ppl_change: float) -> float:
    """The cost in nats per token: log(1 + own_ppl_change), the mean LLR deficit of human text."""
    return math.log1p(own_ppl_change)


def ceiling_separation(cost: float, tokens: float) -> float:
    """d* = sqrt(2 n c): the second-order ceiling's separation, in standard deviations, at ``cost`` nats per
    token over ``tokens`` scored tokens."""
    if cost < 0 or tokens < 0:
        raise ValueError(f"cost and tokens must be non-negative, got {cost} and {tokens}")
    return math.sqrt(2.0 * tokens * cost)


def ceiling_tpr(cost: float, tokens: float, fpr: float = 0.01) -> float:
    """TPR* = Phi(d* - z_a): the second-order ceiling's TPR at ``fpr``."""
    return float(norm.cdf(ceiling_separation(cost, tokens) - norm.isf(fpr)))


def separation(tpr: float, fpr: float = 0.01, n: int | None = None) -> float:
    """The binormal separation d' = Phi^-1(TPR) + z_a. With ``n`` texts, a TPR of 0 or 1 is read as 1 / (2 n)
    from that end (a floor or ceiling of what n texts resolve); without ``n`` it gives -inf or inf."""
    if n is not None:
        tpr = min(max(tpr, 0.5 / n), 1.0 - 0.5 / n)
    return float(norm.ppf(tpr) + norm.isf(fpr))


def cost_to_reach(tpr: float, tokens: float, fpr: float = 0.01, efficiency: float = 1.0) -> float:
    """The own perplexity change at which a detector of this ``efficiency`` (d' / d*) reaches ``tpr`` at
    ``fpr`` over ``tokens`` tokens: d* = d' / efficiency, c = d*^2 / (2 n), change = e^c - 1."""
    if not 0.0 < tpr < 1.0 or efficiency <= 0 or tokens <= 0:
        raise ValueError(f"need 0 < tpr < 1, efficiency > 0 and tokens > 0, got {tpr}, {efficiency}, {tokens}")
    d = max(separation(tpr, fpr), 0.0) / efficiency
    return math.expm1(d * d / (2.0 * tokens))


def tokens_to_reach(tpr: float, own_ppl_change: float, fpr: float = 0.01, efficiency: float = 1.0) -> float:
    """The scored tokens a detector of this ``efficiency`` needs to reach ``tpr`` at ``fpr`` at this cost:
    n = (d' / efficiency)^2 / (2 c)."""
    if not 0.0 < tpr < 1.0 or efficiency <= 0 or own_ppl_change <= 0:
        raise ValueError(
            f"need 0 < tpr < 1, efficiency > 0 and a positive cost, got {tpr}, {efficiency}, {own_ppl_change}"
        )
    d = max(separation(tpr, fpr), 0.0) / efficiency
    return d * d / (2.0 * cost_nats(own_ppl_change))


def llr_budget(human, watermarked, cost: float, tokens: float) -> dict:
    """Where a mean-LLR score's separation goes, from per-text scores (module docstring): ``seen``, ``signal``,
    ``spread``, their product ``efficiency`` and the separation ``z`` in human standard deviations, which
    equals efficiency * d*. None where the LLR sees no cost (human mean at or above 0) or ``cost`` is not
    positive."""
    h = np.asarray(human, dtype=np.float64)
    w = np.asarray(watermarked, dtype=np.float64)
    seen_cost, sd = -float(h.mean()), float(h.std())
    z = (float(w.mean()) + seen_cost) / sd
    if seen_cost <= 0 or cost <= 0:
        return {"seen": None, "signal": None, "spread": None, "efficiency": None, "z": z}
    seen = seen_cost / cost
    signal = float(w.mean()) / seen_cost
    spread = sd / math.sqrt(2.0 * seen_cost / tokens)
    return {
        "seen": seen,
        "signal": signal,
        "spread": spread,
        "efficiency": math.sqrt(seen) * (1.0 + signal) / 2.0 / spread,
        "z": z,
    }
