"""Baseline watermarks (Unremovable, GaussMark, KGW, KGW + LLR, SIR) on the tiny Llama."""

import dataclasses
import hashlib
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from scipy.stats import binom, kstest
from sklearn.metrics import roc_auc_score
from transformers import LogitsProcessor, LogitsProcessorList

from openstamp.corpus import load_documents
from openstamp.lab.hidden import autocast_decoder
from openstamp.lab.methods import REGISTRY, Carrier, create
from openstamp.lab.methods.base import score_dicts
from openstamp.lab.methods.common import keyed_normal, keyed_uint32, method_secret, right_padded, scored_mask
from openstamp.lab.methods.gaussmark import gradient_projection, up_proj
from openstamp.lab.methods.kgw import _DOMAIN as KGW_DOMAIN
from openstamp.model.generate import sample_completions
from openstamp.model.hidden import final_hidden
from openstamp.model.load import load_model
from openstamp.model.patch import head
from openstamp.model.text import encode, never_green_ids

BASELINES = tuple(name for name in REGISTRY if not name.startswith("openstamp"))  # every registered baseline
TEST_STRENGTH = {"unremovable": 2.0, "gaussmark": 0.5, "kgw": 2.0, "kgw-llr": 2.0, "kgw-distilled": 3.0, "sir": 2.0}
TEST_STRENGTH |= {"hf-kgw": 2.0, "synthid": 8}
TEST_SETTINGS = {  # strong strengths and short trainings: the tiny model
    "kgw-distilled": {"steps": 200, "seq_len": 64, "batch_size": 8, "lr": 1e-2},
    "sir": {"embedder": "bow", "steps": 100},
}
N_TEXTS, N_NEW = 32, 96


