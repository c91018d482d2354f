import copy
import dataclasses
import math

import pytest
import torch
from scipy.stats import binomtest, kstest
from sklearn.metrics import roc_auc_score

from openstamp.config import DetectConfig
from openstamp.corpus import load_documents
from openstamp.detect import Detector
from openstamp.embed.build import build_key
from openstamp.key import KeyMismatchError
from openstamp.model.generate import sample_completions
from openstamp.model.load import load_model
from openstamp.model.patch import apply_watermark, head


@pytest.fixture(scope="module")
def setup(tiny_model_dir, corpus_file, tiny_config):
    """Base model, watermarked model (delta 2), its key, a second key, and samples from both."""
    base, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    cfg = tiny_config.with_overrides({"green.delta": 2.0})
    key = build_key(base, tok, docs, cfg, secret=bytes([7]) * 32, progress=False)
    other_key = build_key(base, tok, docs, cfg, secret=bytes([8]) * 32, progress=False)
    model = watermarked(tiny_model_dir, key)
    watermarked(tiny_model_dir, other_key)  # records the second key's fingerprints; the copy is dropped
    prompts = [ids[:8] for ids in tok([d.text for d in docs[:40]], add_special_tokens=False).input_ids]
    wm = sample_completions(model, tok, prompts, 48, seed=0, progress=False)
    plain = sample_completions(base, tok, prompts, 48, seed=0, progress=False)
    return dict(base=base, model=model, tok=tok, key=key, other_key=other_key, wm=wm, plain=plain)


def watermarked(model_dir, key):
    model, _ = load_model(str(model_dir))
    apply_watermark(model, key)  # records the fingerprints in the key
    return model


def reference_llr(model, key, ids: list[int]) -> torch.Tensor:
    """Paper Algorithm 1 with both full |V| x d matrices materialised."""
    with torch.no_grad():
        h = model.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0, :-1].double()
    u_wm = head(model).weight.double()
    u_orig = u_wm - key.delta_w().double()
    target = torch.tensor(ids[1:])
    lp_wm = torch.log_softmax(h @ u_wm.T, -1)[torch.arange(len(target)), target]
    lp_orig = torch.log_softmax(h @ u_orig.T, -1)[torch.arange(len(target)), target]
    return (lp_wm - lp_orig).float()


def test_low_rank_llr_matches_the_materialised_reference(setup):
    det = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(min_tokens=4))
    for ids in setup["wm"][:3] + setup["plain"][:3]:
        result = det.detect([ids], token_scores=True)[0]
        expected = reference_llr(setup["model"], setup["key"], ids)
        torch.testing.assert_close(torch.tensor(result.token_scores), expected, rtol=1e-4, atol=1e-4)
        assert math.isclose(result.score, float(expected.detach().mean()), rel_tol=1e-4, abs_tol=1e-5)


def test_discrete_and_binomial_statistics_match_a_reference(setup):
    model, key = setup["model"], setup["key"]
    det = Detector(model, setup["tok"], key, DetectConfig(min_tokens=4, vocab_block=64))  # several blocks
    ids = setup["wm"][0]
    result = det.detect([ids])[0]
    with torch.no_grad():
        h = model.get_decoder()(input_ids=torch.tensor([ids])).last_hidden_state[0, :-1].double()
    u_orig = head(model).weight.detach().double() - key.delta_w().double()
    sel = (h.float() @ key.selector_weights.T).argmax(-1)
    green = key.green.double()
    target = torch.tensor(ids[1:])
    lp_orig = torch.log_softmax(h @ u_orig.T, -1)
    lp_disc = torch.log_softmax(h @ u_orig.T + key.delta * green[:, sel].T, -1)
    rows = torch.arange(len(target))
    discrete = (lp_disc[rows, target] - lp_orig[rows, target]).mean()
    assert math.isclose(result.detectors["discrete_llr"], float(discrete), rel_tol=1e-4, abs_tol=1e-5)
    is_green = green[target, sel].bool()
    assert math.isclose(result.detectors["green_fraction"], float(is_green.float().mean()), abs_tol=1e-6)
    excluded = set(key.never_green)  # tokens in no list do not count
    pairs = {(int(t), int(c)) for t, c in zip(target, sel, strict=True) if int(t) not in excluded}
    assert result.detectors["binomial_pairs"] == len(pairs)


