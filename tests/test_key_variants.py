"""Key variants. A centred key (green.centre): the release's output distributions are the plain key's, its LLR too,
and a re-tied release's input embeddings move less on average. The context-consistency penalty
(selector.consistency): state differences from cut windows, and a selector fitted with them."""

from __future__ import annotations

import copy

import pytest
import torch

from openstamp.config import DetectConfig
from openstamp.corpus import load_documents
from openstamp.detect import Detector
from openstamp.embed.build import build_key
from openstamp.embed.states import context_deltas, input_gradients, plan_windows
from openstamp.key.selector import ridge
from openstamp.model.hidden import final_hidden
from openstamp.model.load import load_model
from openstamp.model.patch import apply_watermark, is_tied
from openstamp.model.text import bos_prefix, token_frequencies

SECRET = bytes(range(32))


def keys(model, tok, docs, tiny_config):
    """The same secret and states, plain and centred."""
    plain = build_key(model, tok, docs, tiny_config, secret=SECRET, progress=False)
    cfg = tiny_config.with_overrides({"green.centre": True})
    return plain, build_key(model, tok, docs, cfg, secret=SECRET, progress=False)


def test_a_centred_release_writes_the_same_distributions_and_scores_the_same(tiny_model_dir, corpus_file, tiny_config):
    model, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    plain, centred = keys(model, tok, docs, tiny_config)
    assert centred.centring is not None and centred.key_id != plain.key_id
    torch.testing.assert_close(centred.selector, plain.selector, rtol=0, atol=0)
    ids = torch.tensor([tok("the river city council voted on a plan for parks").input_ids])
    a, b = copy.deepcopy(model), copy.deepcopy(model)
    apply_watermark(a, plain, "untie")  # the head alone moves: the decoder sees the same inputs
    apply_watermark(b, centred, "untie")
    with torch.no_grad():
        pa, pb = torch.log_softmax(a(ids).logits, -1), torch.log_softmax(b(ids).logits, -1)
    torch.testing.assert_close(pb, pa, rtol=1e-5, atol=1e-5)
    texts = [d.text[:200] for d in docs[:6]]
    config = DetectConfig(min_tokens=4)
    sa = [r.score for r in Detector(model, tok, plain, config).detect(texts)]
    sb = [r.score for r in Detector(model, tok, centred, config).detect(texts)]
    torch.testing.assert_close(torch.tensor(sb), torch.tensor(sa), rtol=1e-4, atol=1e-5)


def test_a_centred_retied_release_moves_the_mean_input_embedding_less(tiny_model_dir, corpus_file, tiny_config):
    model, tok = load_model(str(tiny_model_dir))
    if not is_tied(model):
        pytest.skip("only a tied model has a re-tied input side")
    docs = load_documents(str(corpus_file))
    plain, centred = keys(model, tok, docs, tiny_config)
    w = token_frequencies(tok, docs, plain.vocab_size)
    base = model.get_input_embeddings().weight.detach().clone()
    moved = {}
    for name, key in (("plain", plain), ("centred", centred)):
        release = copy.deepcopy(model)
        apply_watermark(release, key, "retie")
        shift = release.get_input_embeddings().weight.detach() - base
        moved[name] = float(torch.linalg.vector_norm(w @ shift))
    assert moved["centred"] < 1e-4 < moved["plain"]


def test_context_deltas_are_full_minus_cut_states(tiny_model_dir, corpus_file, tiny_config):
    model, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    cfg = tiny_config.states
    deltas = context_deltas(model, tok, docs, cfg, cut=24, n_windows=3)
    assert deltas.shape[1] == model.config.hidden_size and 0 < len(deltas) <= 3 * cfg.positions_per_window
    assert deltas.abs().sum() > 0
    # one row by hand: the first window's first kept position, full and cut
    w = plan_windows(tok, docs, cfg)[0]
    p = next(p for p in w.positions if p - 24 >= cfg.min_context)
    prefix = len(bos_prefix(tok))
    cut_ids = w.ids[:prefix] + w.ids[prefix + 24 :]
    full = final_hidden(model, torch.tensor([w.ids]), torch.ones(1, len(w.ids), dtype=torch.long))[0, p]
    short = final_hidden(model, torch.tensor([cut_ids]), torch.ones(1, len(cut_ids), dtype=torch.long))[0, p - 24]
    torch.testing.assert_close(deltas[0], (full - short).float(), rtol=1e-4, atol=1e-4)


