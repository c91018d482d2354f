"""benchmarks/provenance/pool_reference.py: disjoint pools, and the reference correction C - (n / n_ref) C_ref."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from openstamp.detect.llr import cross_pvalue


@pytest.fixture
def pool_reference(benchmark):
    return benchmark("provenance/pool_reference")


def test_pools_sum_disjoint_runs_and_drop_the_rest(pool_reference):
    sums = np.arange(2 * 7 * 2 * 2, dtype=float).reshape(2, 7, 2, 2)  # 2 keys, 7 runs of 10 texts, L = 2
    tokens = np.arange(1.0, 8.0)
    pools, n = pool_reference.pooled(sums, tokens, 30)  # 3 runs a pool: 2 pools, the 7th run left out
    assert pools.shape == (2, 2, 2, 2)
    np.testing.assert_array_equal(pools[1, 1], sums[1, 3:6].sum(0))
    np.testing.assert_array_equal(n, [1 + 2 + 3, 4 + 5 + 6])


def null_pools(seed: int, n_pools: int, L: int = 16, tokens: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """One key's pools on a domain where that key has a mean of its own: each token adds a fixed M plus noise to C."""
    rng = np.random.default_rng(seed)
    M = np.eye(L) * 0.02  # the key's own mean per token falls on its diagonal: the observed statistic
    noise = rng.normal(size=(n_pools, L, L)) * np.sqrt(tokens) * 0.05
    return tokens * M + noise, np.full(n_pools, float(tokens))


def test_the_reference_removes_a_keys_own_mean(pool_reference):
    rng = np.random.default_rng(0)
    perms = torch.from_numpy(np.stack([rng.permutation(16) for _ in range(199)]))
    detector = SimpleNamespace(perms=perms, key=SimpleNamespace(delta=0.5))
    ref_pools, ref_n = null_pools(1, 40)
    ref = (ref_pools.sum(0), ref_n.sum())
    pools, n = null_pools(2, 300)
    raw = np.array(pool_reference.pool_pvalues(detector, pools, n))
    fixed = np.array(pool_reference.pool_pvalues(detector, pools, n, ref))
    assert np.mean(raw <= 0.05) > 0.5  # the key's own mean alone flags most null pools
    assert np.mean(fixed <= 0.05) < 0.1  # 15 expected of 300; 30 is far in the binomial tail
    assert 0.35 < np.mean(fixed <= 0.5) < 0.65  # and it leaves a null, not a statistic pinned at p = 1
    C = pools[0] - (n[0] / ref[1]) * ref[0]  # the correction is the linear map the docstring states
    assert fixed[0] == cross_pvalue(torch.from_numpy(C), detector.perms, 0.5)[1]
