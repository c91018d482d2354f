import torch

from openstamp.config import ProjectionConfig
from openstamp.key.projection import similarity_kl, train_projection


def test_loss_is_zero_when_geometries_agree_and_positive_otherwise():
    x = torch.randn(32, 16)
    assert float(similarity_kl(x, x * 3.0, 0.1)) < 1e-6  # cosine similarity ignores scale
    assert float(similarity_kl(x, torch.randn(32, 16), 0.1)) > 0.1


def test_loss_is_finite_and_differentiable():
    x = torch.randn(16, 8, requires_grad=True)
    loss = similarity_kl(x, torch.randn(16, 8), 0.1)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(x.grad).all() and x.grad.abs().sum() > 0


def test_training_aligns_hidden_states_with_targets():
    g = torch.Generator().manual_seed(0)
    targets = torch.randn(1024, 8, generator=g)
    mixing = torch.randn(8, 24, generator=g)
    hidden = targets @ mixing + 0.1 * torch.randn(1024, 24, generator=g)
    hidden[:, 0] += 20.0  # an outlier dimension that dominates raw cosine similarity
    cfg = ProjectionConfig(n_states=1024, epochs=15, batch_size=128, lr=3e-3)
    P, stats = train_projection(hidden, targets, cfg, progress=False)
    assert P.shape == (24, 24)
    assert stats["heldout_kl"] < 0.5 * stats["heldout_kl_identity"]
    assert stats["heldout_corr"] > stats["heldout_corr_identity"] + 0.2
