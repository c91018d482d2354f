"""kgw-distilled: KGW learned into the weights by distillation, on the tiny Llama."""

import copy
import random

import numpy as np
import pytest
import torch
from conftest import WORDS
from test_methods_baselines import WordsOnly
from transformers import LogitsProcessorList

from openstamp.corpus import load_documents
from openstamp.lab.methods import REGISTRY, create
from openstamp.lab.methods.kgw_distilled import KGWDistilledConfig, _kl_loss, mean_teacher_kl, teacher_kl
from openstamp.lab.training import training_windows
from openstamp.model.generate import sample_completions
from openstamp.model.load import load_model
from openstamp.model.patch import head
from openstamp.model.text import encode

TINY_BUDGET = {"steps": 200, "seq_len": 64, "batch_size": 8, "lr": 1e-2}  # learns the tiny model's lists


@pytest.fixture(scope="module", autouse=True)
def single_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def env(tiny_model_dir, corpus_file):
    base, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    method = create("kgw-distilled", delta=3.0, **TINY_BUDGET)
    method.build(base, tok, docs, seed=0)
    return base, tok, docs, method, tiny_model_dir


def marked(method, model):
    """``model`` carrying the watermark; a clone applies it, so ``method`` keeps no patch state."""
    method.with_strength(method.strength_value).apply(model)
    return model


def same_weights(a, b) -> bool:
    first, second = a.state_dict(), b.state_dict()
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def sample(model, tok, docs, seed):
    """One completion per document (40) of 64 ' word' tokens (they survive the text round trip)."""
    prompts = [ids[:8] for ids in encode(tok, [d.text for d in docs[:40]])]
    words = LogitsProcessorList([WordsOnly(tok, head(model).weight.shape[0])])
    out = sample_completions(model, tok, prompts, 64, seed=seed, logits_processor=words, progress=False)
    return [tok.decode(ids) for ids in out]


def test_kl_to_the_teacher_falls_during_distillation(env):
    base, tok, docs, method, _ = env
    windows = training_windows(tok, docs, 64)[-16:]
    student = marked(method, copy.deepcopy(base))
    before = mean_teacher_kl(base, base, method.greens, 3.0, windows)
    after = mean_teacher_kl(student, base, method.greens, 3.0, windows)
    assert after < 0.7 * before
    assert np.mean(method.losses[-20:]) < 0.7 * np.mean(method.losses[:20])


def test_bfloat16_autocast_distils_the_same_loss_in_lower_precision(env):
    base, tok, docs, method, _ = env
    ids = training_windows(tok, docs, 64)[:4]
    student = marked(method, copy.deepcopy(base))
    full = _kl_loss(base, method.greens, 3.0, "float32")(student, ids, ids).detach()
    low = _kl_loss(base, method.greens, 3.0, "bfloat16")(student, ids, ids).detach()
    assert low.dtype == torch.float32 and float(low) != float(full)  # autocast ran the passes in bfloat16
    assert float(low) == pytest.approx(float(full), rel=0.05)
    with pytest.raises(ValueError, match="autocast"):
        KGWDistilledConfig(autocast="float16")


def test_teacher_kl_is_zero_for_the_teacher_and_matches_its_definition():
    torch.manual_seed(0)
    base, student = torch.randn(3, 5, 11), torch.randn(3, 5, 11)
    green = torch.rand(3, 5, 11) < 0.3
    assert float(teacher_kl(base + 2.0 * green, base, green, 2.0)) == pytest.approx(0.0, abs=1e-6)
    p = torch.softmax(base.double() + 2.0 * green, -1)
    expected = (p * (p.log() - torch.log_softmax(student.double(), -1))).sum(-1).mean()
    assert float(teacher_kl(student, base, green, 2.0)) == pytest.approx(float(expected), rel=1e-5)


def test_distilled_samples_score_above_the_original_models(env):
    base, tok, docs, method, model_dir = env
    model = marked(method, load_model(str(model_dir))[0])
    wm = method.score(base, tok, sample(model, tok, docs, seed=2))
    plain = method.score(base, tok, sample(base, tok, docs, seed=2))
    z_wm, z_plain = [r.score for r in wm], [r.score for r in plain]
    assert np.mean(z_wm) > np.mean(z_plain) + 1.0
    assert np.mean([r.extra["llr"] for r in wm]) > np.mean([r.extra["llr"] for r in plain])