class WordsOnly(LogitsProcessor):
    """Sample only ' word' tokens, whose decoded text re-tokenises to the same ids.

    Most of the tiny byte-level tokenizer's tokens are single bytes; random byte strings decode
    to U+FFFD and re-tokenise differently, which would test the tokenizer, not the watermark.
    """

    def __init__(self, tokenizer, vocab_size: int) -> None:
        words = [t for t in range(len(tokenizer)) if self._is_word(tokenizer, t)]
        self.banned = torch.ones(vocab_size, dtype=torch.bool)
        self.banned[words] = False

    @staticmethod
    def _is_word(tokenizer, token: int) -> bool:
        text = tokenizer.decode([token])
        return text.startswith(" ") and text[1:].isalpha() and encode(tokenizer, [text])[0] == [token]

    def __call__(self, input_ids, scores):
        return scores.masked_fill(self.banned, float("-inf"))


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    """The tiny model's matmuls are too small to parallelise; extra threads only contend."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def env(tiny_model_dir, corpus_file):
    """The base model, its tokenizer, key documents, a sampler, and 32 plain completions."""
    base, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    prompts = [ids[:8] for ids in encode(tok, [d.text for d in docs[:N_TEXTS]])]
    words = WordsOnly(tok, head(base).weight.shape[0])

    def generate(model, seed, processor=None):
        procs = LogitsProcessorList([words] + ([processor] if processor else []))
        out = sample_completions(model, tok, prompts, N_NEW, seed=seed, logits_processor=procs, progress=False)
        texts = [tok.decode(ids) for ids in out]
        assert encode(tok, texts) == out  # every sampled token survives the text round trip
        return texts

    plain = generate(base, seed=1)
    return SimpleNamespace(base=base, tok=tok, docs=docs, dir=tiny_model_dir, generate=generate, plain=plain)


def built(env, name, seed=0, **overrides):
    method = create(name, **{**TEST_SETTINGS.get(name, {}), **overrides})
    method.build(env.base, env.tok, env.docs, seed)
    return method


def watermarked_texts(env, method):
    if method.carrier is Carrier.WEIGHTS:
        model, _ = load_model(str(env.dir))
        method.apply(model)
        return env.generate(model, seed=2)
    return env.generate(env.base, seed=2, processor=method.logits_processor())


# -- detection ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BASELINES)
def test_detector_separates_watermarked_from_plain_text(env, name):
    method = built(env, name, **{REGISTRY[name].strength: TEST_STRENGTH[name]})
    wm = method.score(env.base, env.tok, watermarked_texts(env, method))
    plain = method.score(env.base, env.tok, env.plain)
    pos, neg = [r.score for r in wm], [r.score for r in plain]
    assert roc_auc_score([1] * len(pos) + [0] * len(neg), pos + neg) >= 0.9
    assert np.mean(pos) > np.mean(neg)
    assert all(r.n_tokens == N_NEW - 1 for r in wm + plain)  # the first token has no context
    if wm[0].p_value is not None:
        assert np.median([r.p_value for r in wm]) < 0.05


@pytest.mark.parametrize("name", ["unremovable", "kgw"])
def test_p_values_are_not_small_on_plain_text(env, name):
    p = [r.p_value for r in built(env, name).score(env.base, env.tok, env.plain)]
    assert min(p) > 1e-3
    assert np.median(p) > 0.1


def test_gaussmark_score_is_standard_normal_over_keys(env):
    """For a fixed text, <xi, g> / (sigma ||g||) over random keys is N(0, 1), whatever the text.

    (On this word-restricted sampler one key's scores share an offset: the text is not drawn
    from the model, so the expected gradient is not zero. The null holds over keys.)
    """
    layer = built(env, "gaussmark").config.layer
    g = brute_force_gradient(env.base, layer, encode(env.tok, env.plain[:1])[0])
    z = [float((built(env, "gaussmark", seed=s).noise.double() * g).sum() / g.norm()) for s in range(200)]
    assert kstest(z, "norm").pvalue > 0.01


@pytest.mark.parametrize("name", BASELINES)
def test_short_texts_get_no_score(env, name):
    short = env.tok.decode(encode(env.tok, env.plain[:1])[0][:10])
    results = built(env, name).score(env.base, env.tok, [short, env.plain[0]], batch_size=1)
    assert (results[0].score, results[0].p_value, results[0].n_tokens) == (None, None, 9)
    assert results[1].score is not None


# -- keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", BASELINES)
def test_save_load_round_trip_gives_identical_scores(env, name, tmp_path):
    method = built(env, name, seed=5, **{REGISTRY[name].strength: TEST_STRENGTH[name]})
    method.save(tmp_path)
    loaded = REGISTRY[name]()
    loaded.load(tmp_path)
    assert loaded.config == method.config
    assert loaded.score(env.base, env.tok, env.plain[:4]) == method.score(env.base, env.tok, env.plain[:4])


@pytest.mark.parametrize("name", BASELINES)
def test_with_strength_keeps_the_key(env, name):
    method = built(env, name)
    clone = method.with_strength(2 * method.strength_value)
    assert clone.config == dataclasses.replace(method.config, **{method.strength: 2 * method.strength_value})
    assert method.strength_value == getattr(REGISTRY[name].config_class(), method.strength)
    for field_name in method.key_fields:  # the key is shared, not rebuilt
        assert getattr(clone, field_name) is getattr(method, field_name)
    if method.carrier is Carrier.DECODER:
        assert clone.logits_processor().delta == 2 * method.logits_processor().delta
    elif name == "kgw-distilled":  # the weights were distilled at one delta: a clone at another refuses them
        with pytest.raises(ValueError, match="distilled at delta"):
            clone.apply(load_model(str(env.dir))[0])
    else:  # same noise, twice the scale; the z-score does not depend on the scale
        assert torch.equal(clone.noise, method.noise)
        scale = clone.bias() if name == "unremovable" else clone.perturbation()
        torch.testing.assert_close(scale, 2 * (method.bias() if name == "unremovable" else method.perturbation()))
        assert clone.score(env.base, env.tok, env.plain[:3]) == method.score(env.base, env.tok, env.plain[:3])


def test_keyed_normal_is_deterministic_prefix_stable_and_standard_normal():
    n, secret = 100_001, bytes(range(32))
    values = keyed_normal(secret, b"test", n)
    assert torch.equal(values, keyed_normal(secret, b"test", n))
    assert torch.equal(values[:1000], keyed_normal(secret, b"test", 1000))
    assert not torch.equal(values, keyed_normal(bytes(32), b"test", n))
    assert not torch.equal(values, keyed_normal(secret, b"other", n))
    assert abs(float(values.double().mean())) < 5 / math.sqrt(n)
    assert abs(float(values.double().std()) - 1) < 5 / math.sqrt(2 * n)
    assert kstest(values.numpy(), "norm").pvalue > 0.01


def test_keyed_normal_is_box_muller_on_the_shake_stream():
    secret = b"k" * 32
    stream = hashlib.shake_256(b"dom" + (32).to_bytes(2, "little") + secret + (3).to_bytes(4, "little"))
    words = [int.from_bytes(stream.digest(32)[8 * i : 8 * i + 8], "little") for i in range(4)]
    u = [((w >> 11) + 0.5) / 2**53 for w in words]
    expected = []
    for u1, u2 in ((u[0], u[1]), (u[2], u[3])):
        r = math.sqrt(-2 * math.log(u1))
        expected += [r * math.cos(2 * math.pi * u2), r * math.sin(2 * math.pi * u2)]
    torch.testing.assert_close(keyed_normal(secret, b"dom", 4, index=3), torch.tensor(expected), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["unremovable", "gaussmark"])
def test_keyed_noise_depends_only_on_the_seed(env, name):
    first, again, other = built(env, name, seed=0), built(env, name, seed=0), built(env, name, seed=1)
    assert torch.equal(first.noise, again.noise)
    assert not torch.equal(first.noise, other.noise)


# -- weight-level methods -----------------------------------------------------------------------


@pytest.mark.parametrize("name, strength", [("unremovable", 0.7), ("gaussmark", 0.3)])
def test_apply_adds_noise_of_the_requested_std_and_revert_is_bit_exact(env, name, strength):
    model, _ = load_model(str(env.dir))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    method = built(env, name, seed=3, **{REGISTRY[name].strength: strength})
    method.apply(model)
    after = model.state_dict()
    changed = [k for k in after if k not in before or not torch.equal(after[k], before[k])]
    if name == "unremovable":
        assert changed == ["lm_head.bias"]
        keep = torch.ones(len(method.noise), dtype=torch.bool)
        keep[never_green_ids(env.tok, len(keep))] = False
        added = after["lm_head.bias"][keep]
        assert not after["lm_head.bias"][~keep].any()  # special tokens and padding rows get no bias
    else:
        assert changed == [f"model.layers.{method.config.layer}.mlp.up_proj.weight"]
        added = (after[changed[0]] - before[changed[0]]).flatten()
    assert abs(float(added.std()) / strength - 1) < 4 / math.sqrt(2 * len(added))  # a std, not a variance
    with pytest.raises(RuntimeError):
        method.apply(model)
    with pytest.raises(RuntimeError):  # a clone shares the key, not the patch state
        method.with_strength(strength / 2).revert(model)
    method.revert(model)
    restored = model.state_dict()
    assert restored.keys() == before.keys()
    assert all(torch.equal(restored[k], before[k]) for k in before)


@pytest.mark.parametrize("name", [n for n in BASELINES if REGISTRY[n].carrier is Carrier.WEIGHTS])
def test_keeps_hidden_says_whether_the_decoder_states_stay_the_originals(env, name):
    """The eval re-uses the original model's hidden states for a method that keeps them: the claim must hold."""
    model, _ = load_model(str(env.dir))
    ids = torch.tensor(encode(env.tok, [env.plain[0]]))
    mask = torch.ones_like(ids)
    before = final_hidden(model, ids, mask).clone()
    method = built(env, name, seed=3, **{REGISTRY[name].strength: TEST_STRENGTH[name]})
    method.apply(model)
    try:
        assert torch.equal(final_hidden(model, ids, mask), before) == method.keeps_hidden
    finally:
        method.revert(model)


