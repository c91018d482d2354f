"""The attacks: their pure maths, and each one end to end on a tiny evaluation run."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import ATTACK_METHODS as METHODS
from conftest import make_corpus, make_model
from typer.testing import CliRunner

import openstamp.lab.attacks.finetune as finetune
from openstamp.cli import app
from openstamp.corpus import Document
from openstamp.detect.rates import clopper_pearson
from openstamp.lab.attacks.common import open_eval, select_runs
from openstamp.lab.attacks.edits import EditConfig, edit_tokens, run_edit
from openstamp.lab.attacks.finetune import FinetuneConfig, prepare, run_finetune, train, training_windows
from openstamp.lab.attacks.inversion import InversionConfig, run_inversion
from openstamp.lab.attacks.paraphrase import (
    ParaphraseConfig,
    _real_table,
    cut_to,
    real_paraphrases,
    request_ids,
    run_paraphrase,
)
from openstamp.lab.attacks.quantize import QuantizeConfig, quantize_int8, quantize_model, quantize_nf4, run_quantize
from openstamp.lab.attacks.reinit import ReinitConfig, head_nll, install_head, run_reinit, train_head
from openstamp.lab.attacks.similarity import measure_quality, ngram_survival
from openstamp.lab.evaluation.metrics import tpr_at_fpr
from openstamp.lab.evaluation.report import write_report
from openstamp.lab.evaluation.results import against
from openstamp.model.patch import head

runner = CliRunner()
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}Answer: {% endif %}"
)


def _section_in_report(eval_dir, out) -> str:
    section = (eval_dir / "attacks" / f"{out.name}.md").read_text()
    write_report(eval_dir)
    report = (eval_dir / "report.md").read_text()
    assert section.strip() in report
    for line in section.splitlines():
        if line.startswith("!["):
            assert (eval_dir / line[line.index("(") + 1 : -1]).exists(), line
    return section


# -- token edits -------------------------------------------------------------------------------


def test_edit_rates_match_the_settings_within_sampling_error():
    cfg = EditConfig(delete=0.1, substitute=0.2, insert=0.05)
    candidates = np.arange(1000, 1100)
    ids = [i % 500 for i in range(20_000)]
    edited, counts = edit_tokens(ids, cfg, candidates, np.random.default_rng(0))
    for key, rate in (("deleted", 0.1), ("substituted", 0.2), ("inserted", 0.05)):
        assert abs(counts[key] / len(ids) - rate) < 4 * math.sqrt(rate * (1 - rate) / len(ids)), key
    assert len(edited) == len(ids) - counts["deleted"] + counts["inserted"]
    new = [t for t in edited if t >= 1000]
    assert len(new) == counts["substituted"] + counts["inserted"] and all(t < 1100 for t in new)
    again, _ = edit_tokens(ids, cfg, candidates, np.random.default_rng(0))
    assert again == edited


def test_edit_attack_end_to_end(eval_dir, tmp_path):
    out = tmp_path / "edit"
    results = run_edit(eval_dir, out, EditConfig(delete=0.3, substitute=0.3), progress=False)
    assert [r["method"] for r in results["runs"]] == list(METHODS)
    for rates in results["realised_rates"].values():  # 8 x 32 tokens: sd of a rate is about 0.03
        assert abs(rates["deleted"] - 0.3) < 0.12 and abs(rates["substituted"] - 0.3) < 0.12
    mean_before = np.mean([r["auroc_before"] for r in results["runs"]])
    mean_after = np.mean([r["auroc_after"] for r in results["runs"]])
    assert mean_after < mean_before  # replacing 60% of the tokens weakens the evidence
    assert (out / "results.json").exists() and (out / "edit_tpr.png").exists()
    # the eval attacked is named by its created time too: one run again into the same folder is another eval
    written = json.loads((out / "results.json").read_text())
    assert written["eval_created"] == json.loads((eval_dir / "results.json").read_text())["created"]
    section = _section_in_report(eval_dir, out)
    assert "## Attack: token edits" in section
    # beside TPR, the rate at p <= 0.01, which needs no threshold: deletions shorten the text
    assert "at p<=0.01 original" in section and "at p<=0.01 edited" in section
    assert all(0 <= r["flagged_at_p_0.01_after"] <= 1 for r in results["runs"])  # each method here gives p-values
    with pytest.raises(ValueError, match="different settings"):
        run_edit(eval_dir, out, EditConfig(delete=0.2), progress=False)


def test_edit_and_quantize_attack_at_equal_cost(eval_dir, tmp_path):
    """--at-cost reaches the attacks that re-score or re-generate, not only paraphrase: the strength is chosen by
    its own perplexity change (one per method here), and the section names each run with its cost."""
    ev = open_eval(eval_dir)
    cost = {r["run"]: r["metrics"]["own_ppl_change"] for r in ev.runs}
    results = run_edit(eval_dir, tmp_path / "edit", EditConfig(delete=0.3, methods=("kgw",), at_cost=0.3), False)
    run = results["runs"][0]["run"]
    assert results["settings"]["at_cost"] == 0.3 and [r["run"] for r in results["runs"]] == [run]
    assert f"nearest +30% ({run} {cost[run]:+.1%})" in _section_in_report(eval_dir, tmp_path / "edit")
    for cfg in (EditConfig, QuantizeConfig):
        with pytest.raises(ValueError, match="at_cost"):
            cfg(at_cost=-1.0)


def test_the_weight_attacks_take_at_cost_too(eval_dir, tmp_path):
    """Fine-tuning, merging, pruning and instruction tuning choose their runs at equal cost as well: `attack merge
    --at-cost` records the setting, leaves out the decode-time method, and its section names each run with its cost;
    every such attack refuses a perplexity change of -100% or below."""
    from openstamp.lab.attacks.instruct import InstructConfig
    from openstamp.lab.attacks.merge import MergeConfig
    from openstamp.lab.attacks.prune import PruneConfig

    cost = {r["run"]: r["metrics"]["own_ppl_change"] for r in open_eval(eval_dir).runs}
    out = tmp_path / "merge-at-cost"
    args = ["attack", "merge", "--eval", str(eval_dir), "--out", str(out), "--method", "linear", "--t", "0.5"]
    result = runner.invoke(app, [*args, "--n", "2", "--ppl-windows", "1", "--seq-len", "32", "--at-cost", "0.3"])
    assert result.exit_code == 0, result.output
    results = json.loads((out / "results.json").read_text())
    runs = list(dict.fromkeys(r["run"] for r in results["runs"]))
    assert results["settings"]["at_cost"] == 0.3 and results["skipped"] == ["kgw"] and len(runs) == 2
    said = ", ".join(f"{run} {cost[run]:+.1%}" for run in runs)
    section = _section_in_report(eval_dir, out)
    assert f"nearest +30% ({said})." in section and "Rate at p <= 0.01" in section
    assert all(0 <= r["flagged_at_p_0.01"] <= 1 for r in results["runs"])  # both detectors give p-values
    for cfg in (FinetuneConfig, InstructConfig, MergeConfig, PruneConfig):
        with pytest.raises(ValueError, match="at_cost"):
            cfg(at_cost=-1.0)


def test_an_attack_folder_grows_by_methods_but_does_not_shrink(eval_dir, tmp_path):
    out, cfg = tmp_path / "edit", EditConfig(delete=0.3, methods=("kgw",))
    first = run_edit(eval_dir, out, cfg, progress=False)
    grown = run_edit(eval_dir, out, replace(cfg, methods=("kgw", "unremovable")), progress=False)
    assert [r["method"] for r in grown["runs"]] == ["kgw", "unremovable"] and grown["runs"][0] == first["runs"][0]
    with pytest.raises(ValueError, match="methods"):  # dropping one is a change
        run_edit(eval_dir, out, replace(cfg, methods=("unremovable",)), progress=False)


def test_select_runs_rejects_unknown_methods(eval_dir):
    ev = open_eval(eval_dir)
    assert [r["method"] for r in select_runs(ev, ["kgw"])] == ["kgw"]
    with pytest.raises(ValueError, match="not in"):
        select_runs(ev, ["gaussmark"])


def test_select_runs_at_cost_takes_each_methods_strength_nearest_it(eval_dir):
    ev = open_eval(eval_dir)
    seed = ev.cfg.seeds[0]

    def run(method, strength, cost):
        metrics = {} if cost is None else {"own_ppl_change": cost}
        return {
            "run": f"{method}@{strength:g}/s{seed}",
            "method": method,
            "strength": strength,
            "seed": seed,
            "metrics": metrics,
        }

    grid = [
        run("kgw", 1.0, 0.05),
        run("kgw", 2.0, 0.2),
        run("kgw", 3.0, 0.5),
        run("sir", 0.5, 0.1),
        run("sir", 1.0, 0.42),
    ]
    sweep = replace(ev, runs=grid)
    assert [r["run"] for r in select_runs(sweep, at_cost=0.3)] == [f"kgw@2/s{seed}", f"sir@1/s{seed}"]
    assert [r["strength"] for r in select_runs(sweep, ["kgw"], at_cost=0.1)] == [1.0]
    assert [r["strength"] for r in select_runs(sweep, ["kgw"])] == [3.0]  # without: the eval's configured one
    unmeasured = replace(ev, runs=[*grid, run("kgw", 4.0, None)])
    with pytest.raises(ValueError, match="no own perplexity change"):
        select_runs(unmeasured, ["kgw"], at_cost=0.3)
    with pytest.raises(ValueError, match="at_cost"):
        ParaphraseConfig(at_cost=-1.5)


# -- quantization ------------------------------------------------------------------------------


def test_int8_keeps_at_most_255_values_per_row():
    w = torch.randn(16, 700) * torch.logspace(-2, 1, 16)[:, None]
    q = quantize_int8(w)
    assert all(len(torch.unique(row)) <= 2**8 for row in q)
    assert torch.allclose(q.abs().amax(1), w.abs().amax(1))  # the absmax is exact
    assert float((q - w).norm() / w.norm()) < 0.01


def test_nf4_keeps_at_most_16_values_per_block_of_64():
    w = torch.randn(12, 320)
    q = quantize_nf4(w, 64, chunk_blocks=7)  # chunks that split the matrix mid-row
    blocks = q.reshape(-1, 64)
    assert all(len(torch.unique(b)) <= 2**4 for b in blocks)
    assert torch.allclose(blocks.abs().amax(1), w.reshape(-1, 64).abs().amax(1))
    assert 0.02 < float((q - w).norm() / w.norm()) < 0.15
    assert torch.equal(quantize_nf4(w, 64), q)


@pytest.mark.parametrize("tied", [True, False])
def test_quantize_model_keeps_lm_head_unless_asked(tied, tokenizer):
    model = make_model(tied, len(tokenizer))
    embeddings = model.get_input_embeddings().weight.detach().clone()
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    info = quantize_model(model, "nf4", False, backend="simulated")
    assert info["backend"] == "simulated" and info["matrices"] == 2 * 7  # q k v o gate up down per block
    assert torch.equal(head(model).weight, original["lm_head.weight" if not tied else "model.embed_tokens.weight"])
    up = model.model.layers[0].mlp.up_proj.weight
    assert not torch.equal(up, original["model.layers.0.mlp.up_proj.weight"])
    quantize_model(model, "int8", True, backend="simulated")
    assert all(len(torch.unique(row)) <= 255 for row in head(model).weight)
    assert torch.equal(model.get_input_embeddings().weight, embeddings)  # untied before the head was touched


def test_quantize_attack_end_to_end(eval_dir, tmp_path):
    out = tmp_path / "quant"
    cfg = QuantizeConfig(schemes=("int8", "nf4", "gguf-q4_k_m"), n=4, backend="auto")
    results = run_quantize(eval_dir, out, cfg, progress=False)
    labels = ("unquantized", "int8", "nf4", "gguf-q4_k_m", "gguf-q4_k_m+float-head")  # GGUF: also a float head
    assert {(r["method"], r["scheme"]) for r in results["runs"]} == {(m, s) for m in METHODS for s in labels}
    how = results["quantization"]
    assert how["gguf-q4_k_m"]["backend"] == "gguf" and how["gguf-q4_k_m"]["head_quantized"]
    assert not how["gguf-q4_k_m+float-head"]["head_quantized"] and not how["int8"]["head_quantized"]
    for row in results["runs"]:  # every attacked row says which backend made it, and why when simulated
        assert row["scheme"] == "unquantized" or row["backend"] in ("bitsandbytes", "simulated", "gguf")
        assert (row["backend"] == "simulated") == bool(row["why_simulated"])
        low, high = row["tpr_at_1pct_fpr_ci"]  # with the rate at p <= 0.01, which holds without a threshold
        assert low <= row["tpr_at_1pct_fpr"] <= high and 0 <= row["flagged_at_p_0.01"] <= 1
    assert len(json.loads((out / "scores" / "int8" / "unremovable@2_s0.json").read_text())) == 4
    section = _section_in_report(eval_dir, out)
    header = " | ".join(f"{s.upper()} [{how[s]['backend']}]" for s in labels[1:])
    assert f"| method | Unquantized | {header} |" in section and "kgw (decode-time)" in section
    assert "TPR@1%FPR:" in section and "at p<=0.01:" in section  # a table per attack metric of the registry


# -- fine-tuning -------------------------------------------------------------------------------


def _windows(tokenizer, seq_len=32):
    return training_windows(tokenizer, [Document(str(i), t) for i, t in enumerate(make_corpus(6))], seq_len)


def test_lora_moves_only_the_adapters(tokenizer):
    model = make_model(False, len(tokenizer))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    cfg = FinetuneConfig(mode="lora", steps=4, every=2, batch_size=2, seq_len=32, lr=1e-2)
    peft_model = prepare(model, cfg)
    adapters = {n: p.detach().clone() for n, p in peft_model.named_parameters() if "lora_" in n}
    assert any("lm_head" in n for n in adapters) and any("up_proj" in n for n in adapters)
    seen = []
    losses = train(peft_model, _windows(tokenizer), cfg, lambda step, loss: seen.append(step))
    assert seen == [0, 2, 4] and len(losses) == 4
    moved = [n for n, p in peft_model.named_parameters() if n in adapters and not torch.equal(p, adapters[n])]
    assert len(moved) == len(adapters)
    for name, p in model.named_parameters():  # peft wraps in place: the base weights are the originals
        if "lora_" not in name:
            key = name.replace("base_model.model.", "").replace(".base_layer", "")
            assert torch.equal(p, before[key]), name


def test_head_mode_trains_only_an_untied_head(tokenizer):
    model = make_model(True, len(tokenizer))
    embeddings = model.get_input_embeddings().weight.detach().clone()
    layer = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    cfg = FinetuneConfig(mode="head", steps=2, every=2, batch_size=2, seq_len=32, lr=1e-2, optimizer="adamw")
    train(prepare(model, cfg), _windows(tokenizer), cfg)
    assert not torch.equal(head(model).weight, embeddings)
    assert torch.equal(model.get_input_embeddings().weight, embeddings)
    assert torch.equal(model.model.layers[0].mlp.up_proj.weight, layer)


def test_finetune_attack_end_to_end_and_resume(eval_dir, corpus_file, tmp_path, monkeypatch):
    out = tmp_path / "ft"
    cfg = FinetuneConfig(corpus=str(corpus_file), steps=4, every=2, batch_size=2, seq_len=32, n=4, lr=1e-2)
    results = run_finetune(eval_dir, out, cfg, progress=False)
    assert results["skipped"] == ["kgw"]
    assert {(r["method"], r["step"]) for r in results["runs"]} == {
        (m, s) for m in ("openstamp", "unremovable") for s in (0, 2, 4)
    }
    assert all(r["train_loss"] is not None for r in results["runs"] if r["step"] > 0)
    assert (out / "finetune_tpr.png").exists()
    assert "step 4" in _section_in_report(eval_dir, out)
    # each row keeps its texts' scores: with the eval's human ones they give its TPR (a summary redraws both)
    human = {r["run"]: r["scores"]["human"] for r in json.loads((eval_dir / "results.json").read_text())["runs"]}
    for r in results["runs"]:
        assert len(r["scores"]) == cfg.n
        pos, neg = against({"watermarked": r["scores"], "human": human[r["run"]]})
        assert tpr_at_fpr(pos, neg, 0.01)["tpr"] == r["tpr_at_1pct_fpr"]
    monkeypatch.setattr(finetune, "train", lambda *a, **k: pytest.fail("a finished attack was retrained"))
    again = run_finetune(eval_dir, out, cfg, progress=False)
    assert again["runs"] == results["runs"]


# -- paraphrasing ------------------------------------------------------------------------------


def test_ngram_survival():
    assert ngram_survival([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert ngram_survival([1, 2, 3, 4], [4, 3, 2, 1]) == 0.0
    assert ngram_survival([1, 2, 3, 4], [9, 1, 2, 3]) == 0.5
    assert math.isnan(ngram_survival([1, 2], [1, 2]))


def test_copies_are_flagged_and_rewrites_are_not(tokenizer):
    originals = ["the river city council voted on a new plan for public parks and schools"] * 2
    rewrites = ["councillors approved fresh proposals covering schools and parks near the river", ""]
    copy = measure_quality(originals, originals, tokenizer)["summary"]
    assert copy["near_copy_fraction"] == 1.0 and copy["cosine_mean"] > 0.99
    other = measure_quality(originals, rewrites, tokenizer)["summary"]
    assert other["near_copy_fraction"] == 0.0 and other["empty_fraction"] == 0.5
    assert other["word_3gram_survival_mean"] == 0.0 and other["cosine_mean"] < 0.9


def test_request_goes_through_the_chat_template(tokenizer):
    tokenizer.chat_template = CHAT_TEMPLATE
    try:
        text = tokenizer.decode(request_ids(tokenizer, "the river"))
    finally:
        tokenizer.chat_template = None
    assert text == "the river\nAnswer: "


def _stub_embeddings(texts, name="minilm", **kwargs):
    """Letter counts, L2-normalised: enough to tell copies from rewrites without the sentence model."""
    vectors = torch.tensor([[t.lower().count(c) + 1e-3 for c in "abcdefghijklmnopqrstuvwxyz"] for t in texts])
    return torch.nn.functional.normalize(vectors, dim=-1)


def test_paraphrase_attack_end_to_end(eval_dir, model_dir, tokenizer, tmp_path, monkeypatch):
    import openstamp.embed.sentences

    monkeypatch.setattr(openstamp.embed.sentences, "encode_texts", _stub_embeddings)
    paraphraser = tmp_path / "paraphraser"  # the tiny model, made 'instruct' with a chat template
    make_model(False, len(tokenizer) + 12, seed=3).save_pretrained(paraphraser)
    tokenizer.chat_template = CHAT_TEMPLATE
    try:
        tokenizer.save_pretrained(paraphraser)
    finally:
        tokenizer.chat_template = None
    out = tmp_path / "para"
    cfg = ParaphraseConfig(paraphraser=str(paraphraser), n=4, max_new_tokens=24, batch_size=2)
    results = run_paraphrase(eval_dir, out, cfg, progress=False)
    assert [r["method"] for r in results["runs"]] == list(METHODS)
    assert len(list((out / "paraphrases").rglob("b*.json"))) == 3 * 2  # 3 generation sets x 2 batches
    for q in results["quality"].values():
        assert q["n"] == 4 and -1 <= q["cosine_mean"] <= 1 and 0 <= q["token_3gram_survival_mean"] <= 1
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 12 and all(s["original"] != s["paraphrase"] for s in samples)
    section = _section_in_report(eval_dir, out)
    assert "TPR@1%FPR paraphrased" in section and "token 3-grams kept" in section
    for run in results["runs"]:  # the tiny paraphraser rewrites everything, so no near-copy is excluded
        assert run["real"]["n"] == 4 and run["real"]["tpr_at_1pct_fpr_after"] == run["tpr_at_1pct_fpr_after"]
    assert "Near-copies excluded" in section and "human at their lengths" in section
    human = [w["human"] for w in json.loads((eval_dir / "data" / "prompts.json").read_text())]
    for run in results["runs"]:  # every human continuation, cut to the paraphrases' scored lengths in turn
        name = run["run"].replace("/", "_")
        lengths = [
            s["n_tokens"] for s in json.loads((out / "scores" / f"{name}.json").read_text()) if s["score"] is not None
        ]
        cut = json.loads((out / "scores" / f"{name}-human-cut.json").read_text())
        assert cut["ids"] == [min(len(ids), lengths[j % len(lengths)] + 1) for j, ids in enumerate(human)]
        assert len(cut["scores"]) == len(human) and 0 <= run["real"]["human_cut"]["over_threshold"] <= 1


def test_real_paraphrases_leave_out_near_copies():
    human = [{"score": s, "p_value": None} for s in np.linspace(-1, 0, 100)]
    eval_scores = {"human": human, "unwatermarked": human}
    before = [{"score": 1.0, "p_value": None}] * 4
    after = [{"score": s, "p_value": None} for s in (0.5, 0.4, -0.5, 0.9)]
    survival = [0.1, 0.3, 0.2, 0.95]  # the last one is a near-copy: it stays flagged, and is not counted
    real = real_paraphrases(before, after, eval_scores, survival, near_copy=0.8)
    assert real["n"] == 3 and real["tpr_at_1pct_fpr_before"] == 1.0
    assert real["tpr_at_1pct_fpr_after"] == pytest.approx(2 / 3)
    assert real["mean_score_after"] == pytest.approx(0.4 / 3) and real["mean_score_before"] == 1.0
    low, high = real["tpr_at_1pct_fpr_after_ci"]
    assert low < 2 / 3 < high and (low, high) == pytest.approx(clopper_pearson(2, 3))
    assert real_paraphrases(before, after, eval_scores, [0.9] * 4, near_copy=0.8) == {"n": 0}
    assert real["flagged_at_p_0.01"] is None  # no p-values, no rate


def test_real_paraphrases_count_p_values_of_kept_texts_only():
    human = [{"score": s, "p_value": 0.5} for s in np.linspace(-1, 0, 100)]
    eval_scores = {"human": human, "unwatermarked": human}
    before = [{"score": 1.0, "p_value": 1e-6}] * 4
    p_values = (0.001, 0.5, None, 1e-9)  # None: too short to score, so not flagged
    after = [{"score": None if p is None else 0.5, "p_value": p} for p in p_values]
    survival = [0.1, 0.3, 0.2, 0.95]  # the flagged near-copy is left out
    real = real_paraphrases(before, after, eval_scores, survival, near_copy=0.8)
    assert real["n"] == 3 and real["flagged_at_p_0.01"] == pytest.approx(1 / 3)


def test_human_text_cut_to_the_paraphrases_lengths_splits_the_threshold_from_the_p_value():
    human = [{"score": s, "p_value": 0.5} for s in np.linspace(-1, 0, 100)]  # 1% FPR threshold: just below 0
    eval_scores = {"human": human, "unwatermarked": human}
    before = [{"score": 1.0, "p_value": 1e-6}] * 4
    after = [{"score": s, "p_value": 0.5} for s in (0.5, 0.4, -0.5, 0.9)]
    # cut to the paraphrases' lengths, 30 human texts pass the full-length threshold, 3 have p <= 0.01
    cut = [{"score": 0.2, "p_value": 0.001 if i < 3 else 0.5} for i in range(30)]
    cut += [{"score": -0.5, "p_value": 0.5}] * 70 + [{"score": None, "p_value": None}]
    real = real_paraphrases(before, after, eval_scores, [0.1, 0.3, 0.2, 0.95], 0.8, cut)
    assert real["tpr_at_1pct_fpr_after"] == pytest.approx(2 / 3)  # 0.5 and 0.4 pass the full-length threshold
    matched = real["human_cut"]
    assert matched["n"] == 100 and matched["over_threshold"] == pytest.approx(0.3)
    assert matched["flagged_at_p_0.01"] == pytest.approx(0.03)
    assert matched["tpr_at_1pct_fpr"] == pytest.approx(2 / 3)  # the cut texts' threshold is 0.2: 0.5, 0.4 pass
    assert tuple(matched["tpr_at_1pct_fpr_ci"]) == pytest.approx(clopper_pearson(2, 3))
    # the kept paraphrases' and the cut texts' scores are kept: they give the TPR at their lengths again
    pos, neg = against({"watermarked": real["scores"], "human": matched["scores"]})
    assert len(pos) == 3 and tpr_at_fpr(pos, neg, 0.01)["tpr"] == matched["tpr_at_1pct_fpr"]
    cut[:30] = [{"score": 0.45, "p_value": 0.5}] * 30  # now the cut texts' threshold (0.45) stops 0.4
    assert real_paraphrases(before, after, eval_scores, [0.1] * 3 + [0.95], 0.8, cut)["human_cut"][
        "tpr_at_1pct_fpr"
    ] == pytest.approx(1 / 3)
    assert "human_cut" not in real_paraphrases(before, after, eval_scores, [0.1] * 4, 0.8)
    too_short = [{"score": None, "p_value": None}] * 3  # no cut text scored: nothing to compare with
    assert "human_cut" not in real_paraphrases(before, after, eval_scores, [0.1] * 4, 0.8, too_short)


def test_the_paraphrase_table_leads_with_the_tpr_at_the_paraphrases_lengths():
    """Where human text was cut to the paraphrases' lengths, the bold TPR is the one at those lengths: the full-length
    threshold's TPR (the bold one before) flatters a per-token-mean score on shorter text."""
    human = [{"score": s, "p_value": 0.5} for s in np.linspace(-1, 0, 100)]
    eval_scores = {"human": human, "unwatermarked": human}
    before = [{"score": 1.0, "p_value": 1e-6}] * 4
    after = [{"score": s, "p_value": 0.5} for s in (0.5, 0.4, -0.5, 0.9)]
    cut = [{"score": 0.45, "p_value": 0.5}] * 30 + [{"score": -0.5, "p_value": 0.5}] * 70
    row = {"run": "m@1/s0", "real": real_paraphrases(before, after, eval_scores, [0.1] * 3 + [0.95], 0.8, cut)}
    table = _real_table([row], 0.8)
    header, body = table[2], table[4]
    cells = [c.strip() for c in body.strip("|").split("|")]
    assert "**" in cells[header.strip("|").split("|").index(" TPR@1%FPR at their lengths [95% CI] ")]
    assert cells[3].startswith("**0.333") and cells[5].startswith("0.667")  # 1/3 at their lengths, 2/3 at full
    row["real"].pop("human_cut")  # no cut text (an older run): the full-length TPR is the one in bold
    cells = [c.strip() for c in _real_table([row], 0.8)[4].strip("|").split("|")]
    assert cells[5].startswith("**0.667") and "**" not in cells[3]