def test_p_values_are_roughly_uniform_on_independent_text(env):
    base, tok, _, method, _ = env
    rng = random.Random(7)
    texts = [" ".join(rng.choice(WORDS) for _ in range(80)) for _ in range(100)]
    p = np.array([r.p_value for r in method.score(base, tok, texts)])
    assert np.mean(p <= 0.05) < 0.2
    assert 0.25 < np.median(p) < 0.75


def test_apply_writes_the_distilled_weights_and_revert_restores_them_exactly(env):
    _, _, _, method, model_dir = env
    model, _ = load_model(str(model_dir))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    method.apply(model)
    params = dict(model.named_parameters())
    assert all(torch.equal(params[name], value) for name, value in method.weights.items())
    assert any(not torch.equal(model.state_dict()[k], before[k]) for k in before)
    with pytest.raises(RuntimeError):
        method.apply(model)
    method.revert(model)
    assert all(torch.equal(model.state_dict()[k], before[k]) for k in before)
    with pytest.raises(RuntimeError):
        method.revert(model)


def test_save_load_round_trip_reproduces_apply_and_scores(env, tmp_path):
    base, tok, docs, method, model_dir = env
    method.save(tmp_path)
    loaded = REGISTRY["kgw-distilled"]()
    loaded.load(tmp_path)
    assert loaded.config == method.config and loaded.trained_delta == 3.0
    first, second = marked(method, load_model(str(model_dir))[0]), marked(loaded, load_model(str(model_dir))[0])
    assert same_weights(first, second)
    texts = [d.text[:300] for d in docs[:4]]
    assert loaded.score(base, tok, texts) == method.score(base, tok, texts)


def test_another_delta_keeps_the_key_but_refuses_to_apply(env):
    base, tok, docs, method, model_dir = env
    model, _ = load_model(str(model_dir))
    other = method.with_strength(1.0)
    assert other.weights is method.weights and other.greens is method.greens
    with pytest.raises(ValueError, match="distilled at delta=3"):
        other.apply(model)
    same = method.with_strength(3.0)
    same.apply(model)
    same.revert(model)
    texts = [d.text[:300] for d in docs[:3]]
    z_other, z_same = other.score(base, tok, texts), same.score(base, tok, texts)
    assert [r.score for r in z_other] == [r.score for r in z_same]  # the z-test does not use delta
    assert [r.extra["llr"] for r in z_other] != [r.extra["llr"] for r in z_same]  # the LLR does


def test_the_distilled_model_leaves_the_base_model_untouched(env, tiny_model_dir):
    base, *_ = env
    fresh, _ = load_model(str(tiny_model_dir))
    assert same_weights(base, fresh)


def test_budget_is_validated():
    with pytest.raises(ValueError):
        create("kgw-distilled", steps=0)
    with pytest.raises(ValueError):
        create("kgw-distilled", optimizer="sgd")


def eval_config(model_dir, corpus_file, **overrides):
    """A tiny eval of kgw-distilled alone: 32 new tokens, no oracle."""
    from openstamp.lab.evaluation.config import EvalConfig

    return EvalConfig.from_dict(
        {
            "model": str(model_dir),
            "methods": ["kgw-distilled"],
            "corpus": str(corpus_file),
            "key_corpus": str(corpus_file),
            "n": 8,
            "prompt_tokens": 8,
            "new_tokens": 32,
            "batch_size": 4,
            "score_batch_size": 4,
            "oracle": "none",
            **overrides,
        }
    )


