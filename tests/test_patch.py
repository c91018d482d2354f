import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from openstamp.key import KeyMismatchError, WatermarkKey
from openstamp.patch import apply_watermark, check_key, head, is_tied, revert_watermark
from openstamp.watermark import record_model


def load(path, dtype=torch.float32):
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def key_for(model, seed=0) -> WatermarkKey:
    V, d = head(model).weight.shape
    g = torch.Generator().manual_seed(seed)
    return WatermarkKey(
        secret=bytes([seed]) * 32,
        selector=torch.randn(6, d, generator=g),
        projection=torch.randn(d, d, generator=g) / d**0.5,
        gamma=0.25,
        delta=1.0,
        vocab_size=V,
    )


def watermark(model, seed=0):
    key = key_for(model, seed)
    tied, original = is_tied(model), head(model).weight.detach().clone()
    apply_watermark(model, key)
    record_model(key, model, "tiny", original, tied)
    return key, original


def test_apply_adds_the_offset_and_keeps_input_embeddings(tiny_model_dir):
    model = load(tiny_model_dir)
    embeddings = model.get_input_embeddings().weight.detach().clone()
    key, original = watermark(model)
    assert not is_tied(model)
    assert torch.equal(model.get_input_embeddings().weight, embeddings)
    torch.testing.assert_close(head(model).weight, original + key.delta_w(), rtol=0, atol=1e-6)
    assert not torch.equal(head(model).weight, original)


def test_apply_then_revert_round_trips_exactly(tiny_model_dir):
    model = load(tiny_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    was_tied = is_tied(model)
    key, _ = watermark(model)
    assert revert_watermark(model, key) == "exact"
    assert is_tied(model) == was_tied
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_exported_checkpoint_is_plain_and_matches_in_memory_logits(tiny_model_dir, tmp_path):
    model = load(tiny_model_dir)
    key, _ = watermark(model)
    model.save_pretrained(tmp_path / "release")
    released = load(tmp_path / "release")  # plain transformers, nothing from OpenStamp
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(released(ids).logits, model(ids).logits, rtol=0, atol=0)
    names = set()
    for f in (tmp_path / "release").glob("*.safetensors"):
        with safe_open(f, "pt") as fh:
            names |= set(fh.keys())
    assert not any("selector" in n or "projection" in n for n in names)
    for f in (tmp_path / "release").iterdir():
        assert key.secret not in f.read_bytes()


def test_revert_of_a_reloaded_checkpoint(tiny_model_dir, tmp_path):
    base = load(tiny_model_dir)
    model = load(tiny_model_dir)
    key, original = watermark(model)
    model.save_pretrained(tmp_path / "release")
    released = load(tmp_path / "release")
    how = revert_watermark(released, key)
    if key.meta["model"]["tied"]:
        assert how == "exact" and torch.equal(head(released).weight, original)
    else:
        assert how == "subtracted"
        torch.testing.assert_close(head(released).weight, original, rtol=0, atol=1e-6)
    again = load(tmp_path / "release")
    assert revert_watermark(again, key, base=base) == "exact"
    assert torch.equal(head(again).weight, original)


def test_key_check_accepts_its_models_and_rejects_others(tiny_model_dir, tmp_path):
    base = load(tiny_model_dir)
    model = load(tiny_model_dir)
    key, _ = watermark(model)
    model.save_pretrained(tmp_path / "release")
    assert check_key(load(tmp_path / "release"), key) == "watermarked"
    assert check_key(load(tmp_path / "release", torch.bfloat16), key) == "watermarked"
    assert check_key(base, key) == "original"
    other = load(tiny_model_dir)
    other_key, _ = watermark(other, seed=1)
    with pytest.raises(KeyMismatchError, match="wrong key"):
        check_key(other, key)


def test_double_apply_is_refused(tiny_model_dir):
    model = load(tiny_model_dir)
    key, _ = watermark(model)
    with pytest.raises(ValueError, match="already carries"):
        apply_watermark(model, key)


def test_shape_mismatch_is_refused(tiny_model_dir):
    model = load(tiny_model_dir)
    key = key_for(model)
    bad = WatermarkKey(
        secret=key.secret,
        selector=torch.zeros(3, 8),
        projection=None,
        gamma=0.25,
        delta=1.0,
        vocab_size=key.vocab_size,
    )
    with pytest.raises(KeyMismatchError, match="shape"):
        apply_watermark(model, bad)