def test_original_model_plus_key_gives_the_same_scores(setup):
    on_release = Detector(setup["model"], setup["tok"], setup["key"]).detect(setup["wm"][:4])
    on_base = Detector(setup["base"], setup["tok"], setup["key"]).detect(setup["wm"][:4])
    for a, b in zip(on_release, on_base, strict=True):
        assert math.isclose(a.score, b.score, rel_tol=1e-4, abs_tol=1e-5)
        assert math.isclose(a.p_value, b.p_value, rel_tol=1e-3)


def test_left_and_right_padding_and_batching_give_identical_scores(setup):
    texts = [setup["wm"][0][:20], setup["wm"][1], setup["plain"][2][:31]]
    right = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(padding_side="right")).detect(texts)
    left = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(padding_side="left")).detect(texts)
    single = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(batch_size=1)).detect(texts)
    for a, b, c in zip(right, left, single, strict=True):
        assert abs(a.score - b.score) < 1e-5 and abs(a.score - c.score) < 1e-5
        assert a.detectors["binomial_pairs"] == b.detectors["binomial_pairs"]


def test_too_short_and_empty_texts_get_a_status_not_a_score(setup):
    det = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(min_tokens=16))
    results = det.detect(["", "river city", setup["tok"].decode(setup["wm"][0])])
    assert [r.status for r in results] == ["too_short", "too_short", "ok"]
    assert results[0].score is None and results[0].decision is None and results[0].n_tokens == 0


def test_prompt_conditions_but_is_not_scored(setup):
    det = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(min_tokens=4))
    text = setup["wm"][0]
    alone, with_prompt = det.detect([text, text], prompts=[None, [5, 6, 7, 8]])
    assert alone.n_tokens == len(text) - 1 and with_prompt.n_tokens == len(text)
    assert alone.score != with_prompt.score


def test_watermarked_samples_score_higher(setup):
    det = Detector(setup["model"], setup["tok"], setup["key"])
    wm = det.detect(setup["wm"])
    plain = det.detect(setup["plain"])
    wm_scores, plain_scores = [r.score for r in wm], [r.score for r in plain]
    auroc = roc_auc_score([1] * len(wm) + [0] * len(plain), wm_scores + plain_scores)
    assert auroc > 0.95  # 40 vs 40 samples of 48 tokens, fixed seeds
    assert sum(wm_scores) / len(wm_scores) > sum(plain_scores) / len(plain_scores) + 0.3
    # with only L=8 lists the permutation test has less power than on a real key
    assert sum(r.p_value <= 0.01 for r in wm) >= 0.6 * len(wm)
    assert sum(r.p_value <= 0.01 for r in plain) <= 2
    for name in ("discrete_llr", "binomial_z", "centred_llr"):
        mean_wm = sum(r.detectors[name] for r in wm) / len(wm)
        mean_plain = sum(r.detectors[name] for r in plain) / len(plain)
        assert mean_wm > mean_plain, name


def test_watermarked_text_under_a_different_key_gets_uniform_p_values(setup):
    # the other key's fingerprint is the base model's head: score with the base model
    det = Detector(setup["base"], setup["tok"], setup["other_key"])
    p = [r.p_value for r in det.detect(setup["wm"])]
    assert kstest(p, "uniform").pvalue > 0.01
    assert sum(v <= 0.05 for v in p) <= 6  # 40 texts; about 2 expected


