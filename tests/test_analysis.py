import json

import pytest
import torch
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.key.key import WatermarkKey
from openstamp.lab.analysis.lists import green_size, jaccard, overlap, top_sets


def test_overlap_and_jaccard_on_states_that_select_one_list_each():
    key = WatermarkKey(secret=b"s" * 32, selector=torch.eye(2), projection=None, gamma=0.25, delta=1.0, vocab_size=400)
    hidden = torch.eye(2) * 5  # state i selects list i alone: dW h = 5 delta G[:, i]
    top = top_sets(key, hidden)
    sizes = key.green.sum(0)
    assert green_size(key) == int(sizes.float().mean().round())
    if sizes[0] == sizes[1] == green_size(key):  # the top-g set is exactly the list
        assert overlap(key, hidden, top) == 1.0
    g0, g1 = (
        set(torch.nonzero(key.green[:, 0]).flatten().tolist()),
        set(torch.nonzero(key.green[:, 1]).flatten().tolist()),
    )
    a, b = set(top[0].tolist()), set(top[1].tolist())
    assert jaccard(key, top, pairs=10) == pytest.approx(len(a & b) / len(a | b))
    assert len(a & b) / len(a | b) == pytest.approx(len(g0 & g1) / len(g0 | g1), abs=0.05)


