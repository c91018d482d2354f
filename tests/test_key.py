import dataclasses
import json
import os
import stat

import pytest
import torch

from openstamp.key import InvalidKeyError, WatermarkKey


def make_key(d=16, L=6, V=100, projection=True, seed=0) -> WatermarkKey:
    g = torch.Generator().manual_seed(seed)
    return WatermarkKey(
        secret=bytes(range(32)),
        selector=torch.randn(L, d, generator=g),
        projection=torch.randn(d, d, generator=g) if projection else None,
        gamma=0.25,
        delta=1.5,
        vocab_size=V,
        never_green=[0, 99],
        meta={"note": "test"},
    )


@pytest.mark.parametrize("projection", [True, False])
def test_low_rank_offset_equals_materialised_offset(projection):
    key = make_key(projection=projection)
    h = torch.randn(5, 7, 16, generator=torch.Generator().manual_seed(1))
    low_rank = key.watermark_logits(h)
    dense = h @ key.delta_w().T
    assert low_rank.shape == (5, 7, 100)
    torch.testing.assert_close(low_rank, dense, rtol=1e-5, atol=1e-5)


def test_offset_is_delta_times_green_mixture():
    key = make_key(projection=False)
    h = torch.randn(3, 16)
    s = h @ key.selector.T
    expected = 1.5 * s @ key.green.float().T
    torch.testing.assert_close(key.watermark_logits(h), expected)
    assert not key.green[[0, 99]].any()


def test_save_and_load_round_trip(tmp_path):
    key = make_key()
    key.save(tmp_path / "key")
    loaded = WatermarkKey.load(tmp_path / "key")
    assert loaded.secret == key.secret
    assert torch.equal(loaded.selector, key.selector) and torch.equal(loaded.projection, key.projection)
    assert loaded.key_id == key.key_id and loaded.meta["note"] == "test"
    assert torch.equal(loaded.green, key.green)


def test_secret_is_private_and_absent_from_metadata(tmp_path):
    key = make_key()
    key.save(tmp_path / "key")
    mode = stat.S_IMODE(os.stat(tmp_path / "key" / "secret").st_mode)
    assert mode == 0o600
    header = (tmp_path / "key" / "key.json").read_bytes()
    assert key.secret.hex().encode() not in header and key.secret not in header


def test_missing_and_corrupt_keys_give_clear_errors(tmp_path):
    with pytest.raises(InvalidKeyError, match="does not exist"):
        WatermarkKey.load(tmp_path / "nope")
    key = make_key()
    key.save(tmp_path / "key")
    (tmp_path / "key" / "key.safetensors").write_bytes(b"garbage")
    with pytest.raises(InvalidKeyError, match="corrupt"):
        WatermarkKey.load(tmp_path / "key")


def test_tampered_secret_is_detected(tmp_path):
    key = make_key()
    key.save(tmp_path / "key")
    (tmp_path / "key" / "secret").write_bytes(bytes(32))
    with pytest.raises(InvalidKeyError, match="key id"):
        WatermarkKey.load(tmp_path / "key")


def test_corrupt_json_is_reported(tmp_path):
    make_key().save(tmp_path / "key")
    (tmp_path / "key" / "key.json").write_text("{not json")
    with pytest.raises(InvalidKeyError, match="corrupt"):
        WatermarkKey.load(tmp_path / "key")


def test_short_secret_is_refused():
    with pytest.raises(ValueError, match="16 bytes"):
        WatermarkKey(secret=b"short", selector=torch.zeros(2, 4), projection=None, gamma=0.25, delta=1.0, vocab_size=10)


def test_the_key_id_covers_every_number_that_shapes_dw():
    import dataclasses

    key = make_key()
    for change in ({"delta": 2.0}, {"gamma": 0.5}, {"vocab_size": 101}, {"never_green": [0]}):
        assert dataclasses.replace(key, **change).key_id != key.key_id, change
    assert dataclasses.replace(key, meta={}).key_id == key.key_id


@pytest.mark.parametrize(
    ("field", "value"),
    [("delta", 3.0), ("gamma", 0.5), ("vocab_size", 101), ("never_green", [0]), ("n_lists", 7), ("hidden_size", 8)],
)
def test_a_hand_edited_header_is_refused(tmp_path, field, value):
    make_key().save(tmp_path / "key")
    path = tmp_path / "key" / "key.json"
    header = json.loads(path.read_text())
    path.write_text(json.dumps({**header, field: value}))
    with pytest.raises(InvalidKeyError, match="key id differs"):
        WatermarkKey.load(tmp_path / "key")


def test_an_edited_model_record_is_refused(tmp_path):
    key = make_key()
    key.meta["model"] = {"tied": True, "tied_head": "retie"}
    key.save(tmp_path / "key")
    path = tmp_path / "key" / "key.json"
    header = json.loads(path.read_text())
    header["model"]["tied_head"] = "untie"
    path.write_text(json.dumps(header))
    with pytest.raises(InvalidKeyError, match="edited"):
        WatermarkKey.load(tmp_path / "key")


@pytest.mark.parametrize("field", ["gamma", "delta", "vocab_size", "key_id", "checksum", "n_lists"])
def test_a_missing_field_gives_a_one_line_error(tmp_path, field):
    make_key().save(tmp_path / "key")
    path = tmp_path / "key" / "key.json"
    header = json.loads(path.read_text())
    del header[field]
    path.write_text(json.dumps(header))
    with pytest.raises(InvalidKeyError, match=f"lacks {field}") as err:
        WatermarkKey.load(tmp_path / "key")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "content", ["{not json", "[1, 2]", '{"format": 2, "prf_version": "x"}', "\udcff".encode("utf-8", "surrogateescape")]
)
def test_a_corrupt_key_json_gives_invalid_key_error(tmp_path, content):
    from openstamp.key.prf import PRF_VERSION

    make_key().save(tmp_path / "key")
    path = tmp_path / "key" / "key.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content.replace('"x"', json.dumps(PRF_VERSION)))
    with pytest.raises(InvalidKeyError) as err:
        WatermarkKey.load(tmp_path / "key")
    assert "\n" not in str(err.value)


