"""The real packaged SmolLM2-135M, end to end with the small profile (about a minute on a CPU)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from openstamp import DetectConfig, Detector, WatermarkKey, embed, load_documents, load_model, load_profile
from openstamp.model.generate import sample_completions
from openstamp.model.patch import check_key, head, is_tied
from openstamp.model.text import prompt_windows

pytestmark = pytest.mark.slow


def test_packaged_model_embed_release_generate_detect(tmp_path):
    embed(
        "smollm2-135m",
        "wikipedia",
        tmp_path / "model",
        tmp_path / "key",
        load_profile("small"),
        progress=False,
    )
    key = WatermarkKey.load(tmp_path / "key")
    base, tokenizer = load_model("smollm2-135m")
    released = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()  # plain transformers

    # SmolLM2 ties its head: the release is re-tied, one tensor U~ shared with the input embeddings
    assert is_tied(released) and key.meta["model"]["tied_head"] == "retie" and not key.meta["warnings"]
    torch.testing.assert_close(head(released).weight, head(base).weight + key.delta_w(), rtol=0, atol=1e-5)
    assert check_key(released, key) == "watermarked" and check_key(base, key) == "original"
    assert key.meta["stats"]["selector"]["effective_strength"] > 0
    assert key.meta["corpus"]["n_documents"] == len(key.meta["corpus"]["documents"]) > 10

    texts = [d.text for d in load_documents("news")[:40]]
    prompts = [p for p, _ in prompt_windows(tokenizer, texts, 24, 64, limit=8)]
    detector = Detector(released, tokenizer, key, DetectConfig(min_tokens=16))
    scores = {}
    for name, model in (("watermarked", released), ("original", base)):
        ids = sample_completions(model, tokenizer, prompts, 64, seed=0, progress=False)
        results = detector.detect(tokenizer.batch_decode(ids, skip_special_tokens=True))
        scores[name] = sum(r.score for r in results) / len(results)
    assert scores["watermarked"] > scores["original"] + 0.1