def test_cut_to_gives_each_human_text_a_paraphrase_length_in_turn():
    human = [list(range(10))] * 5
    assert [len(ids) for ids in cut_to(human, [3, 20])] == [4, 10, 4, 10, 4]  # L scored tokens are L + 1 ids
    assert cut_to(human, [3])[0] == [0, 1, 2, 3]


# -- re-initialised head, selector inversion ---------------------------------------------------


def test_a_killed_head_training_resumes_to_the_weights_of_an_uninterrupted_one(tmp_path):
    generator = torch.Generator().manual_seed(0)
    hidden, ids = torch.randn(16, 12, 8, generator=generator), torch.randint(0, 20, (16, 12), generator=generator)
    init, cfg = torch.randn(20, 8, generator=generator) * 0.02, ReinitConfig(steps=20, every=5, batch_size=4, lr=0.05)
    whole, whole_history = train_head(hidden, ids, init, cfg, lambda w: {"norm": float(w.norm())})
    calls = []

    def dies_at_step_15(weight):
        calls.append(1)
        if len(calls) == 4:  # steps 0, 5, 10 recorded and saved; killed while recording step 15
            raise KeyboardInterrupt
        return {"norm": float(weight.norm())}

    state = tmp_path / "training_state.pt"
    with pytest.raises(KeyboardInterrupt):
        train_head(hidden, ids, init, cfg, dies_at_step_15, checkpoint=state)
    resumed, history = train_head(hidden, ids, init, cfg, lambda w: {"norm": float(w.norm())}, checkpoint=state)
    assert torch.equal(resumed, whole) and history == whole_history
    state.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="delete it"):
        train_head(hidden, ids, init, cfg, checkpoint=state)


