"""transformers' detector shape: the adapter's fields are the Detector's, as batched numpy arrays."""

import numpy as np
import pytest
import torch
from transformers.generation import WatermarkDetectorOutput as HFOutput

import openstamp
from openstamp.config import DetectConfig
from openstamp.detect import Detector
from openstamp.key.key import WatermarkKey

TRANSFORMERS_FIELDS = ("num_tokens_scored", "num_green_tokens", "green_fraction", "z_score", "p_value", "prediction")


@pytest.fixture(scope="module")
def models(release):
    config = DetectConfig(min_tokens=4)
    adapter = openstamp.WatermarkDetector.from_pretrained(str(release / "model"), str(release / "key"), config)
    return adapter, adapter.detector


def test_fields_equal_the_detectors(models, release):
    adapter, detector = models
    tok = detector.tokenizer
    texts = ["the river city council voted on a new plan for public parks and schools", "parks"]
    batch = tok(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    out = adapter(batch["input_ids"], return_dict=True, attention_mask=batch["attention_mask"])
    assert isinstance(out, HFOutput) and isinstance(out, openstamp.WatermarkDetectorOutput)
    for name in (*TRANSFORMERS_FIELDS, "confidence", "llr", "test"):
        assert isinstance(getattr(out, name), np.ndarray) and getattr(out, name).shape == (2,)
    results = detector.detect(texts)
    for i, r in enumerate(results):
        assert out.num_tokens_scored[i] == r.n_tokens and out.prediction[i] == bool(r.decision)
        if r.status != "ok":
            assert np.isnan(out.p_value[i]) and np.isnan(out.llr[i])
            continue
        assert out.llr[i] == pytest.approx(r.score) and out.p_value[i] == pytest.approx(r.p_value)
        assert out.z_score[i] == pytest.approx(r.detectors["permutation_z"])
        assert out.green_fraction[i] == pytest.approx(r.detectors["green_fraction"])
        assert out.confidence[i] == pytest.approx(1 - r.p_value) and out.test[i] == r.test
    assert results[1].status == "too_short"
    np.testing.assert_array_equal(adapter(batch["input_ids"], attention_mask=batch["attention_mask"]), out.prediction)


def test_a_leading_bos_is_dropped_and_z_threshold_sets_the_prediction(models):
    adapter, detector = models
    ids = detector.tokenizer("the river city council voted on a new plan", add_special_tokens=False).input_ids
    bos = detector.tokenizer.bos_token_id
    with_bos = adapter(torch.tensor([[bos, *ids]]), return_dict=True)
    plain = adapter(torch.tensor([ids]), return_dict=True)
    assert with_bos.llr == pytest.approx(plain.llr)
    assert adapter(torch.tensor([ids]), z_threshold=-1e9).tolist() == [True]
    with pytest.raises(ValueError, match="batch_size"):
        adapter(torch.tensor(ids))


def test_built_from_a_key_and_a_model(models, release):
    _, detector = models
    adapter = openstamp.WatermarkDetector(detector.model, detector.tokenizer, WatermarkKey.load(release / "key"))
    assert isinstance(adapter.detector, Detector)
