"""Several keys: Holm's adjustment, family-wise error on null p-values, one backbone pass for every key."""

import numpy as np
import pytest

from openstamp.config import DetectConfig
from openstamp.corpus import load_documents
from openstamp.detect import Detector, MultiKeyDetector, holm
from openstamp.embed.build import build_key
from openstamp.model.generate import sample_completions
from openstamp.model.load import load_model
from openstamp.model.patch import apply_watermark


def holm_reference(p):
    """Holm (1979) step by step: the i-th smallest p-value times (m - i + 1), made monotone, capped at 1."""
    m, order = len(p), sorted(range(len(p)), key=lambda i: p[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p[i]))
        adjusted[i] = running
    return adjusted


def test_holm_matches_known_values_and_a_direct_implementation():
    # the textbook example: p = (0.01, 0.04, 0.03, 0.005) -> (0.03, 0.06, 0.06, 0.02)
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm([0.5]), [0.5])
    rng = np.random.default_rng(1)
    p = rng.uniform(size=(200, 5)) ** 2
    np.testing.assert_allclose(holm(p), [holm_reference(list(row)) for row in p])
    assert (holm(p) >= p).all() and (holm(p) <= 1).all()


def test_holm_controls_the_family_wise_error_on_uniform_nulls():
    rng = np.random.default_rng(0)
    n, m, alpha = 20_000, 5, 0.05
    p = rng.uniform(size=(n, m))
    fwer = float((holm(p).min(-1) <= alpha).mean())
    raw = float((p.min(-1) <= alpha).mean())
    assert fwer <= alpha + 3 * np.sqrt(alpha / n)  # about 1 - (1 - alpha / m)^m for independent tests
    assert raw > 3 * alpha  # uncorrected, the family-wise error is about 1 - (1 - alpha)^m = 0.23


@pytest.fixture(scope="module")
def setup(tiny_model_dir, corpus_file, tiny_config):
    base, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    cfg = tiny_config.with_overrides({"green.delta": 2.0})
    keys = [build_key(base, tok, docs, cfg, secret=bytes([s]) * 32, progress=False) for s in (11, 12, 13)]
    released = []
    for key in keys:
        model, _ = load_model(str(tiny_model_dir))
        apply_watermark(model, key)  # records each key's fingerprints
        released.append(model)
    prompts = [ids[:8] for ids in tok([d.text for d in docs[:6]], add_special_tokens=False).input_ids]
    texts = sample_completions(released[1], tok, prompts, 48, seed=0, progress=False)
    return base, tok, keys, texts


def test_the_best_key_is_named_and_p_values_are_holm_adjusted(setup):
    base, tok, keys, texts = setup
    config = DetectConfig(min_tokens=4)
    singles = [Detector(base, tok, key, config) for key in keys]
    multi = MultiKeyDetector(singles)
    results = multi.detect(texts + [[5, 6]])
    assert results[-1].status == "too_short" and results[-1].best_key is None
    for i, result in enumerate(results[:-1]):
        alone = [d.detect([texts[i]])[0] for d in singles]
        adjusted = holm([r.p_value for r in alone])
        assert result.p_values_by_key == pytest.approx(dict(zip(multi.key_ids, adjusted, strict=True)))
        assert result.p_value == pytest.approx(adjusted.min())
        best = alone[multi.key_ids.index(result.best_key)]
        assert best.p_value == min(r.p_value for r in alone) and result.score == pytest.approx(best.score)
        assert result.decision == (result.p_value <= config.alpha) and "Holm" in result.rule
    assert sum(r.best_key == keys[1].key_id for r in results[:-1]) >= 4  # the texts were written with key 2
    single = Detector(base, tok, keys[0], config).detect([texts[0]])[0].to_dict()
    assert "best_key" not in single and "p_values_by_key" not in single  # one key: the output is as before


def test_one_backbone_pass_serves_every_key(setup):
    base, tok, keys, texts = setup
    calls = []
    from openstamp.model.hidden import final_hidden

    def counted(*a, **k):
        calls.append(1)
        return final_hidden(*a, **k)

    multi = MultiKeyDetector(
        [Detector(base, tok, key, DetectConfig(min_tokens=4, batch_size=64), hidden=counted) for key in keys]
    )
    multi.detect(texts)
    # re-tied keys (a tied base) watermark the input embeddings too: each needs its own watermarked copy
    retied = all(d.model is not base for d in multi.detectors)
    assert len(calls) == (len(keys) if retied else 1)
    assert retied == base.config.tie_word_embeddings


def test_several_keys_refuse_the_llr_rule_and_duplicates(setup):
    base, tok, keys, _ = setup
    with pytest.raises(ValueError, match="p-value rule"):
        MultiKeyDetector([Detector(base, tok, k, DetectConfig(threshold=0.1)) for k in keys[:2]])
    with pytest.raises(ValueError, match="twice"):
        MultiKeyDetector([Detector(base, tok, keys[0]), Detector(base, tok, keys[0])])