def test_reinit_head_recovers_some_quality_and_keeps_the_embeddings(
    model_dir, corpus_file, eval_dir, tokenizer, tmp_path
):
    from openstamp.model.load import load_model

    cfg = ReinitConfig(
        corpus=str(corpus_file), steps=30, every=10, batch_size=4, seq_len=32, lr=3e-2, train_windows=64, eval_windows=8
    )
    out = tmp_path / "reinit"
    results = run_reinit(str(model_dir), out, cfg, eval_dir, progress=False)
    ppl = [h["ppl"] for h in results["history"]]
    assert [h["step"] for h in results["history"]] == [0, 10, 20, 30]
    assert ppl[-1] < 0.5 * ppl[0] and results["baseline_ppl"] > 1
    assert "Watermarked baseline" in _section_in_report(eval_dir, out)
    # the plateau is the first checkpoint within 2% of the last one, and every window was seen 30*4/64 times
    first = next(h for h in results["history"][1:] if h["ppl"] <= ppl[-1] * 1.02)
    assert results["plateau_step"] == first["step"] and results["epochs"] == pytest.approx(30 * 4 / 64)
    assert results["final_over_baseline"] == pytest.approx(ppl[-1] / results["baseline_ppl"])
    again = run_reinit(str(model_dir), out, cfg, eval_dir, progress=False)  # resumes from the last state: no training
    assert again["history"] == results["history"]
    everything = run_reinit(str(model_dir), tmp_path / "all", replace(cfg, train_windows=0, steps=10), progress=False)
    assert everything["train_tokens_distinct"] > 64 * 32  # 0: every window of the key half
    model, _ = load_model(str(model_dir))
    embeddings = model.get_input_embeddings().weight.detach().clone()
    new = torch.randn_like(head(model).weight)
    install_head(model, new)
    assert torch.equal(head(model).weight, new) and torch.equal(model.get_input_embeddings().weight, embeddings)
    ids = torch.tensor([tokenizer("the river city council voted on a new plan").input_ids])
    logits = model(input_ids=ids).logits[0, :-1].detach()
    expected = float(torch.nn.functional.cross_entropy(logits, ids[0, 1:]))
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state.detach()
    assert head_nll(hidden, ids, new) == pytest.approx(expected, rel=1e-4)


