"""Per-length calibration: thresholds and measured FPRs with Clopper-Pearson intervals, and length bands."""

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.detect.calibrate import calibrated_threshold, empirical_thresholds, length_band, length_record
from openstamp.detect.rates import clopper_pearson

runner = CliRunner()


def test_length_record_gives_thresholds_and_cross_fitted_rates_with_intervals():
    rng = np.random.default_rng(0)
    scores, p = rng.normal(size=2000), rng.uniform(size=2000)
    record = length_record(scores, p, (0.01, 0.05))
    assert record["n_texts"] == 2000
    assert record["llr_thresholds"] == empirical_thresholds(scores, (0.01, 0.05))
    for alpha in ("0.01", "0.05"):
        for rate in (record["llr_threshold_fpr"][alpha], record["p_value_fpr"][alpha]):
            assert rate["n"] == 2000 and rate["rate"] == rate["hits"] / 2000
            assert (rate["low"], rate["high"]) == clopper_pearson(rate["hits"], 2000)
            assert rate["low"] <= float(alpha) <= rate["high"]  # a null sample: the target lies in the interval
    assert record["p_value_fpr"]["0.05"]["hits"] == int((p <= 0.05).sum())


def fake_key(lengths=(32, 64, 128, 200)):
    by_length = {str(L): {"llr_thresholds": {"0.01": 1.0 / L}} for L in lengths}
    return SimpleNamespace(meta={"calibration": {"llr_thresholds": {"0.01": 9.0}, "by_length": by_length}})


@pytest.mark.parametrize(
    "n, band, threshold",
    [
        (10, "<32", 1 / 32),
        (32, "32-63", 1 / 32),
        (100, "64-127", 1 / 64),
        (199, "128-199", 1 / 128),
        (900, "200+", 1 / 200),
    ],
)
def test_a_text_falls_in_the_band_of_the_longest_calibrated_length_it_reaches(n, band, threshold):
    key = fake_key()
    assert length_band(key, n) == band
    assert calibrated_threshold(key, 0.01, n) == threshold
    assert calibrated_threshold(key, 0.01) == 9.0  # no length: the main record's
    assert length_band(SimpleNamespace(meta={"calibration": {"llr_thresholds": {}}}), n) is None


def test_calibrate_lengths_writes_per_length_records_and_detect_names_the_band(release, corpus_file, tmp_path):
    key = tmp_path / "key"
    shutil.copytree(release / "key", key)
    args = ["calibrate", "--model", str(release / "model"), "--key", str(key), "--corpus", str(corpus_file)]
    args += ["--n", "40", "--length", "32", "--lengths", "16,32", "--fpr", "0.05,0.1", "--quiet"]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "Clopper-Pearson" in result.output
    calibration = json.loads((key / "key.json").read_text())["calibration"]
    assert set(calibration["by_length"]) == {"16", "32"}
    for record in calibration["by_length"].values():
        assert record["n_texts"] == 40 and set(record["llr_thresholds"]) == {"0.05", "0.1"}
        for rate in (*record["llr_threshold_fpr"].values(), *record["p_value_fpr"].values()):
            assert 0 <= rate["low"] <= rate["rate"] <= rate["high"] <= 1 and rate["n"] == 40
    text = "the museum opened an exhibit about ancient trade routes and coastal villages while farmers reported"
    detect = ["detect", "--model", str(release / "model"), "--key", str(key), "--text", text, "--min-tokens", "4"]
    record = json.loads(runner.invoke(app, [*detect, "--calibrated", "--fpr", "0.05"]).stdout)
    band = "16-31" if record["n_tokens"] < 32 else "32+"
    assert record["length_band"] == band
    expected = calibration["by_length"][band.split("-")[0].rstrip("+")]["llr_thresholds"]["0.05"]
    assert record["rule"] == f"llr > {expected:.4g}"


def test_the_cross_fitted_fpr_does_not_try_one_corpus_on_another():
    """reference_texts interleaves corpora text by text; the halves must each hold both, or a threshold fitted on
    one corpus's texts would be tried on the other's (whose null LLR sits elsewhere)."""
    rng = np.random.default_rng(0)
    scores = np.empty(4000)
    scores[0::2] = rng.normal(0.0, 1.0, 2000)  # corpus A
    scores[1::2] = rng.normal(1.0, 1.0, 2000)  # corpus B, its null shifted
    fpr = length_record(scores, None, (0.05,))["llr_threshold_fpr"]["0.05"]
    assert fpr["low"] <= 0.05 <= fpr["high"]
    by_corpus = (scores[0::2], scores[1::2])  # the split the rate must not be
    tau = np.quantile(by_corpus[0], 0.95)
    assert (by_corpus[1] > tau).mean() > 0.2  # what trying A's threshold on B would report