def test_unremovable_bias_shifts_every_logit_and_drives_generate(env):
    model, _ = load_model(str(env.dir))
    ids = torch.tensor([encode(env.tok, [env.docs[0].text])[0][:20]])
    method = built(env, "unremovable", epsilon=1.0)
    with torch.no_grad():
        plain = model(ids).logits
        method.apply(model)
        biased = model(ids).logits
    torch.testing.assert_close(biased - plain, method.bias().expand_as(plain), rtol=0, atol=1e-5)
    method.revert(model)
    huge = method.with_strength(1000.0)  # the bias dominates: greedy decoding emits argmax(b)
    huge.apply(model)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out[0, -4:].tolist() == [int(huge.noise.argmax())] * 4
    assert head(model).bias is not None
    huge.revert(model)
    assert head(model).bias is None


def brute_force_gradient(model, layer, seq):
    """d/dW sum_{t>=1} log p(x_t | x_<t) at the up_proj weight, by autograd, float64 (m, d)."""
    ids = torch.tensor([seq])
    logits = model(input_ids=ids).logits[0, :-1].double()
    loglik = torch.log_softmax(logits, -1)[torch.arange(len(seq) - 1), ids[0, 1:]].sum()
    (grad,) = torch.autograd.grad(loglik, up_proj(model, layer).weight)
    return grad.double()


