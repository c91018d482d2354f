"""Pooled detection: one p-value for a set of texts, exact under the key's null whatever the texts' dependence."""

import copy
import dataclasses
import json
import math
import random

import pytest
from conftest import make_model
from fastapi.testclient import TestClient
from scipy.stats import binomtest
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.config import DetectConfig
from openstamp.corpus import load_documents, split_documents
from openstamp.detect import Detector
from openstamp.detect.pool import dedupe, source_pvalues
from openstamp.embed.build import build_key
from openstamp.embed.tune import TuneConfig, tune_delta
from openstamp.model.generate import sample_completions
from openstamp.model.load import load_model
from openstamp.model.patch import apply_watermark
from openstamp.service import ServiceConfig, create_app

runner = CliRunner()


@pytest.fixture(scope="module")
def setup(tiny_model_dir, corpus_file, tiny_config):
    """Base model, watermarked model (delta 2), its key, and 40 samples of 48 tokens from each."""
    base, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    key = build_key(base, tok, docs, tiny_config.with_overrides({"green.delta": 2.0}), secret=bytes([7]) * 32,
                    progress=False)  # fmt: skip
    model, _ = load_model(str(tiny_model_dir))
    apply_watermark(model, key)
    prompts = [ids[:8] for ids in tok([d.text for d in docs[:40]], add_special_tokens=False).input_ids]
    wm = sample_completions(model, tok, prompts, 48, seed=0, progress=False)
    plain = sample_completions(base, tok, prompts, 48, seed=0, progress=False)
    return dict(base=base, model=model, tok=tok, key=key, wm=wm, plain=plain)


def fresh_detector(setup, secret: bytes) -> Detector:
    """A detector of a key the texts know nothing of (the same S, another secret: other lists and permutations)."""
    key = dataclasses.replace(setup["key"], secret=secret, meta={})
    apply_watermark(copy.deepcopy(setup["base"]), key)  # records which head is the base's
    return Detector(setup["base"], setup["tok"], key)


def test_a_pool_of_one_text_is_that_text(setup):
    det = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(min_tokens=4))
    for ids in setup["wm"][:3] + setup["plain"][:2]:
        single, pooled = det.detect([ids])[0], det.detect_pool([ids])
        assert pooled.n_texts == 1 and pooled.n_tokens == single.n_tokens
        assert math.isclose(pooled.detectors["centred_llr"], single.detectors["centred_llr"], rel_tol=1e-6)
        assert pooled.detectors["permutation_p"] == single.detectors["permutation_p"]
        assert math.isclose(pooled.p_value, single.p_value, rel_tol=1e-4)  # the tail bound's too, at the floor
    # the set's centred statistic is the sum of its texts'
    texts = setup["wm"][:6]
    total = sum(r.detectors["centred_llr"] * r.n_tokens for r in det.detect(texts))
    pooled = det.detect_pool(texts)
    assert math.isclose(pooled.detectors["centred_llr"] * pooled.n_tokens, total, rel_tol=1e-6)
    assert pooled.n_texts == 6 and pooled.n_tokens == sum(len(t) - 1 for t in texts)


def test_pooled_p_values_are_valid_on_nulls_including_repeated_texts(setup):
    """Under 12 keys the texts know nothing of, pools of the base model's samples, of random token ids, and of one
    text 20 times are flagged no more often than alpha (within Monte-Carlo error)."""
    rng = random.Random(0)
    vocab = len(setup["tok"])
    noise = [[rng.randrange(3, vocab) for _ in range(32)] for _ in range(48)]
    p = {"samples": [], "random ids": [], "repeated": []}
    for j in range(12):
        det = fresh_detector(setup, bytes([100 + j]) * 32)
        for i in range(4):
            p["samples"].append(det.detect_pool(setup["plain"][8 * i : 8 * i + 8]).p_value)
            p["random ids"].append(det.detect_pool(noise[8 * i : 8 * i + 8]).p_value)
        for text in (setup["plain"][j], noise[j], noise[40 + j % 8]):
            p["repeated"].append(det.detect_pool([text] * 20).p_value)
    for kind, values in p.items():
        for alpha in (0.05, 0.1, 0.25):
            flagged = sum(v <= alpha for v in values)
            assert binomtest(flagged, len(values), alpha, alternative="greater").pvalue > 0.001, (kind, alpha)
        assert sum(v <= 0.5 for v in values) >= 0.3 * len(values), kind  # and not vacuous