def test_a_key_fitted_with_the_consistency_penalty(tiny_model_dir, corpus_file, tiny_config):
    model, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    plain = build_key(model, tok, docs, tiny_config, secret=SECRET, progress=False)
    cfg = tiny_config.with_overrides({"selector.consistency": 1.0, "selector.consistency_cut": 24})
    key = build_key(model, tok, docs, cfg, secret=SECRET, progress=False)
    assert key.meta["stats"]["selector"]["consistency_mu"] > 0 == plain.meta["stats"]["selector"]["consistency_mu"]
    assert not torch.allclose(key.selector, plain.selector)


def test_input_gradients_match_a_hand_made_gradient(tiny_model_dir, corpus_file, tiny_config):
    model, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    grads = input_gradients(model, tok, docs, tiny_config.states, n_windows=2)
    windows = plan_windows(tok, docs, tiny_config.states)[:2]
    prefix = len(bos_prefix(tok))
    assert grads.shape == (sum(len(w.ids) - prefix for w in windows), model.config.hidden_size)
    w = windows[0]  # by hand: one coordinate of one token's input embedding, by a central difference
    ids = torch.tensor([w.ids])
    base = model.get_input_embeddings()(ids).detach().double()
    model64 = copy.deepcopy(model).double()

    def loss(e):
        with torch.no_grad():
            logits = model64(inputs_embeds=e).logits[0, :-1]
        return float(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum"))

    t, eps = prefix + 5, 1e-3  # the model's logits are not all float64: a larger step, the largest coordinate
    j = int(grads[t - prefix].abs().argmax())
    up, down = base.clone(), base.clone()
    up[0, t, j] += eps
    down[0, t, j] -= eps
    expected = float(grads[t - prefix, j])
    assert abs((loss(up) - loss(down)) / (2 * eps) - expected) < 0.05 * abs(expected)


def test_the_fisher_penalty_lowers_the_input_side_cost_and_zero_is_the_plain_ridge(
    tiny_model_dir, corpus_file, tiny_config
):
    model, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    plain = build_key(model, tok, docs, tiny_config, secret=SECRET, progress=False)
    zero = build_key(
        model, tok, docs, tiny_config.with_overrides({"selector.fisher": 0.0}), secret=SECRET, progress=False
    )
    torch.testing.assert_close(zero.selector, plain.selector, rtol=0, atol=0)
    cfg = tiny_config.with_overrides({"selector.fisher": 1.0, "selector.fisher_windows": 8})
    key = build_key(model, tok, docs, cfg, secret=SECRET, progress=False)
    assert key.meta["stats"]["selector"]["fisher_nu"] > 0 == plain.meta["stats"]["selector"]["fisher_nu"]
    g = input_gradients(model, tok, docs, tiny_config.states, n_windows=8).double()
    fisher = g.T @ g / len(g)

    def cost(k):  # tr(S F S^T) of the unrescaled shape: per unit of selector value on held states
        s = k.selector.double()
        return float(torch.trace(s @ fisher @ s.T) / torch.trace(s @ s.T))

    assert cost(key) < cost(plain)


def test_the_fisher_ridge_is_the_closed_form():
    g = torch.Generator().manual_seed(0)
    z, gz = torch.randn(200, 6, generator=g, dtype=torch.float64), torch.randn(40, 6, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (200,), generator=g)
    y = torch.nn.functional.one_hot(labels, 3).double()
    expected = torch.linalg.solve(z.T @ z + 0.5 * torch.eye(6, dtype=torch.float64) + 2.0 * gz.T @ gz, z.T @ y).T
    torch.testing.assert_close(ridge(z, labels, 3, 0.5, gz=gz, nu=2.0).double(), expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ridge(z, labels, 3, 0.5, gz=gz, nu=0.0), ridge(z, labels, 3, 0.5))