def test_skipped_first_tokens_are_context_only(setup):
    """Skipping k tokens of a prompt-free text scores it as if those k tokens were its prompt."""
    det = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(min_tokens=4, skip_tokens=6))
    plain = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(min_tokens=4))
    text = setup["wm"][1]
    skipped, given = det.detect([text], token_scores=True)[0], plain.detect([text[6:]], prompts=[text[:6]])[0]
    assert skipped.n_tokens == len(text) - 6 == len(skipped.token_scores) == len(skipped.tokens)
    assert math.isclose(skipped.score, given.score, rel_tol=1e-5) and skipped.p_value == given.p_value
    with_prompt = det.detect([text], prompts=[[5, 6, 7, 8]])[0]  # a prompt gives the context: nothing skipped
    assert with_prompt.n_tokens == len(text)
    too_short = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(min_tokens=16, skip_tokens=40))
    assert too_short.detect([text])[0].status == "too_short"  # 48 tokens, 40 skipped: 8 scored


def test_skipping_tokens_keeps_p_values_valid_on_nulls(setup):
    """The rule is fixed before the text is seen, so the permutation p-value stays exact: on text written without
    the key, p-values under 20 fresh keys are not anti-conservative at any skip."""
    p = {0: [], 8: [], 24: []}
    for j in range(16):
        key = dataclasses.replace(setup["key"], secret=bytes([100 + j]) * 32, meta={})
        apply_watermark(copy.deepcopy(setup["base"]), key)  # records which head is the base's
        det = Detector(setup["base"], setup["tok"], key)
        for skip in p:
            det.config = dataclasses.replace(det.config, skip_tokens=skip)
            p[skip] += [r.p_value for r in det.detect(setup["plain"])]
    for skip, values in p.items():
        for alpha in (0.05, 0.1, 0.25):
            flagged = sum(v <= alpha for v in values)
            assert binomtest(flagged, len(values), alpha, alternative="greater").pvalue > 0.001, (skip, alpha)
        assert sum(v <= 0.5 for v in values) >= 0.35 * len(values)  # and not conservative to the point of no test


def test_wrong_model_for_the_key_is_refused(setup, tiny_model_dir):
    from conftest import make_model

    other = make_model(tied=False, vocab_size=setup["key"].vocab_size, seed=5)
    with pytest.raises(KeyMismatchError, match="wrong key"):
        Detector(other, setup["tok"], setup["key"])


def test_bad_inputs(setup):
    det = Detector(setup["model"], setup["tok"], setup["key"])
    with pytest.raises(TypeError, match="list of texts"):
        det.detect("a bare string")
    with pytest.raises(TypeError, match="string or a list of token ids"):
        det.detect([3.5])
    with pytest.raises(ValueError, match="token ids must lie"):
        det.detect([[10**9]])
    with pytest.raises(ValueError, match="prompts"):
        det.detect(["a", "b"], prompts=["x"])


def test_long_texts_are_truncated(setup):
    det = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(max_tokens=40, min_tokens=4))
    result = det.detect([setup["wm"][0] + setup["wm"][1]], prompts=[[5] * 30])[0]
    # the 30-token prompt no longer fits; without BOS or prompt the first token has no context
    assert result.truncated and result.n_tokens == 39


