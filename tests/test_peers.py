"""Peers in the harness: transformers' KGW against ours, and SynthID-Text through transformers, on the tiny Llama."""

import numpy as np
import pytest
import torch
from conftest import save_tiny
from sklearn.metrics import roc_auc_score
from test_methods_baselines import WordsOnly
from transformers import LogitsProcessorList

from openstamp.corpus import load_documents
from openstamp.lab.methods import create
from openstamp.lab.methods.synthid import layer_weights, weighted_mean_score
from openstamp.model.generate import sample_completions
from openstamp.model.load import load_model
from openstamp.model.patch import head
from openstamp.model.text import encode

N_TEXTS, N_NEW = 32, 96


@pytest.fixture(scope="module")
def env(tmp_path_factory, tokenizer, corpus_file):
    base, tok = load_model(str(save_tiny(tmp_path_factory.mktemp("peers"), tokenizer, tied=False)))
    prompts = [ids[:8] for ids in encode(tok, [d.text for d in load_documents(str(corpus_file))[:N_TEXTS]])]
    words = WordsOnly(tok, head(base).weight.shape[0])

    def generate(seed, processor=None):
        procs = LogitsProcessorList([words] + ([processor] if processor else []))
        out = sample_completions(base, tok, prompts, N_NEW, seed=seed, logits_processor=procs, batch_size=12)
        return [tok.decode(ids) for ids in out]  # batches of 12, 12 and 8: the processor restarts for each

    return base, tok, generate, generate(seed=1)


def built(env, name, seed=0, **settings):
    method = create(name, **settings)
    method.build(env[0], env[1], [], seed)
    return method


def bootstrap_mean(values, n_boot=2000, seed=0):
    """The mean and its 95% percentile interval over texts."""
    v, rng = np.asarray(values, dtype=float), np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (n_boot, len(v)))].mean(axis=1)
    return v.mean(), *np.percentile(means, [2.5, 97.5])


def test_transformers_kgw_and_ours_agree_on_detection(env):
    base, tok, generate, plain = env
    z = {}
    for name in ("kgw", "hf-kgw"):
        method = built(env, name, delta=2.0, gamma=0.25)
        marked = method.score(base, tok, generate(seed=2, processor=method.logits_processor()))
        human = method.score(base, tok, plain)
        pos, neg = [r.score for r in marked], [r.score for r in human]
        assert roc_auc_score([1] * len(pos) + [0] * len(neg), pos + neg) >= 0.9
        z[name] = bootstrap_mean(pos), bootstrap_mean(neg)
    for i in (0, 1):  # watermarked, then plain text: the mean z-scores' 95% intervals over texts overlap
        (_, lo_a, hi_a), (_, lo_b, hi_b) = z["kgw"][i], z["hf-kgw"][i]
        assert lo_a <= hi_b and lo_b <= hi_a, z


@pytest.mark.parametrize("name", ["hf-kgw", "synthid"])
def test_processor_is_transformers_own_generate(env, name):
    """Greedy decoding with the harness's processor equals generate(watermarking_config=...)."""
    base, tok, _, _ = env
    method = built(env, name, seed=4)
    ids = torch.tensor([encode(tok, ["the river city council voted on"])[0]])
    processor = method.logits_processor()
    ours = base.generate(ids, logits_processor=LogitsProcessorList([processor]), do_sample=False, max_new_tokens=24)
    theirs = base.generate(ids, watermarking_config=processor.settings, do_sample=False, max_new_tokens=24)
    plain = base.generate(ids, do_sample=False, max_new_tokens=24)
    assert torch.equal(ours, theirs) and not torch.equal(ours, plain)


def test_synthid_score_separates_its_samples_from_plain_text(env):
    base, tok, generate, plain = env
    method = built(env, "synthid", depth=8)
    marked = method.score(base, tok, generate(seed=2, processor=method.logits_processor()))
    human = method.score(base, tok, plain)
    pos, neg = [r.score for r in marked], [r.score for r in human]
    assert roc_auc_score([1] * len(pos) + [0] * len(neg), pos + neg) >= 0.95
    assert abs(np.mean(neg) - 0.5) < 0.03 and np.mean(pos) > 0.55  # a fair coin on human text
    assert np.median([r.p_value for r in human]) > 0.1 and np.median([r.p_value for r in marked]) < 0.01


def test_weighted_mean_score_is_the_references_and_calibrated_under_fair_coins():
    torch.manual_seed(0)
    w = layer_weights(4)
    assert w.mean() == pytest.approx(1.0) and w[0] / w[-1] == pytest.approx(10.0)
    g, mask = torch.randint(0, 2, (200, 4)), torch.rand(200) > 0.3
    score, _ = weighted_mean_score(g, mask)
    assert score == pytest.approx(float((g[mask].double() * w).sum() / (4 * mask.sum())))
    p = [weighted_mean_score(torch.randint(0, 2, (100, 4)), torch.ones(100, dtype=torch.bool))[1] for _ in range(400)]
    assert 0.005 <= np.mean(np.asarray(p) < 0.05) <= 0.1  # nominal 0.05


def test_synthid_depth_is_a_whole_number_of_layers():
    assert create("synthid", depth=4.0).config.depth == 4
    for bad in (0, 2.5, 33):
        with pytest.raises(ValueError):
            create("synthid", depth=bad)
