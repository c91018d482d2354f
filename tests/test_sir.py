"""SIR on the tiny Llama: its losses, its training, the chunked context rule, detection and keys."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from conftest import make_corpus, make_model
from scipy.stats import kstest
from test_methods_baselines import WordsOnly
from transformers import LogitsProcessorList

from openstamp.corpus import Document
from openstamp.lab.methods import REGISTRY, create
from openstamp.lab.methods.sir import SIRProcessor, context_length
from openstamp.lab.methods.sir_train import (
    bow_embed,
    median_similarity,
    normalisation_loss,
    similarity_loss,
    train_transform,
)
from openstamp.model.generate import sample_completions
from openstamp.model.text import encode

LIGHT = {"embedder": "bow", "steps": 100}  # the light embedder, a short training
N_TEXTS, N_NEW = 24, 80


@pytest.fixture(scope="module")
def env(tokenizer):
    torch.set_num_threads(1)
    base = make_model(tied=False, vocab_size=len(tokenizer) + 12)
    docs = [Document(id=str(i), text=t) for i, t in enumerate(make_corpus())]
    words = WordsOnly(tokenizer, len(tokenizer) + 12)
    prompts = [ids[:8] for ids in encode(tokenizer, [d.text for d in docs[:N_TEXTS]])]

    def generate(seed, processor=None):
        procs = LogitsProcessorList([words] + ([processor] if processor else []))
        out = sample_completions(base, tokenizer, prompts, N_NEW, seed=seed, logits_processor=procs, progress=False)
        return [tokenizer.decode(ids) for ids in out]

    return SimpleNamespace(base=base, tok=tokenizer, docs=docs, words=words, generate=generate)


def built(env, seed=0, **overrides):
    method = create("sir", **{**LIGHT, **overrides})
    method.build(env.base, env.tok, env.docs, seed)
    return method


# -- losses and training -------------------------------------------------------------------------


def cos(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def test_losses_match_a_float64_reference():
    inputs = [[1.0, 0.0, 0.5], [0.8, 0.6, 0.0], [0.0, 1.0, 1.0]]
    outputs = [[0.9, -1.2, 0.3, 0.1], [-0.5, 1.1, 0.7, -1.4], [1.3, 0.2, -0.8, 0.6]]
    shift, scale = 0.4, 20.0
    pairs = [(i, j) for i in range(3) for j in range(3) if i != j]
    expected_sim = np.mean(
        [abs(cos(outputs[i], outputs[j]) - math.tanh(scale * (cos(inputs[i], inputs[j]) - shift))) for i, j in pairs]
    )
    rows = [np.mean(r) ** 2 for r in outputs]
    cols = [np.mean([r[k] for r in outputs]) ** 2 for k in range(4)]
    magnitude = np.mean([abs(1 - abs(v)) for r in outputs for v in r])
    x, y = torch.tensor(inputs, dtype=torch.float64), torch.tensor(outputs, dtype=torch.float64)
    assert math.isclose(float(similarity_loss(x, y, shift, scale)), expected_sim, rel_tol=1e-12)
    assert math.isclose(float(normalisation_loss(y)), np.mean(rows) + np.mean(cols) + magnitude, rel_tol=1e-12)
    sims = sorted(cos(inputs[i], inputs[j]) for i, j in pairs)
    assert math.isclose(median_similarity(x), (sims[2] + sims[3]) / 2, rel_tol=1e-12)  # 6 values: mid pair


def test_training_reduces_the_loss_and_is_seeded():
    embeddings = bow_embed([" ".join(t.split()[i : i + 30]) for t in make_corpus(10) for i in range(0, 200, 30)])
    settings = dict(hidden=64, layers=3, out_dim=50, steps=150, batch_size=32, lr=1e-3, scale=20.0, norm_weight=0.1)
    net, losses = train_transform(embeddings, seed=3, **settings)
    assert np.mean(losses[-20:]) < 0.75 * np.mean(losses[:20])
    again, _ = train_transform(embeddings, seed=3, **settings)
    other, _ = train_transform(embeddings, seed=4, **settings)
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), again.state_dict().values(), strict=True))
    assert not torch.equal(net(embeddings), other(embeddings))


# -- generation ----------------------------------------------------------------------------------


def test_context_length_follows_the_chunk_rule():
    assert [context_length(t, 10) for t in (1, 2, 9, 10, 11, 19, 20, 35)] == [1, 2, 9, 10, 10, 10, 20, 30]


def test_processor_biases_by_the_chunked_generated_context_and_restarts_per_call(env):
    method = built(env, delta=1.5)
    processor, scorer = method.logits_processor(), method.scorer
    vocab = scorer.vocab_size
    prompt = torch.tensor([[1, 40, 41], [1, 50, 51]])
    generated = torch.randint(3, len(env.tok), (2, 25), generator=torch.Generator().manual_seed(0))
    for _call in range(2):  # a second generate call with the same prompt starts a new text
        for t in range(0, 25):
            ids = torch.cat([prompt, generated[:, :t]], 1)
            logits = torch.randn(2, vocab)
            bias = processor(ids, logits) - logits
            if t == 0:
                assert not bias.any()
                continue
            contexts = generated[:, : context_length(t, 10)].tolist()
            texts = [env.tok.decode(row, skip_special_tokens=True) for row in contexts]
            expected = 1.5 * scorer.token_scores(scorer.units_of_texts(texts))
            torch.testing.assert_close(bias, expected, rtol=0, atol=1e-5)
    assert abs(float(expected[0, scorer.mapping >= 0].mean())) < 0.35  # scores are balanced over the vocabulary
    assert not expected[0, scorer.mapping < 0].any()  # special and padding ids get no bias


class Recording(SIRProcessor):
    """Records the bias (delta * s) of each step."""

    def __init__(self, scorer, delta, chunk):
        super().__init__(scorer, delta, chunk)
        self.steps = []

    def __call__(self, input_ids, scores):
        out = super().__call__(input_ids, scores)
        self.steps.append((out - scores) / self.delta)
        return out


def test_detection_scores_exactly_what_generation_biased(env):
    method = built(env, delta=2.0)
    recorder = Recording(method.scorer, 2.0, method.config.chunk)
    texts = env.generate(seed=2, processor=recorder)
    ids = encode(env.tok, texts)
    per_token = method.token_scores(ids)
    for i, y in enumerate(ids):
        applied = torch.stack([recorder.steps[t][i, y[t]] for t in range(1, len(y))])
        torch.testing.assert_close(per_token[i], applied, rtol=0, atol=1e-6)


# -- detection -----------------------------------------------------------------------------------


def test_watermarked_samples_score_above_plain_ones(env):
    method = built(env, delta=1.0)
    wm = method.score(env.base, env.tok, env.generate(seed=2, processor=method.logits_processor()))
    plain = method.score(env.base, env.tok, env.generate(seed=2))
    pos, neg = np.array([r.score for r in wm]), np.array([r.score for r in plain])
    assert pos.mean() > neg.mean() + 0.3
    assert np.mean(pos > np.median(neg)) > 0.9
    assert np.median([r.p_value for r in wm]) < 0.05  # ~35 distinct words a text at delta 1


def test_p_values_are_uniform_on_text_independent_of_the_key(env):
    """Uniformly random scored tokens: per-token scores have mean 0, so z ~ N(0, 1) and p ~ U(0, 1).

    (z = sum s / sqrt(sum s^2) of +-1 scores lies on a lattice, hence the lenient KS threshold.)
    """
    method = built(env, seed=7)
    scored = np.flatnonzero((method.scorer.mapping >= 0).numpy())
    rng = np.random.default_rng(0)
    seqs = [rng.choice(scored, 60).tolist() for _ in range(200)]
    results = [method.z_test(v, torch.tensor(y[1:])) for v, y in zip(method.token_scores(seqs), seqs, strict=True)]
    p = np.array([r.p_value for r in results])
    assert 0.4 < p.mean() < 0.6 and kstest(p, "uniform").pvalue > 1e-4
    assert np.mean(p < 0.05) < 0.1
    assert abs(np.mean([r.score for r in results])) < 0.03
    assert all(r.n_tokens == 59 and math.isclose(r.p_value, 0.5 * math.erfc(r.extra["z"] / 2**0.5)) for r in results)


def test_keyed_mapping_is_balanced_over_the_units(env):
    vocab = len(env.tok) + 12
    method = built(env, seed=2, units=40)
    mapping = method.scorer.mapping
    counts = torch.bincount(mapping[mapping >= 0], minlength=40)
    assert int(counts.max() - counts.min()) <= 1 and int((mapping < 0).sum()) == 3 + 12  # specials and padding
    units = method.scorer.units_of_texts(["the river city", "markets rose as investors watched"])
    assert torch.equal((units > 0).sum(1), torch.tensor([20, 20]))  # centred on the median
    assert len(mapping) == vocab


# -- keys ----------------------------------------------------------------------------------------


def test_save_load_round_trip_and_with_strength_share_the_key(env, tmp_path):
    method = built(env, seed=5, delta=2.0)
    texts = env.generate(seed=3, processor=method.logits_processor())[:4]
    method.save(tmp_path)
    loaded = REGISTRY["sir"]()
    loaded.load(tmp_path)
    assert loaded.config == method.config
    assert loaded.score(env.base, env.tok, texts) == method.score(env.base, env.tok, texts)
    ids, logits = torch.tensor([[1, 40, 41, 42, 43]]), torch.randn(1, method.scorer.vocab_size)
    first = method.logits_processor()(ids[:, :3], logits)  # the call that opens a text: no bias
    assert torch.equal(first, logits)
    proc, again = method.logits_processor(), loaded.logits_processor()
    for width in (3, 4, 5):
        torch.testing.assert_close(proc(ids[:, :width], logits), again(ids[:, :width], logits), rtol=0, atol=0)
    clone = method.with_strength(0.5)
    assert clone.scorer is method.scorer and clone.logits_processor().delta == 0.5
    assert built(env, seed=6).scorer.mapping.ne(method.scorer.mapping).any()  # another seed, another key


def test_each_distinct_token_is_one_term_of_the_z_test():
    values, tokens = torch.tensor([1.0, -1.0, 0.5, 1.0, -0.5]), torch.tensor([3, 5, 3, 7, 5])
    terms = [0.75, -0.75, 1.0]  # tokens 3, 5, 7
    z = sum(terms) / math.sqrt(sum(a * a for a in terms))
    result = create("sir", min_tokens=5).z_test(values, tokens)
    assert math.isclose(result.score, np.mean(terms)) and math.isclose(result.extra["z"], z, rel_tol=1e-12)
    assert math.isclose(result.p_value, 0.5 * math.erfc(z / 2**0.5), rel_tol=1e-12) and result.n_tokens == 5
    every = create("sir", min_tokens=5, unique=False).z_test(values, tokens)  # the reference code's mean
    assert math.isclose(every.score, 0.2) and math.isclose(every.extra["z"], 1.0 / math.sqrt(3.5), rel_tol=1e-12)
    assert create("sir", min_tokens=6).z_test(values, tokens).score is None