def test_analyze_lists_on_the_tiny_release(release, tiny_model_dir, corpus_file, tmp_path):
    out = tmp_path / "lists"
    args = ["analyze", "lists", "--key", str(release / "key"), "--model", str(tiny_model_dir), "--corpus",
            str(corpus_file), "--lists", "2,6", "--gammas", "0.25,0.5", "--states", "256", "--pairs", "50",
            "--out", str(out), "--quiet"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [(r["lists_requested"], r["gamma"]) for r in rows] == [(2, 0.25), (2, 0.5), (6, 0.25), (6, 0.5)]
    for r in rows:
        assert r["gamma"] - 0.05 < r["overlap"] <= 1 and 0 < r["jaccard"] <= 1  # above chance: the offset is G S h
    assert (out / "lists.png").exists()


def test_analyze_lists_refuses_a_key_of_another_model(release, tmp_path):
    result = CliRunner().invoke(app, ["analyze", "lists", "--key", str(release / "key"), "--model", "smollm2-135m",
                                      "--out", str(tmp_path), "--quiet"])  # fmt: skip
    assert result.exit_code == 2 and "was not built for" in result.output


def test_position_gap_is_the_mean_absolute_difference_per_position():
    from openstamp.lab.analysis.prompt import position_gap

    first, gap = position_gap([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], [[0.0, 2.0, 1.0], [1.0, 1.0]])
    assert first == 0 and gap.tolist() == [1.0, 0.5, 1.5]  # aligned at the end: position 0 has one text
    first, gap = position_gap([[5.0, 1.0, 2.0]], [[1.0, 3.0]])  # the first token only scored with the prompt
    assert first == 1 and gap.tolist() == [0.0, 1.0]


def test_analyze_prompt_scores_each_completion_with_and_without_its_prompt(eval_dir, tmp_path):
    out = tmp_path / "prompt"
    result = CliRunner().invoke(app, ["analyze", "prompt", "--eval", str(eval_dir), "--n", "6", "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = {r["text"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    assert set(rows) == {"watermarked", "unwatermarked"} and (out / "prompt.png").exists()
    for r in rows.values():
        assert r["texts"] == 6 and all(g >= 0 for g in r["gap_by_position"])
    for way in ("mean_score_with_prompt", "mean_score_without"):  # the watermark shows either way
        assert rows["watermarked"][way] > rows["unwatermarked"][way]


def test_text_llr_is_the_difference_of_mean_nlls():
    from conftest import make_model

    from openstamp.lab.analysis.llr import text_llr
    from openstamp.model.patch import head

    model, marked = make_model(tied=False, vocab_size=64), make_model(tied=False, vocab_size=64)
    with torch.no_grad():
        head(marked).weight[5] += 1.0  # token 5 made likelier everywhere
    texts = [[5, 5, 5, 5], [7, 8, 9, 10]]
    llr = text_llr(marked, model, texts, prefix=[1])
    ids = torch.tensor([[1] + t for t in texts])
    with torch.no_grad():
        lp = [m(ids).logits[:, :-1].log_softmax(-1).gather(2, ids[:, 1:, None])[..., 0] for m in (marked, model)]
    expected = (lp[0] - lp[1]).double().mean(1)
    assert llr == pytest.approx(expected.tolist(), abs=1e-4) and llr[0] > 0


def test_analyze_llr_rescores_the_weight_level_baseline(eval_dir, tmp_path):
    out = tmp_path / "llr"
    result = CliRunner().invoke(app, ["analyze", "llr", "--eval", str(eval_dir), "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert [r["method"] for r in rows] == ["unremovable"] and (out / "llr.png").exists()  # openstamp: LLR already
    mean = rows[0]["mean_llr"]
    assert mean["watermarked"] > mean["unwatermarked"] and mean["watermarked"] > mean["human"]
    assert 0.0 <= rows[0]["llr"]["auroc"] <= 1.0 and rows[0]["native"]["auroc"] is not None
    for side in ("llr", "native"):  # both FPRs, the stricter never above the looser
        assert rows[0][side]["tpr_at_0.1pct_fpr"] <= rows[0][side]["tpr_at_1pct_fpr"]
        assert rows[0][side]["tpr_at_0.1pct_fpr_resolution_limited"]  # the fixture's few human texts


def test_analyze_llr_reads_a_head_only_watermark_from_the_originals_states(eval_dir, tmp_path, monkeypatch):
    import numpy as np

    import openstamp.lab.analysis.llr as llr_module
    from openstamp.lab.attacks.common import load_method, open_eval, watermarked_copy
    from openstamp.model.load import load_model
    from openstamp.model.text import bos_prefix

    caches = []

    class Counted(llr_module.HiddenCache):
        def __init__(self):
            super().__init__()
            caches.append(self)

    monkeypatch.setattr(llr_module, "HiddenCache", Counted)
    rows = llr_module.run_llr(eval_dir, tmp_path / "llr", progress=False)["rows"]
    assert caches[0].hits >= 3  # the watermarked model's three sets ran no decoder of their own

    ev = open_eval(eval_dir)  # the reference: a patched copy scored beside the original, each with its own passes
    base, tokenizer = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    run = next(r for r in ev.runs if r["run"] == rows[0]["run"])
    marked = watermarked_copy(base, load_method(ev, run, base))
    sets = {"human": [w["human"] for w in ev.windows], "watermarked": ev.generations(run)}
    for name, texts in {**sets, "unwatermarked": ev.unwatermarked(run["seed"])}.items():
        expected = np.nanmean(llr_module.text_llr(marked, base, texts, bos_prefix(tokenizer)))
        assert rows[0]["mean_llr"][name] == pytest.approx(expected, abs=1e-5), name


def test_analyze_gamma_delta_on_the_tiny_key(release, tiny_model_dir, corpus_file, tmp_path):
    out = tmp_path / "gd"
    args = ["analyze", "gamma-delta", "--key", str(release / "key"), "--model", str(tiny_model_dir),
            "--corpus", str(corpus_file), "--gammas", "0.25,0.5", "--deltas", "0.5,4", "--tokens", "24", "--n", "6",
            "--prompt-tokens", "8", "--out", str(out), "--quiet"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    rows = {(r["gamma"], r["delta"]): r for r in results["rows"]}
    assert set(rows) == {(0.25, 0.5), (0.25, 4.0), (0.5, 0.5), (0.5, 4.0)} and (out / "gamma_delta.png").exists()
    for gamma in (0.25, 0.5):  # a stronger watermark costs more of the model's own perplexity
        assert rows[(gamma, 4.0)]["own_ppl"] > rows[(gamma, 0.5)]["own_ppl"] > 0


def test_analyze_gamma_delta_refuses_the_watermarked_model(release, tmp_path):
    args = ["analyze", "gamma-delta", "--key", str(release / "key"), "--model", str(release / "model"),
            "--out", str(tmp_path), "--quiet"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "original" in result.output
