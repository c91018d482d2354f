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


def test_the_consistency_penalty_at_mu_0_is_the_plain_ridge_and_otherwise_its_closed_form():
    z, labels = blobs()
    dz = torch.randn(40, 8, generator=torch.Generator().manual_seed(2))
    plain = ridge(z, labels, 5, lam=1e-3)
    torch.testing.assert_close(ridge(z, labels, 5, lam=1e-3, dz=dz, mu=0.0), plain, rtol=0, atol=0)
    x, d = z.double(), dz.double()
    y = torch.nn.functional.one_hot(labels, 5).double()
    reference = y.T @ x @ torch.linalg.inv(x.T @ x + 1e-3 * torch.eye(8, dtype=x.dtype) + 7.0 * d.T @ d)
    torch.testing.assert_close(ridge(z, labels, 5, lam=1e-3, dz=dz, mu=7.0).double(), reference, rtol=1e-4, atol=1e-5)


def test_the_consistency_penalty_recovers_a_selector_that_ignores_the_context_direction():
    """States carry a stable part (what S should read) and a context part that a cut window changes; the labels
    follow both in training, so the plain ridge leans on the context part. With the state differences along that
    part, the penalised S recovers the known, context-free selector."""
    g = torch.Generator().manual_seed(0)
    n, d = 3000, 6
    stable = torch.randn(n, d - 1, generator=g)
    known = torch.randn(3, d - 1, generator=g)
    labels = (stable @ known.T).argmax(-1)
    context = (labels == 0).double() * 2.0 + 0.3 * torch.randn(n, generator=g, dtype=torch.float64)
    z = torch.cat([stable.double(), context[:, None]], dim=1).float()
    dz = torch.zeros(500, d)
    dz[:, -1] = torch.randn(500, generator=g)  # cutting the window moves the context part only
    plain = ridge(z, labels, 3, lam=1e-3)
    penalised = ridge(z, labels, 3, lam=1e-3, dz=dz, mu=1e4)
    assert plain[:, -1].abs().max() > 0.1  # the plain fit reads the context part
    assert penalised[:, -1].abs().max() < 1e-3  # the penalised one does not
    reference = ridge(z[:, :-1], labels, 3, lam=1e-3)  # the best selector on the stable part alone
    torch.testing.assert_close(penalised[:, :-1], reference, rtol=0, atol=1e-3)


def test_fit_selector_reports_its_consistency_weight():
    z, labels = blobs()
    cfg = SelectorConfig(n_lists=5, min_cluster_size=5, consistency=2.0)
    dz = torch.randn(30, 8, generator=torch.Generator().manual_seed(3))
    S, stats = fit_selector(z, z[:20], cfg, dz=dz)
    assert stats["consistency_mu"] == pytest.approx(2.0 * len(z) / 30)
    _, plain = fit_selector(z, z[:20], dataclasses.replace(cfg, consistency=0.0), dz=dz)
    assert plain["consistency_mu"] == 0.0
