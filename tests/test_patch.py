import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from openstamp.key import KeyMismatchError, WatermarkKey
from openstamp.model.patch import (
    TIED_WARNING,
    apply_watermark,
    check_key,
    head,
    is_tied,
    revert_watermark,
    tied_head_mode,
)

MODES = ("retie", "untie")


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


def watermark(model, seed=0, mode="retie"):
    key = key_for(model, seed)
    original = head(model).weight.detach().clone()
    apply_watermark(model, key, mode, source="tiny")
    return key, original


def tensors(directory) -> dict[str, torch.Tensor]:
    out = {}
    for f in directory.glob("*.safetensors"):
        with safe_open(f, "pt") as fh:
            out |= {n: fh.get_tensor(n) for n in fh.keys()}
    return out


@pytest.mark.parametrize("mode", MODES)
def test_apply_adds_the_offset_and_records_the_mode(tiny_model_dir, mode):
    model = load(tiny_model_dir)
    tied = is_tied(model)
    embeddings = model.get_input_embeddings().weight.detach().clone()
    key, original = watermark(model, mode=mode)
    torch.testing.assert_close(head(model).weight, original + key.delta_w(), rtol=0, atol=1e-6)
    assert not torch.equal(head(model).weight, original)
    assert key.meta["model"]["tied"] == tied
    assert tied_head_mode(key) == (mode if tied else "untied-base")
    assert (TIED_WARNING in key.meta["warnings"]) == (tied and mode == "untie")
    if tied and mode == "retie":  # one shared tensor, now U~, and the config still says tied
        assert is_tied(model) and model.config.tie_word_embeddings
        assert torch.equal(model.get_input_embeddings().weight, head(model).weight)
    else:  # the input embeddings are untouched
        assert not is_tied(model) and not model.config.tie_word_embeddings
        assert torch.equal(model.get_input_embeddings().weight, embeddings)


