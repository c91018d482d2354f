import pytest
import torch
from sklearn.cluster import KMeans
from sklearn.metrics import adjusted_rand_score

from openstamp.config import SelectorConfig
from openstamp.key.kmeans import assign, kmeans, kmeans_streamed
from openstamp.key.selector import fit_selector


def blobs(n_per=200, k=6, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(k, d, generator=g) * 5
    z = torch.cat([centres[i] + torch.randn(n_per, d, generator=g) for i in range(k)])
    return z, torch.arange(k).repeat_interleave(n_per)


def inertia(z, centroids):
    return float(((z - centroids[assign(z, centroids)]) ** 2).sum())


def test_torch_kmeans_recovers_separated_clusters():
    z, truth = blobs()
    centroids, labels, rounds = kmeans(z, 6, seed=1)
    assert adjusted_rand_score(truth.numpy(), labels.numpy()) == pytest.approx(1.0)
    assert torch.equal(labels, assign(z, centroids)) and 1 <= rounds <= 100


def test_torch_kmeans_inertia_close_to_scikit_learn():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(3000, 24, generator=g)  # no true clusters: the hard case for Lloyd
    centroids, _, _ = kmeans(z, 20, seed=0)
    reference = KMeans(n_clusters=20, random_state=0, n_init=1).fit(z.numpy())
    assert inertia(z, centroids) <= 1.02 * reference.inertia_


def test_torch_kmeans_is_seeded_and_handles_duplicates():
    z, _ = blobs(n_per=50, k=3, d=4)
    a, b = kmeans(z, 5, seed=2)[0], kmeans(z, 5, seed=2)[0]
    assert torch.equal(a, b)
    repeated = torch.ones(30, 4)  # fewer distinct states than clusters
    centroids, labels, _ = kmeans(repeated, 3, seed=0)
    assert torch.isfinite(centroids).all() and len(labels) == 30
    with pytest.raises(ValueError, match="cannot form"):
        kmeans(z[:2], 3)


def test_streamed_kmeans_matches_in_memory_rounds():
    z, truth = blobs(k=4)
    perm = torch.randperm(len(z), generator=torch.Generator().manual_seed(0))
    z, truth = z[perm], truth[perm]
    centroids, rounds = kmeans_streamed(lambda: iter(z.split(97)), z, 4, seed=0)
    in_memory, _, rounds_in_memory = kmeans(z, 4, seed=0)
    torch.testing.assert_close(centroids, in_memory, rtol=1e-4, atol=1e-4)
    assert rounds == rounds_in_memory
    assert adjusted_rand_score(truth.numpy(), assign(z, centroids).numpy()) == pytest.approx(1.0)


def test_fit_selector_with_torch_kmeans():
    z, _ = blobs(n_per=80, k=4, d=8)
    S, stats = fit_selector(z, z[::7], SelectorConfig(n_lists=4, min_cluster_size=10, kmeans="torch"))
    _, reference = fit_selector(z, z[::7], SelectorConfig(n_lists=4, min_cluster_size=10, kmeans="sklearn"))
    assert S.shape == (4, 8) and stats["kmeans"].startswith("torch") and reference["kmeans"].startswith("scikit")
    assert stats["train_accuracy"] >= reference["train_accuracy"] - 0.01
    with pytest.raises(ValueError, match="kmeans"):
        SelectorConfig(kmeans="faiss")
