"""The permutation test on synthetic data: uniform p-values under the null, power under the watermark."""

import numpy as np
import torch
from scipy.stats import kstest

from openstamp.detect.llr import permutation_pvalue
from openstamp.key.prf import green_lists, permutations

V, L, T, DELTA = 300, 12, 80, 1.0


def synthetic_text(secret: bytes, rng: np.random.Generator, watermarked: bool):
    """Selector values, next-token distributions and tokens; tokens follow the watermark if asked."""
    green = green_lists(secret, L, V, 0.25).double()
    s = torch.from_numpy(rng.dirichlet(np.full(L, 0.3), size=T))  # soft selectors, rows sum to 1
    base = torch.from_numpy(rng.normal(0, 2.0, size=(T, V)))
    logits = base + DELTA * s @ green.T if watermarked else base
    generator = torch.Generator().manual_seed(int(rng.integers(1 << 30)))
    tokens = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator).squeeze(1)
    residual = green[tokens] - torch.softmax(base, -1) @ green  # centred with the original model
    return s.float(), residual.float(), green


def test_null_p_values_are_uniform():
    rng = np.random.default_rng(0)
    p_values = []
    for trial in range(300):
        secret = trial.to_bytes(4, "little") * 8
        s, residual, _ = synthetic_text(secret, rng, watermarked=False)
        perms = permutations(secret, L, 199)
        p_values.append(permutation_pvalue(s, residual, perms, DELTA)[1])
    assert kstest(p_values, "uniform").pvalue > 0.01
    assert abs(np.mean(np.array(p_values) <= 0.05) - 0.05) < 0.04


def test_watermarked_text_gets_small_p_values():
    rng = np.random.default_rng(1)
    small = 0
    for trial in range(40):
        secret = (trial + 1000).to_bytes(4, "little") * 8
        s, residual, _ = synthetic_text(secret, rng, watermarked=True)
        small += permutation_pvalue(s, residual, permutations(secret, L, 199), DELTA)[1] <= 0.05
    assert small >= 20  # half or more, against 2 of 40 expected under the null


def test_permutations_are_keyed_and_valid():
    a = permutations(b"k" * 32, 10, 5)
    assert a.shape == (5, 10)
    assert all(sorted(row.tolist()) == list(range(10)) for row in a)
    assert torch.equal(a, permutations(b"k" * 32, 10, 5))
    assert not torch.equal(a, permutations(b"j" * 32, 10, 5))


def test_identity_permutation_reproduces_the_observed_statistic():
    rng = np.random.default_rng(2)
    s, residual, _ = synthetic_text(b"x" * 32, rng, watermarked=False)
    observed, p, _ = permutation_pvalue(s, residual, torch.arange(L)[None, :], DELTA)
    assert abs(observed - DELTA * float((s * residual).sum())) < 1e-4
    assert p == 1.0  # the only "permutation" ties with the observation
