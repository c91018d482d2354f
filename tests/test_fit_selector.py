"""A selector fitted for detection per unit of cost, on synthetic states."""

import pytest
import torch

from openstamp.key.selector import rescale_rows, ridge
from openstamp.lab.analysis.fit_selector import Objective, fit_for_detection

N, D, V, L = 800, 24, 300, 8


@pytest.fixture(scope="module")
def problem():
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
    return Objective.build(states, states @ head.T, green, delta=0.5), S0


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