def test_selector_inversion_control_agrees_and_other_seeds_do_not(model_dir, corpus_file, tmp_path):
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join(json.dumps({"text": t}) for t in make_corpus(40, seed=7)) + "\n")
    cfg = InversionConfig(
        corpora=(str(corpus_file), str(other)),
        test_corpora=(str(corpus_file),),
        n_lists=8,
        n_states=384,
        n_test=128,
        projection=False,
        profile="small",
        overrides={
            "states.window_tokens": 96,
            "states.positions_per_window": 32,
            "states.context_tokens": 16,
            "selector.min_cluster_size": 5,
        },
    )
    results = run_inversion(str(model_dir), tmp_path / "inv", cfg, progress=False)
    by_name = {r["condition"]: r for r in results["conditions"]}
    assert by_name["Same dataset & seed (control)"]["ari"] == pytest.approx(1.0)
    assert by_name["Same dataset & seed (control)"]["nmi"] == pytest.approx(1.0)
    assert by_name["Different seed"]["ari"] < 1.0
    assert all(-1 <= r["ari"] <= 1 and 0 <= r["nmi"] <= 1 for r in results["conditions"])
    assert (tmp_path / "inv" / "report.md").read_text().count("| Different") == 3


# -- command line ------------------------------------------------------------------------------


