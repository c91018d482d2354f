"""Re-tied releases of a tied model (the default) against the leaky untie export, end to end."""

import json

import pytest
import torch
from conftest import SMALL_EMBED, fixed_secret, saved_tensors
from sklearn.metrics import roc_auc_score
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.config import DetectConfig
from openstamp.corpus import load_documents
from openstamp.detect import Detector
from openstamp.embed.build import build_key
from openstamp.key import WatermarkKey
from openstamp.lab.hidden import HiddenCache, reusing
from openstamp.lab.methods import create
from openstamp.model.generate import sample_completions
from openstamp.model.load import load_model
from openstamp.model.patch import TIED_WARNING, apply_watermark, head, is_tied, revert_watermark, tied_head_mode

runner = CliRunner()


def test_a_tied_model_embeds_re_tied_by_default(retied, tied_dir):
    base, release = saved_tensors(tied_dir), saved_tensors(retied / "model")
    original = base["model.embed_tokens.weight"]
    assert set(release) == set(base)  # the base's tensors: one unembedding, no lm_head copy
    assert not any(torch.equal(t, original) for t in release.values())
    assert json.loads((retied / "model" / "config.json").read_text())["tie_word_embeddings"] is True
    key = WatermarkKey.load(retied / "key")
    assert tied_head_mode(key) == "retie" and TIED_WARNING not in key.meta["warnings"]  # no leak to warn of
    model = AutoModelForCausalLM.from_pretrained(retied / "model").eval()
    assert is_tied(model)
    torch.testing.assert_close(head(model).weight, original + key.delta_w(), rtol=0, atol=1e-6)


def test_detection_separates_re_tied_samples_on_the_release_and_on_the_base(retied, tied_dir, corpus_file):
    release, tok = load_model(str(retied / "model"))
    base, _ = load_model(str(tied_dir))
    before = base.get_input_embeddings().weight.clone()
    key = WatermarkKey.load(retied / "key")
    docs = load_documents(str(corpus_file))
    prompts = [ids[:8] for ids in tok([d.text for d in docs[:24]], add_special_tokens=False).input_ids]
    wm = sample_completions(release, tok, prompts, 48, seed=0, progress=False)
    plain = sample_completions(base, tok, prompts, 48, seed=0, progress=False)
    on_release = Detector(release, tok, key).detect(wm + plain)
    on_base = Detector(base, tok, key).detect(wm + plain)  # the owner's original model and the key
    assert torch.equal(base.get_input_embeddings().weight, before) and is_tied(base)  # left as it was
    for a, b in zip(on_release, on_base, strict=True):
        assert a.score == pytest.approx(b.score, rel=1e-4, abs=1e-5) and a.p_value == b.p_value
    scores = [r.score for r in on_release]
    assert roc_auc_score([1] * len(wm) + [0] * len(plain), scores) > 0.9
    assert sum(r.decision for r in on_release[: len(wm)]) > sum(r.decision for r in on_release[len(wm) :])


def test_the_eval_scores_cut_texts_of_a_re_tied_key_from_the_release_states_it_cached(retied, tied_dir, corpus_file):
    base, tok = load_model(str(tied_dir))
    key = WatermarkKey.load(retied / "key")
    ids = tok([d.text for d in load_documents(str(corpus_file))[:6]], add_special_tokens=False).input_ids
    # cut where a word ends, so each cut text re-tokenises to a prefix of its full text
    cuts = [next(i for i in range(24, len(x)) if tok.convert_ids_to_tokens(x[i]).startswith("Ġ")) for x in ids]
    full = tok.batch_decode([x[:64] for x in ids])
    cut = tok.batch_decode([x[:c] for x, c in zip(ids, cuts, strict=True)])
    method = create("openstamp-projected", min_tokens=8)
    method.key = key
    cache = HiddenCache()
    with reusing(cache):
        method.score(base, tok, full, batch_size=4)
        misses = cache.misses
        reused = method.score(base, tok, cut, batch_size=4)
    assert cache.misses == misses and cache.prefix_hits == 2  # two batches of cut texts, no decoder run
    fresh = create("openstamp-projected", min_tokens=8)
    fresh.key = key
    for a, b in zip(reused, fresh.score(base, tok, cut, batch_size=4), strict=True):
        assert a.score == pytest.approx(b.score, rel=1e-4, abs=1e-5) and a.p_value == b.p_value
    rekeyed = method.with_strength(3.0)  # another delta is another release: its own copy, never the cached one
    assert rekeyed.score(base, tok, cut, batch_size=4)[0].score != reused[0].score


def test_revert_of_a_re_tied_release_restores_both_embeddings(retied, tied_dir):
    release = AutoModelForCausalLM.from_pretrained(retied / "model").eval()
    original = saved_tensors(tied_dir)["model.embed_tokens.weight"]
    assert revert_watermark(release, WatermarkKey.load(retied / "key")) == "subtracted"
    assert is_tied(release)
    torch.testing.assert_close(release.get_input_embeddings().weight, original, rtol=0, atol=1e-6)


def test_the_documented_low_level_flow_gives_a_key_the_detector_accepts(
    tiny_model_dir, corpus_file, tiny_config, tmp_path
):
    model, tok = load_model(str(tiny_model_dir))
    key = build_key(model, tok, load_documents(str(corpus_file)), tiny_config, progress=False)
    apply_watermark(model, key)  # records the fingerprints: no separate step to forget
    key.save(tmp_path / "key")
    model.save_pretrained(tmp_path / "model")
    tok.save_pretrained(tmp_path / "model")
    detector = Detector.from_pretrained(str(tmp_path / "model"), str(tmp_path / "key"), DetectConfig(min_tokens=4))
    assert detector.head_is_watermarked
    assert detector.detect([[5, 6, 7, 8, 9, 10]])[0].status == "ok"


def test_cli_untie_is_explicit_and_warns(tied_dir, corpus_file, tmp_path):
    base = ["embed", "--model", str(tied_dir), "--corpus", str(corpus_file), *SMALL_EMBED, *fixed_secret(tmp_path, 13)]
    out = ["--out", str(tmp_path / "m"), "--key", str(tmp_path / "k")]
    result = runner.invoke(app, [*base, *out, "--tied-head", "untie"])
    assert result.exit_code == 0, result.output
    assert "tied head: untie" in result.output and "subtract the watermark" in result.output
    assert tied_head_mode(WatermarkKey.load(tmp_path / "k")) == "untie"
    bad = runner.invoke(app, [*base, "--out", str(tmp_path / "m2"), "--key", str(tmp_path / "k2"), "--tied-head", "x"])
    assert bad.exit_code == 2 and "tied_head must be one of retie, untie" in bad.output
    assert not (tmp_path / "k2").exists()
