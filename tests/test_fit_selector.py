"""A selector fitted for detection per unit of cost, on synthetic states."""

import pytest
import torch

from openstamp.detect.llr import cross_pvalue
from openstamp.key.selector import rescale_rows, ridge
from openstamp.lab.analysis.fit_selector import Objective, fit_for_detection

N, D, V, L = 800, 24, 300, 8


@pytest.fixture(scope="module")
def model():
    """Anisotropic states, a head whose distributions are peaked, centred green lists, and the ridge selector
    fitted to the states' nearest of L centres (as the key's k-means labels)."""
    gen = torch.Generator().manual_seed(0)
    states = torch.randn(N, D, generator=gen) * torch.linspace(2.0, 0.2, D)
    head = torch.randn(V, D, generator=gen) * 0.6
    green = (torch.rand(V, L, generator=gen) < 0.25).float()
    green -= green.mean(0)
    centres = states[torch.randperm(N, generator=gen)[:L]]
    labels = torch.cdist(states, centres).argmin(1)
    S0, _ = rescale_rows(ridge(states, labels, L, lam=float((states**2).sum()) / D), states, labels)
    return states, states @ head.T, green, S0


@pytest.fixture(scope="module")
def problem(model):
    states, logits, green, S0 = model
    return Objective.build(states, logits, green, delta=0.5), S0


def test_forms_are_the_variance_and_the_norm_of_the_logit_change(problem):
    objective, S0 = problem
    states, gen = objective.states[:50], torch.Generator().manual_seed(1)
    head = torch.randn(V, D, generator=gen, dtype=torch.float64)
    green = torch.randn(V, L, generator=gen, dtype=torch.float64)
    small = Objective.build(states, states @ head.T, green, delta=0.5)
    dz = 0.5 * (states @ S0.double().T) @ green.T  # (50, V)
    p = torch.softmax(states @ head.T, -1)
    variance = (p * dz**2).sum(-1) - (p * dz).sum(-1) ** 2
    torch.testing.assert_close(small.separation(S0), variance.mean())
    torch.testing.assert_close(small.cost(S0), (dz**2).mean())


def test_fitted_selector_separates_more_than_the_ridge_at_its_cost(problem):
    objective, S0 = problem
    S, stats = fit_for_detection(objective, S0)
    assert float(objective.cost(S)) == pytest.approx(float(objective.cost(S0)), rel=1e-5)
    assert stats["separation_fitted"] > 1.1 * stats["separation_ridge"]
    assert float(objective.separation(S)) == pytest.approx(stats["separation_fitted"], rel=1e-5)
    assert stats["cosine"] > 0.8  # near the ridge's selections, not a new key
    again, _ = fit_for_detection(objective, S0, steps=0)
    torch.testing.assert_close(again, S0)  # no steps: the ridge itself
    loose, loose_stats = fit_for_detection(objective, S0, rho=0.0)
    assert loose_stats["separation_fitted"] >= stats["separation_fitted"] * 0.99  # the anchor costs separation


def test_fitted_selector_costs_own_perplexity_in_proportion(model, problem):
    """At the ridge's proxy cost the fitted S separates about 25% more, but on text the model fits the
    own-perplexity cost, KL(p || p_wm), rises by the same ratio: to second order both it and the watermarked
    text's mean LLR, KL(p_wm || p), are delta^2 Var_p(dz) / 2, whatever S. Per unit of that cost it gains nothing."""
    states, logits, green, S0 = model
    objective, _ = problem
    S, stats = fit_for_detection(objective, S0)

    def cost_and_signal(selector):
        dz = objective.delta * (states.double() @ selector.double().T) @ green.double().T
        p, q = torch.log_softmax(logits.double(), -1), torch.log_softmax(logits.double() + dz, -1)
        return float((p.exp() * (p - q)).sum(-1).mean()), float((q.exp() * (q - p)).sum(-1).mean())

    (cost0, signal0), (cost1, signal1) = cost_and_signal(S0), cost_and_signal(S)
    gain = stats["separation_fitted"] / stats["separation_ridge"]
    assert gain > 1.1
    assert cost1 / cost0 == pytest.approx(gain, rel=0.05)
    assert signal1 / cost1 == pytest.approx(signal0 / cost0, rel=0.05)


def test_selector_fitted_to_its_lists_breaks_the_permutation_null(model):
    """The permutation test compares T = delta tr(C) with T_pi = delta sum_l C[l, pi(l)]. On the original model's
    own samples T's variance is delta^2 sum_t a_t^T M_t a_t: the separation that the fit raises for the lists it was
    fitted to, and not for the re-mapped ones. So T spreads wider than its permutations and p-values come out too
    small; the ridge S, which never sees G, keeps the rate (over keys). A fitted S needs a null that refits S for
    every random key."""
    states, logits, _, S0 = model
    p = torch.softmax(logits.double(), -1)
    gen = torch.Generator().manual_seed(7)
    spread, flagged = {"ridge": [], "fitted": []}, {"ridge": 0, "fitted": 0}
    texts, tokens, n_keys, alpha = 400, 16, 6, 0.05
    for _ in range(n_keys):  # fresh keys: new green lists, each with its own fitted S
        green = (torch.rand(V, L, generator=gen, dtype=torch.float64) < 0.25).double()
        objective = Objective.build(states, logits, green - green.mean(0), delta=0.5)
        selectors = {"ridge": S0, "fitted": fit_for_detection(objective, S0)[0]}
        perms = torch.stack([torch.randperm(L, generator=gen) for _ in range(199)])
        at = torch.randint(0, N, (texts, tokens), generator=gen)
        x = torch.multinomial(p[at.flatten()], 1, generator=gen).view(texts, tokens)
        residual = green[x] - p[at] @ green  # G[x] - m: mean zero on the model's own samples
        for name, S in selectors.items():
            remapped = [float(objective.separation(S[pi.argsort()])) for pi in perms[:50]]
            spread[name].append(float(objective.separation(S)) / (sum(remapped) / len(remapped)))
            C = torch.einsum("ntk,ntl->nkl", states[at].double() @ S.double().T, residual)
            flagged[name] += sum(cross_pvalue(c, perms, 0.5)[1] <= alpha for c in C)
    ridge, fitted = (sum(spread[k]) / n_keys for k in ("ridge", "fitted"))
    assert ridge == pytest.approx(1.0, abs=0.1)  # exact on average over keys
    assert fitted > 1.1 and min(spread["fitted"]) > 1.0  # every fitted key spreads wider than its re-mappings
    assert flagged["ridge"] / (texts * n_keys) < alpha + 0.01  # the same texts, the ridge's selector
    assert flagged["fitted"] > 1.2 * flagged["ridge"]