def test_texts_cut_from_scored_ones_take_their_token_statistics_inside_a_cache(setup, monkeypatch):
    """The eval's length curve: a text that starts a text scored before, in the same cache, goes through no
    vocabulary pass, and scores as a fresh detector scores it."""
    import openstamp.detect.statistics as statistics_module
    from openstamp.lab.detector import LabDetector
    from openstamp.lab.hidden import HiddenCache, reusing

    texts = setup["wm"][:6]
    cuts = [t[:20] for t in texts] + [t[:12] for t in texts]
    other = "a text that starts no scored one"
    config = DetectConfig(min_tokens=4)
    fresh = Detector(setup["model"], setup["tok"], setup["key"], config).detect([*cuts, other])
    assert not hasattr(Detector(setup["model"], setup["tok"], setup["key"], config), "memo")  # the product keeps none
    det = LabDetector(setup["model"], setup["tok"], setup["key"], config)
    rows, real = [], statistics_module.token_stats
    monkeypatch.setattr(statistics_module, "token_stats", lambda h, *a, **k: rows.append(len(h)) or real(h, *a, **k))
    det.detect(texts)
    assert not det.memo.kept  # outside a cache nothing is kept
    with reusing(HiddenCache()):
        det.detect(texts)
        rows.clear()
        kept = det.detect([*cuts, other])
    assert det.memo.hits == len(cuts)
    assert rows == [fresh[-1].n_tokens]  # only the other text's tokens went through the vocabulary
    for a, b in zip(kept, fresh, strict=True):
        assert a.score == pytest.approx(b.score, rel=1e-5, abs=1e-6) and a.n_tokens == b.n_tokens
        assert a.p_value == pytest.approx(b.p_value, rel=1e-4)  # the tail bound: float rounding of other shapes
        assert a.detectors["binomial_pairs"] == b.detectors["binomial_pairs"]


def test_p_values_needed_to_a_level_skip_the_tail_bound_and_decide_alike(setup):
    from openstamp.detect.decision import PERMUTATION_TEST
    from openstamp.lab.detector import LabDetector, p_values_down_to

    det = LabDetector(setup["model"], setup["tok"], setup["key"], DetectConfig(min_tokens=4))
    floor = 1 / (det.config.n_permutations + 1)
    refined = det.detect(setup["wm"][:8])
    assert any("tail_p" in r.detectors for r in refined)  # the strong tiny watermark reaches the floor
    with p_values_down_to(0.01):
        coarse = det.detect(setup["wm"][:8])
    for a, b in zip(refined, coarse, strict=True):
        assert "tail_p" not in b.detectors and b.score == a.score
        assert b.p_value == (a.p_value if a.p_value > floor else pytest.approx(floor))
        assert (a.p_value <= 0.01) == (b.p_value <= 0.01) and b.test == PERMUTATION_TEST.format(k=len(det.perms))
    assert [r.p_value for r in det.detect(setup["wm"][:8])] == [r.p_value for r in refined]  # the level is restored


def test_the_statistics_memo_is_bounded_and_a_new_cache_or_precision_empties_it():
    from openstamp.detect.llr import TokenStats
    from openstamp.lab.evaluation.memo import StatsMemo
    from openstamp.lab.hidden import HiddenCache

    def stats(n: int) -> TokenStats:
        x = torch.arange(n, dtype=torch.float32)
        return TokenStats(x, x, x, x > 0, x.long(), x[:, None].repeat(1, 3), x[:, None].repeat(1, 3), x)

    memo, cache = StatsMemo(max_tokens=10), HiddenCache()
    assert memo.bind(cache) and not memo.bind(None)
    memo.keep([1, 2, 3, 4, 5, 6, 7], 1, stats(6))
    memo.keep([1, 2, 3, 4, 9, 9], 1, stats(5))  # 11 rows > 10: the first goes
    assert memo.tokens == 5 and memo.find([1, 2, 3, 4, 5], 1) is None
    found = memo.find([1, 2, 3, 4, 9], 1)
    assert found.llr.tolist() == [0.0, 1.0, 2.0, 3.0] and memo.find([1, 2, 3, 4, 9], 2) is None  # another context
    memo.bind(cache, "bfloat16")  # rows of states the decoder computed in another dtype
    assert memo.tokens == 0 and memo.find([1, 2, 3, 4, 9], 1) is None
    memo.keep([1, 2, 3, 4, 9, 9], 1, stats(5))
    memo.bind(cache, "bfloat16")
    assert memo.tokens == 5
    memo.bind(HiddenCache(), "bfloat16")
    assert memo.tokens == 0 and memo.find([1, 2, 3, 4, 9], 1) is None