def test_a_missing_tensor_or_a_wrong_type_gives_invalid_key_error(tmp_path):
    from safetensors.torch import save_file

    key = make_key()
    key.save(tmp_path / "key")
    save_file({"selector": key.selector}, str(tmp_path / "key" / "key.safetensors"))  # P is gone
    with pytest.raises(InvalidKeyError, match="lacks the projection tensor"):
        WatermarkKey.load(tmp_path / "key")
    save_file({"other": key.selector}, str(tmp_path / "key" / "key.safetensors"))
    with pytest.raises(InvalidKeyError, match="lacks the selector tensor"):
        WatermarkKey.load(tmp_path / "key")
    key.save(tmp_path / "key2")
    path = tmp_path / "key2" / "key.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), "delta": "strong"}))
    with pytest.raises(InvalidKeyError, match="corrupt"):
        WatermarkKey.load(tmp_path / "key2")


def test_a_format_1_key_still_loads(tmp_path):
    key = make_key()
    key.save(tmp_path / "key")
    path = tmp_path / "key" / "key.json"
    header = json.loads(path.read_text())
    del header["checksum"]
    path.write_text(json.dumps({**header, "format": 1, "key_id": key._legacy_key_id()}))
    assert WatermarkKey.load(tmp_path / "key").key_id == key.key_id


def centred(key: WatermarkKey, seed: int = 3) -> WatermarkKey:
    w = torch.rand(key.vocab_size, generator=torch.Generator().manual_seed(seed))
    return dataclasses.replace(key, centring=key.green_float.T @ (w / w.sum())), w / w.sum()


def test_a_centred_offset_has_a_zero_mean_row_and_the_same_output_distributions():
    key = make_key()
    centre, w = centred(key)
    assert torch.linalg.vector_norm(w @ key.delta_w()) > 0.1  # the plain offset moves the mean row
    torch.testing.assert_close(w @ centre.delta_w(), torch.zeros(16), rtol=0, atol=1e-5)
    u = torch.randn(100, 16, generator=torch.Generator().manual_seed(4))
    h = torch.randn(9, 16, generator=torch.Generator().manual_seed(5))
    plain = torch.log_softmax(h @ (u + key.delta_w()).T, dim=-1)
    torch.testing.assert_close(torch.log_softmax(h @ (u + centre.delta_w()).T, dim=-1), plain, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(centre.delta_w(), key.delta_w(), atol=1e-3)


def test_a_centred_key_round_trips_with_its_own_id_and_format(tmp_path):
    key = make_key()
    centre, _ = centred(key)
    assert centre.key_id != key.key_id
    centre.save(tmp_path / "k")
    assert json.loads((tmp_path / "k" / "key.json").read_text())["format"] == 3
    loaded = WatermarkKey.load(tmp_path / "k")
    torch.testing.assert_close(loaded.centring, centre.centring, rtol=0, atol=0)
    torch.testing.assert_close(loaded.delta_w(), centre.delta_w(), rtol=0, atol=0)
    key.save(tmp_path / "plain")  # an uncentred key keeps format 2, which earlier versions read
    assert json.loads((tmp_path / "plain" / "key.json").read_text())["format"] == 2
    assert WatermarkKey.load(tmp_path / "plain").centring is None


def test_a_key_written_by_version_0_1_0_still_loads_and_detects(tokenizer):
    """tests/data/key-0.1.0 was written by openstamp 0.1.0 (commit 2c9ae76, before the default profile changed):
    build_key on conftest's tied tiny model (seed 0, the ``small`` profile cut down as in ``tiny_config``, secret
    42 * 32 bytes, delta 2), with a seeded orthogonal P set by hand so the file holds a projection as the old
    default keys did, then save."""
    from conftest import make_model

    from openstamp.config import DetectConfig
    from openstamp.detect import Detector
    from openstamp.model.generate import sample_completions
    from openstamp.model.patch import apply_watermark

    key = WatermarkKey.load(os.path.join(os.path.dirname(__file__), "data", "key-0.1.0"))
    header = json.loads(open(os.path.join(os.path.dirname(__file__), "data", "key-0.1.0", "key.json")).read())
    assert key.key_id == header["key_id"] and key.projection is not None and key.centring is None
    assert key.meta["config"]["profile"] == "small" and header["format"] == 2
    base = make_model(True, vocab_size=len(tokenizer) + 12)
    released = make_model(True, vocab_size=len(tokenizer) + 12)
    apply_watermark(released, key)  # the recorded fingerprint is this model's head: check_key passes
    prompts = [[5 + i, 9, 12, 30 + i] for i in range(12)]
    wm = sample_completions(released, tokenizer, prompts, 40, seed=0, progress=False)
    plain = sample_completions(base, tokenizer, prompts, 40, seed=0, progress=False)
    detector = Detector(released, tokenizer, key, DetectConfig(min_tokens=8))
    wm_scores = [r.score for r in detector.detect(wm)]
    plain_scores = [r.score for r in detector.detect(plain)]
    assert sum(wm_scores) / len(wm_scores) > sum(plain_scores) / len(plain_scores) + 0.2