def test_eval_caches_the_key_and_the_finetune_attack_takes_it(model_dir, corpus_file, tmp_path):
    """kgw-distilled is weight-level: the eval saves its weights with the key, and the attack reloads them."""
    from openstamp.lab.attacks.finetune import FinetuneConfig, run_finetune
    from openstamp.lab.evaluation.pipeline import run_eval

    settings = {"delta": 3.0, **TINY_BUDGET}
    cfg = eval_config(
        model_dir, corpus_file, method_settings={"kgw-distilled": settings}, strengths={"kgw-distilled": 3.0}
    )
    run_eval(cfg, tmp_path / "eval", progress=False)
    key = tmp_path / "eval" / "keys" / "kgw-distilled" / "s0"
    assert (key / "key.safetensors").stat().st_size > 4 * sum(
        p.numel() for p in load_model(str(model_dir))[0].parameters()
    )
    attack = FinetuneConfig(corpus=str(corpus_file), steps=2, every=2, batch_size=2, seq_len=32, n=4, lr=1e-2)
    results = run_finetune(tmp_path / "eval", tmp_path / "ft", attack, progress=False)
    assert results["skipped"] == []
    assert {(r["method"], r["step"]) for r in results["runs"]} == {("kgw-distilled", 0), ("kgw-distilled", 2)}


def test_a_sweep_distils_one_key_per_delta_and_attacks_find_each(model_dir, corpus_file, tmp_path):
    """A key trained at its strength: the eval builds one per delta of the grid; no run reuses another's."""
    from safetensors.torch import load_file

    from openstamp.lab.attacks.common import load_method, open_eval
    from openstamp.lab.evaluation.pipeline import run_eval

    cfg = eval_config(
        model_dir,
        corpus_file,
        n=4,
        lengths=[],
        sweep=True,
        grids={"kgw-distilled": [2.0, 3.0]},
        method_settings={"kgw-distilled": {"delta": 3.0, **TINY_BUDGET, "steps": 20}},
    )
    results = run_eval(cfg, tmp_path, progress=False)
    keys = {p.parent.parent.name: p for p in (tmp_path / "keys").glob("*/s0/key.safetensors")}
    assert set(keys) == {"kgw-distilled", "kgw-distilled@2"}  # the default delta (3) keeps the plain name
    trained = {name: float(load_file(path)["trained_delta"][0]) for name, path in keys.items()}
    assert trained == {"kgw-distilled": 3.0, "kgw-distilled@2": 2.0}
    assert sorted(r["strength"] for r in results["runs"]) == [2.0, 3.0]
    ev = open_eval(tmp_path)
    base = load_model(str(model_dir))[0]
    for run in ev.runs:
        assert load_method(ev, run, base).trained_delta == run["strength"]


def test_a_key_distilled_before_autocast_existed_is_refused_under_bfloat16(model_dir, corpus_file, tmp_path):
    """A key saved without the autocast field was distilled in float32 (added_settings): the eval does not take it
    as a bfloat16 one, as it did when a missing field took today's default."""
    import json

    import pytest

    from openstamp.lab.evaluation.pipeline import run_eval

    settings = {"delta": 3.0, **TINY_BUDGET, "steps": 10}
    cfg = {"n": 4, "lengths": [], "strengths": {"kgw-distilled": 3.0}}
    for autocast, refused in (("bfloat16", True), ("float32", False)):
        out = tmp_path / autocast
        run = eval_config(
            model_dir, corpus_file, **cfg, method_settings={"kgw-distilled": {**settings, "autocast": autocast}}
        )
        run_eval(run, out, progress=False)
        path = out / "keys" / "kgw-distilled" / "s0" / "settings.json"
        saved = json.loads(path.read_text())
        assert saved.pop("autocast") == autocast
        path.write_text(json.dumps(saved))  # as a key saved before the field existed
        (out / "results.json").unlink()
        if refused:
            with pytest.raises(ValueError, match="autocast: 'float32' there, 'bfloat16' now"):
                run_eval(run, out, progress=False)
        else:
            assert run_eval(run, out, progress=False)["runs"][0]["settings"]["autocast"] == "float32"


def test_distillation_shows_its_steps_and_loss_on_a_progress_bar(tiny_model_dir, corpus_file, capsys):
    base, tok = load_model(str(tiny_model_dir))
    method = create("kgw-distilled", delta=3.0, **{**TINY_BUDGET, "steps": 3})
    method.build(base, tok, load_documents(str(corpus_file)), seed=0)
    err = capsys.readouterr().err
    assert "distilling (delta 3)" in err and "3/3" in err and "loss=" in err