def test_gaussmark_batched_projection_matches_autograd(env):
    method = built(env, "gaussmark")
    assert method.config.layer == 1  # int(0.85 * 2 blocks)
    seqs = [ids[:n] for ids, n in zip(encode(env.tok, env.plain[:3]), (40, 17, 29), strict=True)]
    ids, mask = right_padded(seqs, 0)
    inner, norm_sq = gradient_projection(env.base, 1, method.noise, ids, mask, scored_mask(mask, 1))
    for i, seq in enumerate(seqs):
        g = brute_force_gradient(env.base, 1, seq)
        assert math.isclose(inner[i], float((method.noise.double() * g).sum()), rel_tol=1e-4, abs_tol=1e-6)
        assert math.isclose(norm_sq[i], float(g.pow(2).sum()), rel_tol=1e-4)
    assert all(p.requires_grad for p in env.base.parameters())  # gradient flags are restored
    with autocast_decoder("bfloat16"):  # as the eval scores: the decoder in bfloat16, the head in float32
        half_inner, half_sq = gradient_projection(env.base, 1, method.noise, ids, mask, scored_mask(mask, 1))
    assert half_inner.dtype == torch.float64
    assert torch.allclose(half_inner / half_sq.sqrt(), inner / norm_sq.sqrt(), atol=0.05)  # the z-scores


def test_gaussmark_rejects_a_missing_block(env):
    with pytest.raises(ValueError, match="out of range"):
        built(env, "gaussmark", layer=5)


# -- decode-time methods ------------------------------------------------------------------------


def reference_green(seed, prev, vocab, tokenizer, gamma=0.25):
    """G(prev) from its definition: PRF(secret, prev, i) < gamma, special and padding ids removed."""
    green = torch.from_numpy(keyed_uint32(method_secret("kgw", seed), KGW_DOMAIN, prev, vocab) < gamma * 2**32)
    green[never_green_ids(tokenizer, vocab)] = False
    return green


def test_kgw_processor_adds_delta_to_the_green_list_of_the_previous_token(env):
    vocab = head(env.base).weight.shape[0]
    method = built(env, "kgw", delta=1.5)
    scores = torch.randn(2, vocab)
    out = method.logits_processor()(torch.tensor([[5, 17], [3, 42]]), scores)
    for row, prev in enumerate((17, 42)):
        green = reference_green(0, prev, vocab, env.tok)
        torch.testing.assert_close(out[row] - scores[row], 1.5 * green.float())
        assert abs(float(green.float().mean()) - 0.25) < 0.1
    assert not torch.equal(reference_green(0, 17, vocab, env.tok), reference_green(1, 17, vocab, env.tok))
    llr = built(env, "kgw-llr", delta=1.5)  # one seed, one key: the evaluation shares their generations
    assert llr.generation_family == method.generation_family
    assert torch.equal(llr.logits_processor()(torch.tensor([[5, 17], [3, 42]]), scores), out)


