import dataclasses

import pytest
import torch
from sklearn.linear_model import Ridge

from openstamp.config import SelectorConfig
from openstamp.key.selector import cluster, fit_selector, rescale_rows, ridge


def blobs(n_per=60, k=5, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(k, d, generator=g) * 4
    z = torch.cat([centers[i] + torch.randn(n_per, d, generator=g) for i in range(k)])
    return z, torch.arange(k).repeat_interleave(n_per)


def test_ridge_matches_scikit_learn():
    z, labels = blobs()
    S = ridge(z, labels, 5, lam=1e-3)
    y = torch.nn.functional.one_hot(labels, 5).double().numpy()
    reference = Ridge(alpha=1e-3, fit_intercept=False).fit(z.double().numpy(), y).coef_
    torch.testing.assert_close(S.double(), torch.from_numpy(reference), rtol=1e-4, atol=1e-5)


def test_rescaled_rows_average_one_on_their_cluster():
    z, labels = blobs()
    S, factors = rescale_rows(ridge(z, labels, 5, 1e-3), z, labels)
    own = (z @ S.T)[torch.arange(len(z)), labels]
    for c in range(5):
        assert abs(float(own[labels == c].mean()) - 1.0) < 1e-4
    assert (factors > 0).all()


def test_fit_selector_drops_small_clusters_and_reports():
    z, _ = blobs(n_per=80, k=4)
    lonely = torch.full((3, 8), 50.0) + torch.randn(3, 8)  # a far-away cluster of 3 states
    cfg = SelectorConfig(n_lists=5, min_cluster_size=10, seed=0)
    S, stats = fit_selector(torch.cat([z, lonely]), z[::7], cfg)
    assert S.shape == (4, 8)
    assert stats["n_lists"] == 4 and stats["n_dropped_clusters"] == 1
    assert stats["train_accuracy"] > 0.95 and stats["heldout_accuracy"] > 0.9


def test_fit_selector_is_seeded():
    z, _ = blobs()
    cfg = SelectorConfig(n_lists=5, min_cluster_size=5, seed=3)
    a, _ = fit_selector(z, z[:10], cfg)
    b, _ = fit_selector(z, z[:10], cfg)
    assert torch.equal(a, b)


def test_shrinkage_sets_the_ridge_penalty_from_the_mean_diagonal_and_zero_keeps_the_floor():
    z, _ = blobs()
    base = SelectorConfig(n_lists=5, min_cluster_size=5, seed=3)
    S0, stats0 = fit_selector(z, z[:10], base)
    assert stats0["ridge_lambda"] == base.ridge_lambda  # f = 0: the fixed penalty, as before the option
    S4, stats4 = fit_selector(z, z[:10], dataclasses.replace(base, shrinkage=4.0))
    assert stats4["ridge_lambda"] == pytest.approx(4.0 * float((z.double() ** 2).sum()) / z.shape[1])
    # same clusters, same fit otherwise: only the penalty differs, and it shrinks the rows before rescaling
    labels = cluster(z, base).labels
    lam = stats4["ridge_lambda"]
    expected, _ = rescale_rows(ridge(z, labels, 5, lam), z, labels)
    torch.testing.assert_close(S4, expected)
    assert not torch.allclose(S0, S4)


def test_negative_shrinkage_is_refused():
    with pytest.raises(ValueError, match="shrinkage"):
        SelectorConfig(shrinkage=-1.0)
