"""Exact centring and the tail p-value, against float64 references and Monte-Carlo over random keys."""

import math

import numpy as np
import pytest
import torch

from openstamp.corpus import load_documents
from openstamp.detect.llr import token_stats
from openstamp.detect.tail import TailTerms, chernoff_pvalue, combined_pvalue, tail_terms
from openstamp.embed.build import build_key
from openstamp.model.load import load_model
from openstamp.model.patch import apply_watermark, head


@pytest.fixture(scope="module")
def text(tiny_model_dir, corpus_file, tiny_config):
    """A watermarked tiny model, its key, and the hidden states of one text (float64 reference inputs)."""
    model, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    key = build_key(
        model, tok, docs, tiny_config.with_overrides({"green.delta": 1.5}), secret=b"t" * 32, progress=False
    )
    apply_watermark(model, key)
    ids = tok(docs[0].text, add_special_tokens=False).input_ids[:60]
    with torch.no_grad():
        h = model.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0, :-1]
    return dict(model=model, key=key, h=h, x=torch.tensor(ids[1:]))


@torch.no_grad()
def reference(text):
    """p, s and the coefficients c[v, l] of T = delta sum G c, all in float64 over the whole vocabulary."""
    key, h, x = text["key"], text["h"].double(), text["x"]
    u_orig = head(text["model"]).weight.double() - key.delta_w().double()
    p = torch.softmax(h @ u_orig.T, -1)
    s = h @ key.selector_weights.double().T
    eligible = torch.ones(key.vocab_size, dtype=torch.bool)
    eligible[key.never_green] = False
    a = torch.zeros(key.n_lists, key.vocab_size, dtype=torch.float64)
    a.index_add_(1, x, s.T)
    c = (a - s.T @ p) * eligible
    return p, s, c.T, eligible  # c: (V, L)


def test_exact_m_matches_the_full_vocabulary_reference(text):
    key, weight = text["key"], head(text["model"]).weight.detach()
    stats = token_stats(text["h"], text["x"], weight, key, block=7)  # many blocks, one ragged
    p, _, _, _ = reference(text)
    m = p @ key.green.double()
    expected = key.green.double()[text["x"]] - m
    torch.testing.assert_close(stats.residual.double(), expected, rtol=1e-4, atol=1e-5)
    truncated = token_stats(text["h"], text["x"], weight, key, top_k=2)
    assert not torch.allclose(truncated.residual, stats.residual, atol=1e-4)  # the old estimate differs


def test_the_statistic_is_linear_in_g_with_the_reference_coefficients(text):
    key, weight = text["key"], head(text["model"]).weight.detach()
    stats = token_stats(text["h"], text["x"], weight, key)
    _, _, c, eligible = reference(text)
    statistic = float(stats.centred.double().sum())
    assert math.isclose(statistic, key.delta * float((key.green.double() * c).sum()), rel_tol=1e-4, abs_tol=1e-4)
    terms = tail_terms(text["h"], text["x"], weight, key, stats.selector, stats.lse_orig, statistic, block=5)
    in_text = torch.unique(text["x"][eligible[text["x"]]])
    torch.testing.assert_close(terms.coefficients, c[in_text], rtol=1e-4, atol=1e-5)
    rest = torch.ones(key.vocab_size, dtype=torch.bool)
    rest[in_text] = False
    assert math.isclose(terms.rest_sumsq, float((c[rest] ** 2).sum()), rel_tol=1e-4, abs_tol=1e-8)
    assert math.isclose(terms.rest_max, float(c[rest].abs().max()), rel_tol=1e-4, abs_tol=1e-8)
    mean = key.delta * key.gamma * float(c.sum())
    assert math.isclose(terms.deviation, statistic - mean, rel_tol=1e-4, abs_tol=1e-4)


@pytest.mark.parametrize("split", [False, True])
def test_tail_bound_is_never_below_the_monte_carlo_tail_over_random_keys(text, split):
    """10^5 random keys (G iid Bernoulli(gamma)): the bound holds at every level the run resolves."""
    key = text["key"]
    _, _, c, eligible = reference(text)
    c = c[eligible]  # (V_E, L)
    delta, gamma, draws = key.delta, key.gamma, 100_000
    rng = np.random.default_rng(0)
    flat = c.numpy().ravel()
    null = np.empty(draws)
    for i in range(0, draws, 5000):  # T - E T = delta * sum (G - gamma) c
        g = rng.random((5000, flat.size)) < gamma
        null[i : i + 5000] = delta * (g.astype(np.float64) - gamma) @ flat
    if split:  # the first half of the tokens exactly, the rest through Bennett's bound
        half = len(c) // 2
        coefficients, rest = c[:half], c[half:]
    else:
        coefficients, rest = c, c[:0]
    for level in (1e-1, 1e-2, 1e-3, 1e-4):
        u = float(np.quantile(null, 1 - level))
        p_mc = float(np.mean(null >= u))
        error = 3 * math.sqrt(p_mc * (1 - p_mc) / draws)
        rest_max = float(rest.abs().max()) if len(rest) else 0.0
        terms = TailTerms(u, coefficients, float((rest**2).sum()), rest_max)
        p_tail = chernoff_pvalue(terms, delta, gamma)
        assert p_tail >= p_mc - error, (level, p_tail, p_mc)
        assert p_tail <= 1.0
    assert chernoff_pvalue(TailTerms(-1.0, c, 0.0, 0.0), delta, gamma) == 1.0


def test_tail_bound_reaches_tiny_p_values_for_a_strong_signal():
    c = torch.full((200, 4), 0.5, dtype=torch.float64)  # 200 tokens, each pushing one way
    terms = TailTerms(0.7 * 200 * 0.5 * 4, c, 0.0, 0.0)  # far above the null's sd (about 6)
    assert chernoff_pvalue(terms, 1.0, 0.25) < 1e-12


def test_combined_pvalue_uses_the_bound_only_at_the_floor():
    assert combined_pvalue(0.2, 999, 1e-9) == 0.2
    assert combined_pvalue(0.001, 999, 1e-9) == 1e-9
    assert combined_pvalue(0.001, 999, 0.5) == 0.001  # a looser bound never raises the p-value
    assert combined_pvalue(0.001, 999, 1e-30) == 1e-12
    assert combined_pvalue(0.001, 999, None) == 0.001
