"""The calibrated threshold is split conformal: its false-positive rate on exchangeable text is at most alpha."""

import numpy as np
import pytest
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.detect.calibrate import calibrated_threshold, empirical_thresholds
from openstamp.detect.rates import conformal_threshold, texts_needed, threshold_at_fpr


def exact_rate(threshold, n: int, alpha: float, draws: int = 20000) -> float:
    """Mean over ``draws`` reference sets of n uniform scores of the exact rate P(U > tau) = 1 - tau."""
    rng = np.random.default_rng(0)
    sets = rng.uniform(size=(draws, n))
    return float(np.mean([1 - threshold(s, alpha) for s in sets]))


@pytest.mark.parametrize(("n", "alpha"), [(999, 0.001), (1500, 0.001), (150, 0.01), (99, 0.01), (60, 0.05)])
def test_the_conformal_rate_is_at_most_alpha_where_the_plug_in_rate_is_above(n, alpha):
    """Over reference sets the rate of the k-th smallest of n uniforms is 1 - k/(n + 1): at most alpha (to Monte
    Carlo error) for the conformal k, above alpha for the plug-in threshold_at_fpr."""
    k = int(np.ceil(round((1 - alpha) * (n + 1), 9)))
    expected = 1 - k / (n + 1)
    assert expected <= alpha + 1e-12
    conformal = exact_rate(conformal_threshold, n, alpha)
    assert abs(conformal - expected) < 4 * expected / np.sqrt(20000) + 1e-9  # sd of one draw's rate ~ its mean
    plug_in = (np.floor(alpha * n) + 1) / (n + 1)  # what 0.3.0 stored: above alpha unless alpha n < 1
    assert abs(exact_rate(threshold_at_fpr, n, alpha) - plug_in) < 4 * plug_in / np.sqrt(20000)
    assert plug_in > alpha or alpha * n < 1


def test_conformal_threshold_picks_the_order_statistic_and_refuses_too_few_texts():
    scores = np.arange(1.0, 101.0)[::-1]  # 1..100 in any order
    assert conformal_threshold(scores, 0.01) == 100.0  # k = ceil(0.99 * 101) = 100: the maximum
    assert conformal_threshold(scores, 0.05) == 96.0  # k = ceil(0.95 * 101) = 96
    assert conformal_threshold(np.arange(98.0), 0.01) is None and texts_needed(0.01) == 99
    assert conformal_threshold(np.arange(99.0), 0.01) == 98.0
    assert texts_needed(0.001) == 999 and texts_needed(0.05) == 19
    with pytest.raises(ValueError, match="no reference scores"):
        conformal_threshold([], 0.01)


def test_a_key_without_a_threshold_for_alpha_says_how_many_texts_it_needs():
    from types import SimpleNamespace

    record = {"llr_thresholds": empirical_thresholds(np.arange(500.0), (0.001, 0.01))}
    assert record["llr_thresholds"]["0.001"] is None and record["llr_thresholds"]["0.01"] is not None
    key = SimpleNamespace(meta={"calibration": record})
    assert calibrated_threshold(key, 0.01) == record["llr_thresholds"]["0.01"]
    with pytest.raises(ValueError, match="at least 999 reference texts"):
        calibrated_threshold(key, 0.001)


def test_calibrate_refuses_too_few_texts_for_its_smallest_rate_before_loading_anything(tmp_path):
    args = ["calibrate", "--model", str(tmp_path / "none"), "--key", str(tmp_path / "key"), "--n", "500"]
    result = CliRunner().invoke(app, [*args, "--fpr", "0.001,0.01"])
    assert result.exit_code == 2 and "--fpr 0.001 needs --n of at least 999" in result.output
    result = CliRunner().invoke(app, [*args, "--fpr", "0,0.01"])
    assert result.exit_code == 2 and "between 0 and 1" in result.output


def test_detect_warns_on_thresholds_calibrated_before_they_were_conformal(release, tmp_path, caplog):
    import json
    import logging
    import shutil

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openstamp.config import DetectConfig
    from openstamp.detect import Detector
    from openstamp.detect.calibrate import stale_thresholds
    from openstamp.key.key import WatermarkKey

    old = {"llr_thresholds": {"0.01": 0.5}, "versions": {"openstamp": "0.3.0"}}
    assert "calibrated by openstamp 0.3.0" in stale_thresholds(old)
    assert stale_thresholds({**old, "versions": {"openstamp": "0.3.1"}}) is None and stale_thresholds(None) is None
    key_dir = tmp_path / "key"
    shutil.copytree(release / "key", key_dir)
    key = WatermarkKey.load(key_dir)
    key.meta["calibration"] = old
    model = AutoModelForCausalLM.from_pretrained(release / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(release / "model")
    with caplog.at_level(logging.WARNING, logger="openstamp.detect.detector"):
        Detector(model, tokenizer, key, DetectConfig(alpha=0.01))
        assert "calibrated by openstamp" not in caplog.text  # p-values: the thresholds are not used
        Detector(model, tokenizer, key, DetectConfig(alpha=0.01, calibrated=True))
    assert "calibrate` again" in caplog.text
    assert json.loads((key_dir / "key.json").read_text()).get("calibration") is None  # nothing written