@pytest.mark.parametrize("mode", MODES)
def test_apply_then_revert_round_trips_exactly(tiny_model_dir, mode):
    model = load(tiny_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    was_tied = is_tied(model)
    key, _ = watermark(model, mode=mode)
    assert revert_watermark(model, key) == "exact"
    assert is_tied(model) == was_tied and model.config.tie_word_embeddings == was_tied
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("mode", MODES)
def test_exported_checkpoint_is_plain_and_matches_in_memory_logits(tiny_model_dir, tmp_path, mode):
    base_tensors = tensors(tiny_model_dir)
    model = load(tiny_model_dir)
    key, original = watermark(model, mode=mode)
    model.save_pretrained(tmp_path / "release")
    released = load(tmp_path / "release")  # plain transformers, nothing from OpenStamp
    ids = torch.randint(3, 200, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(released(ids).logits, model(ids).logits, rtol=0, atol=0)
    saved = tensors(tmp_path / "release")
    assert not any("selector" in n or "projection" in n for n in saved)
    for f in (tmp_path / "release").iterdir():
        assert key.secret not in f.read_bytes()
    if tied_head_mode(key) == "retie":  # the base's tensors, one of them changed, and no copy of U
        assert set(saved) == set(base_tensors) and is_tied(released)
        assert not any(torch.equal(t, original) for t in saved.values())
    if tied_head_mode(key) == "untie":  # the leak: the embeddings are U
        assert any(torch.equal(t, original) for t in saved.values())


@pytest.mark.parametrize("mode", MODES)
def test_revert_of_a_reloaded_checkpoint(tiny_model_dir, tmp_path, mode):
    base = load(tiny_model_dir)
    model = load(tiny_model_dir)
    key, original = watermark(model, mode=mode)
    model.save_pretrained(tmp_path / "release")
    released = load(tmp_path / "release")
    how = revert_watermark(released, key)
    if tied_head_mode(key) == "untie":
        assert how == "exact" and torch.equal(head(released).weight, original) and is_tied(released)
    else:
        assert how == "subtracted"
        torch.testing.assert_close(head(released).weight, original, rtol=0, atol=1e-6)
        # re-tied: the input embeddings are the same tensor, so they are restored too
        assert is_tied(released) == is_tied(base)
    again = load(tmp_path / "release")
    assert revert_watermark(again, key, base=base) == "exact"
    assert torch.equal(head(again).weight, original)


@pytest.mark.parametrize("mode", MODES)
def test_key_check_accepts_its_models_and_rejects_others(tiny_model_dir, tmp_path, mode):
    base = load(tiny_model_dir)
    model = load(tiny_model_dir)
    key, _ = watermark(model, mode=mode)
    model.save_pretrained(tmp_path / "release")
    assert check_key(load(tmp_path / "release"), key) == "watermarked"
    assert check_key(load(tmp_path / "release", torch.bfloat16), key) == "watermarked"
    assert check_key(base, key) == "original"
    other = load(tiny_model_dir)
    watermark(other, seed=1, mode=mode)
    with pytest.raises(KeyMismatchError, match="wrong key.*--force"):
        check_key(other, key)


def test_a_key_without_fingerprints_is_refused_with_a_hint(tiny_model_dir):
    model = load(tiny_model_dir)
    with pytest.raises(KeyMismatchError, match="no model fingerprint.*--force"):
        check_key(model, key_for(model))


def test_a_key_refuses_a_model_it_was_not_made_for(tiny_model_dir):
    from conftest import make_model

    model = load(tiny_model_dir)
    key, _ = watermark(model)
    V, d = head(model).weight.shape
    other = make_model(tied=is_tied(model), vocab_size=V, hidden=d, seed=9)
    with pytest.raises(KeyMismatchError, match="another original"):
        apply_watermark(other, key)


def test_double_apply_and_bad_modes_are_refused(tiny_model_dir):
    model = load(tiny_model_dir)
    key, _ = watermark(model)
    with pytest.raises(ValueError, match="already carries"):
        apply_watermark(model, key)
    with pytest.raises(ValueError, match="tied_head"):
        apply_watermark(load(tiny_model_dir), key, "keep")


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


def test_a_key_derived_with_another_delta_records_its_own_fingerprints(tiny_model_dir):
    import dataclasses

    base = load(tiny_model_dir)
    model = load(tiny_model_dir)
    parent, _ = watermark(model)
    child = dataclasses.replace(parent, delta=2.0, meta=dict(parent.meta))  # the eval's strength sweep
    assert child.key_id != parent.key_id
    with pytest.raises(KeyMismatchError):  # the parent's watermarked head is not the child's
        check_key(model, child)
    assert check_key(base, child) == "original"
    apply_watermark(base, child)
    assert check_key(base, child) == "watermarked" and check_key(model, parent) == "watermarked"
    assert child.meta["fingerprint"] != parent.meta["fingerprint"]


def test_a_retied_release_whose_embeddings_move_as_much_as_the_head_is_warned_about(tiny_model_dir):
    """On Qwen2.5-Coder-0.5B the default delta gives ||dW|| / ||U|| of about 1.1, and the re-tied release's text
    falls apart; embed records the ratio and warns above RETIE_SHIFT_WARN."""
    import dataclasses

    from openstamp.model.patch import RETIE_SHIFT_WARN

    model = load(tiny_model_dir)
    base = key_for(model)
    ratio_at_1 = float(base.delta_w().norm() / head(model).weight.detach().norm())
    small = dataclasses.replace(base, delta=0.5 * RETIE_SHIFT_WARN / ratio_at_1)
    large = dataclasses.replace(base, delta=2.0 * RETIE_SHIFT_WARN / ratio_at_1)
    for key, warned in ((small, False), (large, True)):
        m = load(tiny_model_dir)
        apply_watermark(m, key, "retie", source="tiny")
        assert key.meta["offset_to_head"] == pytest.approx(ratio_at_1 * key.delta, rel=1e-4)
        if is_tied(m):
            assert any("re-tied release" in w for w in key.meta["warnings"]) == warned
        else:  # an untied base keeps its input embeddings: nothing to warn about
            assert not any("re-tied release" in w for w in key.meta["warnings"])