def test_kgw_z_test_counts_each_pair_once(env):
    ids = encode(env.tok, env.plain[:1])[0][:40]
    ids = ids + ids[:20]  # repeated pairs
    result = built(env, "kgw").score(env.base, env.tok, [env.tok.decode(ids)])[0]
    pairs = set(zip(ids[:-1], ids[1:], strict=True))
    n, k = len(pairs), sum(bool(reference_green(0, a, len(env.tok) + 12, env.tok)[b]) for a, b in pairs)
    assert n < len(ids) - 1 and result.n_tokens == len(ids) - 1 and result.extra["n_unique"] == n
    assert math.isclose(result.score, (k - 0.25 * n) / math.sqrt(n * 0.25 * 0.75))
    assert math.isclose(result.p_value, binom.sf(k - 1, n, 0.25))


def test_kgw_llr_matches_a_full_softmax_reference(env):
    method = built(env, "kgw-llr", delta=1.4)
    ids = encode(env.tok, env.plain[:1])[0]
    with torch.no_grad():
        logits = env.base(torch.tensor([ids])).logits[0].double()
    expected = []
    for t in range(1, len(ids)):
        green = reference_green(0, ids[t - 1], logits.shape[-1], env.tok).double()
        marked = torch.log_softmax(logits[t - 1] + 1.4 * green, -1)[ids[t]]
        expected.append(float(marked - torch.log_softmax(logits[t - 1], -1)[ids[t]]))
    result = method.score(env.base, env.tok, env.plain[:1])[0]
    assert result.p_value is None
    assert math.isclose(result.score, float(np.mean(expected)), rel_tol=1e-4, abs_tol=1e-6)
    chunked = method.with_strength(1.4)
    chunked.config = dataclasses.replace(chunked.config, chunk=7)  # several blocks
    assert math.isclose(chunked.score(env.base, env.tok, env.plain[:1])[0].score, result.score, rel_tol=1e-5)


def test_kgw_llr_scores_every_strength_of_a_key_from_one_pass_of_its_key_statistics(env, monkeypatch):
    method, texts = built(env, "kgw-llr"), env.plain[:6]
    assert method.shares_statistics and not method.scores_ignore_strength
    scored = lambda d: method.with_strength(d).score(env.base, env.tok, texts, 4)  # noqa: E731
    direct = {d: [dataclasses.asdict(s) for s in scored(d)] for d in (0.5, 2.0)}
    assert direct[0.5] != direct[2.0]
    passes, real = [], type(method)._batch_green
    monkeypatch.setattr(type(method), "_batch_green", lambda self, *a: passes.append(1) or real(self, *a))
    memo: dict = {}
    for delta in (0.5, 2.0):
        assert score_dicts(method.with_strength(delta), env.base, env.tok, texts, 4, memo) == direct[delta]
    assert len(passes) == 2 and len(memo) == len(set(texts))  # 6 texts in batches of 4, for the first strength only


# -- plumbing -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, bad",
    [
        ("unremovable", {"epsilon": 0.0}),
        ("unremovable", {"epsilon": float("nan")}),
        ("gaussmark", {"sigma": -0.1}),
        ("gaussmark", {"layer": -1}),
        ("kgw", {"gamma": 1.0}),
        ("kgw-llr", {"delta": 0.0}),
        ("kgw-llr", {"chunk": 0}),
        ("kgw-distilled", {"steps": 0}),
        ("kgw-distilled", {"seq_len": 4}),
        ("sir", {"delta": -1.0}),
        ("sir", {"chunk": 0}),
        ("sir", {"layers": 1}),
    ],
)
def test_configs_reject_invalid_values(name, bad):
    with pytest.raises(ValueError):
        create(name, **bad)


@pytest.mark.parametrize("name", BASELINES)
def test_methods_are_registered_with_documented_configs(name):
    cls = REGISTRY[name]
    assert (cls.carrier is Carrier.DECODER) == (name in ("kgw", "kgw-llr", "sir", "hf-kgw", "synthid"))
    assert cls.key_fields and isinstance(cls.carrier, Carrier)
    assert getattr(cls.config_class(), cls.strength) in cls.sweep
    assert all(f.metadata.get("help") for f in dataclasses.fields(cls.config_class))