def test_a_pool_of_watermarked_texts_is_far_stronger_than_each(setup):
    det = Detector(setup["model"], setup["tok"], setup["key"])
    singles = det.detect(setup["wm"])
    pooled = det.detect_pool(setup["wm"])
    assert pooled.status == "ok" and pooled.decision and pooled.n_texts == 40
    assert pooled.n_tokens == sum(r.n_tokens for r in singles)
    median = sorted(r.p_value for r in singles)[len(singles) // 2]
    assert pooled.p_value <= 1e-9 and pooled.detectors["tail_p"] < 1e-6 * median
    tails = [r.detectors["tail_p"] for r in singles if "tail_p" in r.detectors]
    assert pooled.detectors["tail_p"] < min(tails) * 1e-10  # the bound before rounding to 1e-12
    assert det.detect_pool(setup["wm"][:10]).p_value <= 1e-6
    plain = det.detect_pool(setup["plain"])
    assert plain.p_value > 0.01 and not plain.decision


def test_sources_reuse_each_texts_tail_sums(setup):
    """source_pvalues keeps each text's tail sums for the sources that share it: the same p-values as
    recomputing them, and as detect_pool on each source's texts."""
    det = Detector(setup["model"], setup["tok"], setup["key"], DetectConfig(min_tokens=4))
    texts, used = setup["wm"][:10], []
    for n in (1, 2):
        kept = source_pvalues(det, texts, n, 6, seed=3)
        recomputed = source_pvalues(det, texts, n, 6, seed=3, cache_bytes=0)
        rng = random.Random(3)
        alone = [det.detect_pool([texts[i] for i in rng.sample(range(len(texts)), n)]).p_value for _ in range(6)]
        for a, b, c in zip(kept, recomputed, alone, strict=True):
            assert math.isclose(a, b, rel_tol=1e-9) and math.isclose(a, c, rel_tol=1e-6)
        used += [1e-12 < p < 1.0 / (len(det.perms) + 1) for p in kept]
    assert any(used)  # some sources were read by the tail bound, above its floor


def test_dedupe_counts_a_repeated_context_once(setup):
    det = Detector(setup["model"], setup["tok"], setup["key"])
    text = setup["wm"][3]
    once = det.detect_pool([text], dedupe=True)
    twenty = det.detect_pool([text] * 20, dedupe=True)
    assert twenty.n_texts == 20 and twenty.n_tokens == once.n_tokens
    assert twenty.detectors["dedupe_dropped"] == 19 * (len(text) - 1) + once.detectors["dedupe_dropped"]
    assert twenty.p_value == once.p_value
    # the same 20 copies without dedupe: 20 times the statistic, the same permutation p-value
    assert det.detect_pool([text] * 20).detectors["permutation_p"] == det.detect_pool([text]).detectors["permutation_p"]
    items = det.prepare([[5, 6, 7, 8, 9, 10], [1, 5, 6, 7, 8, 9, 10]])
    assert dedupe(items, window=2) == 4  # 6,7,8,9 follow the same two tokens; 5 follows 1, 10 is new
    assert items[1].scored() == [True, True, False, False, False, False]


def test_dedupe_gives_power_back_when_texts_share_boilerplate(setup):
    """Each watermarked text after the same 40 human tokens: counted 20 times, the boilerplate's null noise swamps
    the signal; counted once it does not."""
    det = Detector(setup["model"], setup["tok"], setup["key"])
    boilerplate = setup["plain"][0][:40]
    texts = [boilerplate + wm[:16] for wm in setup["wm"][:20]]
    plain, deduped = det.detect_pool(texts), det.detect_pool(texts, dedupe=True)
    assert deduped.detectors["permutation_z"] > plain.detectors["permutation_z"] + 1
    assert deduped.n_tokens < plain.n_tokens


def test_several_keys_pool_with_holm(setup):
    from openstamp.detect.multikey import MultiKeyDetector

    multi = MultiKeyDetector([Detector(setup["model"], setup["tok"], setup["key"])])
    assert (
        multi.detect_pool(setup["wm"][:10]).p_value
        == Detector(setup["model"], setup["tok"], setup["key"]).detect_pool(setup["wm"][:10]).p_value
    )


def test_cli_pool_and_group_by(release, tmp_path):
    from conftest import make_corpus

    docs = [" ".join(t.split()[:30]) for t in make_corpus(9, 40, seed=3)]
    path = tmp_path / "site.jsonl"
    path.write_text("".join(json.dumps({"text": t, "account": f"a{i % 3}"}) + "\n" for i, t in enumerate(docs)))
    base = ["detect", str(path), "--model", str(release / "model"), "--key", str(release / "key"), "--quiet"]
    pooled = runner.invoke(app, [*base, "--pool"])
    assert pooled.exit_code == 0, pooled.output
    (record,) = [json.loads(line) for line in pooled.stdout.splitlines()]
    assert record["id"] == str(path) and record["n_texts"] == 9 and record["status"] == "ok"
    assert record["n_tokens"] >= 9 * 20 and 0 < record["p_value"] <= 1
    grouped = runner.invoke(app, [*base, "--group-by", "account", "--dedupe"])
    assert grouped.exit_code == 0, grouped.output
    records = [json.loads(line) for line in grouped.stdout.splitlines()]
    assert [r["id"] for r in records] == ["a0", "a1", "a2"] and all(r["n_texts"] == 3 for r in records)
    assert sum(r["n_tokens"] for r in records) <= record["n_tokens"]
    for args, message in [
        (["--group-by", "site"], "needs a field 'site'"),
        (["--pool", "--token-scores"], "--token-scores"),
        (["--dedupe"], "--dedupe applies"),
    ]:
        refused = runner.invoke(app, [*base, *args])
        assert refused.exit_code != 0 and message in refused.output, refused.output


def test_service_pool_gives_one_result(release):
    detector = Detector.from_pretrained(str(release / "model"), str(release / "key"), DetectConfig(min_tokens=4))
    texts = ["the river city council voted on a new plan for public parks", "farmers reported rain across the valley"]
    with TestClient(create_app(detector, ServiceConfig(), None)) as client:
        body = client.post("/v1/detect", json={"texts": texts, "pool": True}).json()
        (result,) = body["results"]
        expected = detector.detect_pool(texts).to_dict()
        assert result == {"index": 0, **expected} and result["backbone"] == detector.backbone
        assert result["n_texts"] == 2 and result["n_tokens"] > 10
        single = client.post("/v1/detect", json={"texts": texts}).json()["results"]
        assert len(single) == 2 and "n_texts" not in single[0]
        refused = client.post("/v1/detect", json={"texts": texts, "pool": True, "token_scores": True})
        assert refused.status_code == 422
        repeated = client.post("/v1/detect", json={"texts": texts * 3, "pool": True, "dedupe": True}).json()
        assert repeated["results"] == [{"index": 0, **detector.detect_pool(texts * 3, dedupe=True).to_dict()}]
        assert repeated["results"][0]["detectors"]["dedupe_dropped"] > 0
        assert client.post("/v1/detect", json={"texts": texts, "dedupe": True}).status_code == 422


@pytest.fixture(scope="module")
def tied_key(tokenizer, corpus_file, tiny_config, tmp_path_factory):
    """The tied tiny model and a key of 32 lists (as in test_tune), with held-out documents."""
    path = tmp_path_factory.mktemp("pool-tune")
    make_model(True, len(tokenizer) + 12).save_pretrained(path)
    tokenizer.save_pretrained(path)
    model, tokenizer = load_model(str(path))
    docs = load_documents(str(corpus_file))
    cfg = tiny_config.with_overrides({"selector.n_lists": 32})
    key = build_key(model, tokenizer, split_documents(docs, "key"), cfg, secret=b"pool" * 8, progress=False)
    return model, tokenizer, key, split_documents(docs, "heldout")


def test_tune_for_sources_gives_a_smaller_delta_for_larger_sources(tied_key):
    model, tokenizer, key, heldout = tied_key
    search = dict(tokens=32, n=12, prompt_tokens=8, low=0.25, high=8.0, steps=2, batch_size=12, target="pooled")
    reports = {}
    for n_texts in (2, 8):
        cfg = TuneConfig(target_tpr=0.95, texts=n_texts, p=1e-6, sources=8, **search)
        tuned, reports[n_texts] = tune_delta(model, tokenizer, key, heldout, cfg, progress=False)
        assert tuned.delta == reports[n_texts]["delta"] > 0 and reports[n_texts]["settings"]["target"] == "pooled"
    large, small = reports[8], reports[2]
    assert large["reached"] and large["tpr"] >= 0.95  # sources of 8 texts of 32 tokens, at p <= 1e-6
    # sources of 2 texts need a larger delta, or more than the search allows (the tiny model is weak)
    assert not small["reached"] or small["delta"] >= large["delta"]
    rates = {r: {p["delta"]: p["tpr"] for p in reports[r]["probes"]} for r in reports}
    assert all(rates[8][d] >= rates[2][d] for d in set(rates[8]) & set(rates[2]))
    with pytest.raises(ValueError, match="texts <= n"):
        TuneConfig(target="pooled", texts=20, n=12)