def test_attack_cli(eval_dir, tmp_path):
    listing = runner.invoke(app, ["attack", "--help"])
    names = ("paraphrase", "finetune", "quantize", "reinit-head", "edit", "selector-inversion", "merge", "prune")
    for name in (*names, "instruct"):
        assert name in listing.output
    result = runner.invoke(
        app, ["attack", "edit", "--eval", str(eval_dir), "--out", str(tmp_path / "cli-edit"), "--delete", "0.5"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "cli-edit" / "settings.json").read_text())["delete"] == 0.5
    # a trial run's section leaves the eval's report on request, with its images; the attack's folder stays
    images = sorted((eval_dir / "attacks").glob("cli-edit_*.png"))
    assert images and "cli-edit_" in (eval_dir / "report.md").read_text()
    dropped = runner.invoke(app, ["report", str(eval_dir), "--drop-attack", "cli-edit"])
    assert dropped.exit_code == 0, dropped.output
    assert not any(p.exists() for p in images) and not (eval_dir / "attacks" / "cli-edit.md").exists()
    assert "cli-edit_" not in (eval_dir / "report.md").read_text() and (tmp_path / "cli-edit" / "results.json").exists()
    again = runner.invoke(app, ["report", str(eval_dir), "--drop-attack", "cli-edit"])
    assert again.exit_code == 2 and "no attack section 'cli-edit'" in again.output
    outside = runner.invoke(app, ["report", str(eval_dir), "--drop-attack", "../report"])
    assert outside.exit_code == 2 and (eval_dir / "report.md").exists()
    bad = runner.invoke(app, ["attack", "edit", "--eval", str(tmp_path / "missing"), "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "openstamp eval" in bad.output
    bad = runner.invoke(
        app, ["attack", "quantize", "--eval", str(eval_dir), "--scheme", "int3", "--out", str(tmp_path / "q")]
    )
    assert bad.exit_code == 2 and "schemes" in bad.output


def test_attack_options_default_to_their_settings():
    """Each attack command builds its settings from its parameters of the same names, so an option's default must
    be the settings' own (a comma-separated option: the same values)."""
    import inspect
    from dataclasses import fields

    from openstamp.lab.attacks.instruct import InstructConfig
    from openstamp.lab.attacks.merge import MergeConfig
    from openstamp.lab.attacks.prune import PruneConfig
    from openstamp.lab.cli import attack, durability

    commands = {
        attack.paraphrase: ParaphraseConfig,
        attack.finetune: FinetuneConfig,
        attack.quantize: QuantizeConfig,
        attack.reinit_head: ReinitConfig,
        attack.edit: EditConfig,
        attack.selector_inversion: InversionConfig,
        durability.merge: MergeConfig,
        durability.prune: PruneConfig,
        durability.instruct: InstructConfig,
    }
    spelled = lambda value: ",".join(map(str, value)) if isinstance(value, tuple) else value  # noqa: E731
    checked = 0
    for command, settings in commands.items():
        defaults = {f.name: f.default for f in fields(settings)}
        for param in inspect.signature(command).parameters.values():
            if param.name in defaults:
                assert param.default.default == spelled(defaults[param.name]), (command.__name__, param.name)
                checked += 1
    assert checked >= 60


def test_titled_tables_set_each_metric_under_its_title_in_order():
    from openstamp.lab.attacks.report import DETECTION_TABLES, titled_tables

    lines = titled_tables(lambda metric: [f"| {metric} |"], (*DETECTION_TABLES, ("Loss:", "train_loss")))
    titles = [title for title, _ in DETECTION_TABLES]
    assert lines == [
        "", titles[0], "", "| tpr_at_1pct_fpr |",
        "", titles[1], "", "| flagged_at_p_0.01 |",
        "", "Loss:", "", "| train_loss |",
    ]  # fmt: skip
