"""The detection budget's formulas against a float64 simulation of a logit watermark."""

import math

import numpy as np
import pytest

from openstamp.detect.rates import threshold_at_fpr
from openstamp.lab.evaluation.budget import (
    ceiling_separation,
    ceiling_tpr,
    cost_nats,
    cost_to_reach,
    llr_budget,
    separation,
    tokens_to_reach,
)


def contexts(n: int, vocab: int, delta: float, gamma: float, seed: int):
    """``n`` next-token distributions p0 (Dirichlet) and their watermarked pw = p0 e^d / Z, d = delta * green."""
    rng = np.random.default_rng(seed)
    p0 = rng.dirichlet(np.full(vocab, 0.3), size=n)
    d = delta * (rng.random((n, vocab)) < gamma)
    pw = p0 * np.exp(d)
    pw /= pw.sum(axis=1, keepdims=True)
    return p0, pw, d


def test_second_order_identities():
    """KL(pw || p0), KL(p0 || pw) and Var_p0(d) / 2 agree to second order in delta."""
    p0, pw, d = contexts(400, 64, 0.05, 0.25, seed=0)
    kl_w0 = np.sum(pw * np.log(pw / p0), axis=1).mean()
    kl_0w = np.sum(p0 * np.log(p0 / pw), axis=1).mean()
    half_var = 0.5 * (np.sum(p0 * d * d, axis=1) - np.sum(p0 * d, axis=1) ** 2).mean()
    assert kl_w0 == pytest.approx(half_var, rel=0.05)
    assert kl_0w == pytest.approx(half_var, rel=0.05)


def simulated_scores(p0, pw, texts: int, tokens: int, seed: int):
    """Mean per-token LLR of texts sampled from p0 (human text that p0 fits) and from pw, each token from a random
    context."""
    rng = np.random.default_rng(seed)
    llr = np.log(pw) - np.log(p0)
    out = []
    for p in (p0, pw):
        ctx = rng.integers(0, len(p0), size=(texts, tokens))
        cdf = np.cumsum(p[ctx], axis=-1)
        x = np.minimum((cdf < rng.random((texts, tokens, 1))).sum(axis=-1), p0.shape[1] - 1)
        out.append(llr[ctx, x].mean(axis=1))
    return out


def test_ceiling_matches_simulated_llr():
    """Where human text is p0's and tokens are independent, the LLR's TPR at 1% FPR and its budget sit on the
    ceiling, up to the simulation's error and the third-order excess of a skewed change: a green fraction of 0.25
    gives watermarked text a little more LLR than the cost (signal above 1) and a tighter spread."""
    p0, pw, _ = contexts(500, 64, 0.8, 0.25, seed=1)
    tokens = 64
    cost = float(np.sum(p0 * np.log(p0 / pw), axis=1).mean())  # E_p0[-LLR]: own perplexity's log change
    human, marked = simulated_scores(p0, pw, texts=4000, tokens=tokens, seed=2)
    tpr = float(np.mean(marked > threshold_at_fpr(human, 0.01)))
    assert 0.2 < ceiling_tpr(cost, tokens) < 0.95  # a point where the ceiling is not saturated
    assert tpr == pytest.approx(ceiling_tpr(cost, tokens), abs=0.06)
    budget = llr_budget(human, marked, cost, tokens)
    assert budget["seen"] == pytest.approx(1.0, abs=0.02)
    assert 1.0 < budget["signal"] < 1.15
    assert 0.9 < budget["spread"] < 1.0
    assert 1.0 < budget["efficiency"] < 1.15


def test_budget_factors_multiply_to_the_separation():
    rng = np.random.default_rng(3)
    human, marked = rng.normal(-0.08, 0.06, 300), rng.normal(0.05, 0.05, 300)
    b = llr_budget(human, marked, cost=0.12, tokens=64)
    assert b["efficiency"] * ceiling_separation(0.12, 64) == pytest.approx(b["z"], rel=1e-12)
    assert b["seen"] == pytest.approx(-human.mean() / 0.12, rel=1e-12)
    assert llr_budget(-human, marked, cost=0.12, tokens=64)["seen"] is None  # human text above 0: no cost seen


def test_cost_to_reach_inverts_the_ceiling():
    for tpr, tokens in ((0.95, 64), (0.5, 16), (0.99, 200)):
        change = cost_to_reach(tpr, tokens)
        assert ceiling_tpr(cost_nats(change), tokens) == pytest.approx(tpr, abs=1e-9)
    assert cost_to_reach(0.95, 64, efficiency=0.5) > cost_to_reach(0.95, 64)
    tokens = tokens_to_reach(0.95, 0.10)
    assert ceiling_tpr(cost_nats(0.10), tokens) == pytest.approx(0.95, abs=1e-9)
    assert tokens_to_reach(0.95, 0.10, efficiency=0.5) == pytest.approx(4 * tokens)
    with pytest.raises(ValueError):
        cost_to_reach(1.0, 64)


def test_separation_reads_saturated_rates_at_the_resolution():
    assert separation(0.5) == pytest.approx(2.3263478740408408)
    assert separation(1.0) == math.inf
    assert separation(1.0, n=200) == pytest.approx(separation(1 - 1 / 400))
    assert separation(0.0, n=200) == pytest.approx(separation(1 / 400))
    with pytest.raises(ValueError):
        ceiling_separation(-0.1, 64)
