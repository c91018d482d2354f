"""benchmarks/fpr/calibrated_fpr.py: cross-fitted per-key rates, each half tested with the other half's threshold."""

import numpy as np
import pytest


@pytest.fixture
def calibrated(benchmark):
    return benchmark("fpr/calibrated_fpr")


def halves(scores: np.ndarray, p: np.ndarray) -> list[dict]:
    n = len(scores) // 2
    return [
        {"score": scores[h * n : (h + 1) * n].tolist(), "p": p[h * n : (h + 1) * n].tolist(), "status": ["ok"] * n}
        for h in (0, 1)
    ]


def test_a_key_whose_null_sits_high_is_brought_to_alpha_by_calibration(calibrated):
    """Four keys, one whose null LLR and p-values favour the domain: the p rule flags it often, calibration on the
    other half brings every key near alpha."""
    rng = np.random.default_rng(0)
    n, keys = 4000, 4
    scores = rng.normal(size=(n, keys))
    scores[:, 3] += 1.0  # the key drawn high on this domain
    p = rng.uniform(size=(n, keys))
    p[:, 3] = p[:, 3] ** 2  # its p-values lean low: P(p <= 0.05) = 0.22
    report = calibrated.summarise(halves(scores, p))
    assert report["n_texts_per_half"] == [n // 2, n // 2]
    p_rule, fitted = report["0.01"]["p_value"], report["0.01"]["calibrated"]
    assert p_rule["per_key_fpr"][3] > 0.05 and p_rule["keys_above_band_significantly"] == 1
    assert fitted["keys_above_band_significantly"] == 0 and fitted["n_texts"] == n
    assert all(0.004 <= r <= 0.02 for r in fitted["per_key_fpr"])


def test_the_threshold_is_never_tried_on_the_texts_that_set_it(calibrated):
    """Each half is its own domain here (nulls at 0 and at 3): a threshold fitted on a half and tried on the same
    half would read alpha; tried on the other, it reads 0 one way and 1 the other."""
    n = 2000
    scores = np.concatenate([np.linspace(-1, 1, n), 3 + np.linspace(-1, 1, n)])[:, None]
    report = calibrated.summarise(halves(scores, np.full((2 * n, 1), 0.5)))
    for alpha in ("0.01", "0.001"):
        assert report[alpha]["calibrated"]["per_key_fpr"] == [0.5]  # half 0 flags none, half 1 flags all


def test_windows_come_in_turns_so_no_document_fills_the_first_n(benchmark):
    docs = [[[1], [2], [3]], [[4]], [[5], [6]]]
    assert benchmark("fpr/fpr_per_key").in_turns(docs) == [[1], [4], [5], [2], [6], [3]]
