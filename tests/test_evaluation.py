import json
import re

import pytest
from typer.testing import CliRunner

import openstamp.lab.evaluation.pipeline as pipeline
from openstamp import load_model
from openstamp.cli import app
from openstamp.lab.evaluation.config import EvalConfig
from openstamp.lab.evaluation.metrics import METRICS
from openstamp.lab.evaluation.report import COLUMNS, fmt, shown_columns, timing_lines
from openstamp.lab.evaluation.timings import StageClock, record_timings
from openstamp.runtime import machine

runner = CliRunner()
METHODS = tuple(pipeline.REGISTRY)  # every registered method


# strengths that suit the tiny random model (its weights are far larger than a trained model's). OpenStamp's two
# variants need the most: on 8 completions of 32 tokens their AUROC ranged 0.47-1.0 over seeds 0-3 at delta 2
# (either sampler), 0.72-1.0 at delta 6
TINY_STRENGTHS = {
    "openstamp-projected": 6.0,
    "openstamp": 6.0,
    "unremovable": 2.0,
    "gaussmark": 0.5,
    "kgw": 3.0,
    "kgw-llr": 3.0,
    "kgw-distilled": 3.0,  # the key's distillation delta (method_settings below): one key per delta
    "sir": 2.0,
    "hf-kgw": 3.0,
    "synthid": 8,
}


def tiny_eval(model_dir, corpus_file, methods=METHODS, **overrides) -> EvalConfig:
    settings = {
        "openstamp-projected": {"profile": "small", "n_lists": 8},
        "openstamp": {"profile": "small", "n_lists": 8, "shrinkage": 0.0, "centre": False},
        "kgw-distilled": {"delta": 3.0, "steps": 200, "seq_len": 64, "batch_size": 8, "lr": 1e-2},
        "sir": {"embedder": "bow", "steps": 100},  # a light embedder and a short training
    }
    return EvalConfig.from_dict(
        {
            "model": str(model_dir),
            "methods": list(methods),
            "corpus": str(corpus_file),
            "key_corpus": str(corpus_file),
            "n": 8,
            "prompt_tokens": 8,
            "new_tokens": 32,
            "batch_size": 4,
            "score_batch_size": 4,
            "oracle": str(model_dir),
            "method_settings": settings,
            "strengths": {m: TINY_STRENGTHS[m] for m in methods if m in TINY_STRENGTHS},
            **overrides,
        }
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tokenizer):
    """One (untied) tiny model is enough here; the methods' own tests cover tied ones."""
    from conftest import make_model

    path = tmp_path_factory.mktemp("tiny-eval")
    make_model(tied=False, vocab_size=len(tokenizer) + 12).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def finished_run(model_dir, corpus_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("eval")
    methods = list(METHODS)
    results = pipeline.run_eval(tiny_eval(model_dir, corpus_file, methods), out, progress=False)
    return out, results, methods


def test_report_files_appear(finished_run):
    out, results, methods = finished_run
    for name in ("results.json", "samples.jsonl", "report.md", "roc.png", "scores_hist.png", "pareto.png"):
        assert (out / name).exists(), name
    assert [s["method"] for s in results["summary"]] == methods
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 8 and set(samples[0]["runs"]) == {r["run"] for r in results["runs"]}


def test_report_numbers_equal_results_json(finished_run):
    out, results, _ = finished_run
    report = (out / "report.md").read_text()
    for s in results["summary"]:
        row = next(line for line in report.splitlines() if line.startswith(f"| {s['method']} | "))
        cells = [c.strip().rstrip(" †") for c in row.strip("|").split("|")][2:]
        columns = shown_columns(results)  # the registry's columns that hold a number (no downstream tasks here)
        assert len(columns) < len(COLUMNS) and not any("downstream" in key for _, key in columns)
        expected = [fmt(s.get(key), key) for _, key in columns]
        assert cells == expected
        for cell, (_, key) in zip(cells, columns, strict=True):
            if cell != "-":  # a percentage cell is 100 x the fraction in results.json
                scale = 100 if METRICS[key].percent else 1
                value = cell.split(" [")[0]  # TPR@1%FPR carries its bootstrap interval
                assert float(value.rstrip("%")) == pytest.approx(scale * s[key]["mean"], abs=10 ** -METRICS[key].digits)
        low, high = s["tpr_at_1pct_fpr"]["ci"]
        assert low <= s["tpr_at_1pct_fpr"]["mean"] <= high and f"[{low:.3f}, {high:.3f}]" in row


def test_every_method_detects_itself_on_the_tiny_model(finished_run):
    _, results, _ = finished_run
    for run in results["runs"]:
        assert run["metrics"]["auroc"] >= 0.75, run["run"]
        low, high = run["metrics"]["tpr_at_1pct_fpr_ci"]  # the bootstrap over texts brackets the point
        assert low <= run["metrics"]["tpr_at_1pct_fpr"] <= high, run["run"]


def test_every_run_reports_its_own_perplexity_against_the_original(finished_run):
    from openstamp.model.perplexity import perplexity

    out, results, _ = finished_run
    original = results["references"]["human"]["own_ppl_original"]
    assert original == pytest.approx(perplexity(json.loads((out / "own_ppl" / "original.json").read_text())))
    for run in results["runs"]:
        m = run["metrics"]
        assert m["own_ppl"] / original - 1 == pytest.approx(m["own_ppl_change"], rel=1e-6), run["run"]
        assert m["own_ppl_change_ci"][0] <= m["own_ppl_change"] <= m["own_ppl_change_ci"][1]
    # a watermark moves the model's distribution: no method leaves its own perplexity exactly as it was
    assert all(abs(run["metrics"]["own_ppl_change"]) > 0 for run in results["runs"])


def test_own_perplexity_from_reused_hidden_states_equals_a_fresh_pass(finished_run, model_dir, corpus_file):
    """The eval starts a keeps_hidden method's own perplexity from the original's cached states; recomputed here
    with the key applied and no cache (in the run's own_ppl_dtype), every run's NLLs are the same."""
    from openstamp.lab.hidden import autocast_decoder, lab_hidden
    from openstamp.model.load import load_model
    from openstamp.model.perplexity import window_nll
    from openstamp.model.text import bos_prefix

    out, results, _ = finished_run
    cfg = EvalConfig.from_file(str(out / "config.json"))
    model, tok = load_model(str(model_dir))
    windows = json.loads((out / "data" / "prompts.json").read_text())
    pairs = [(bos_prefix(tok) + w["prompt"], w["human"]) for w in windows]
    reused = 0
    for run in results["runs"]:
        method = pipeline.keyed_variant(out, run["method"], run["seed"], cfg, model, tok, [], run["strength"], {})
        reused += method.keeps_hidden
        method.apply(model)
        try:
            with autocast_decoder(cfg.own_ppl_dtype):
                fresh = window_nll(model, pairs, method.logits_processor(), cfg.score_batch_size, hidden=lab_hidden)
        finally:
            method.revert(model)
        kept = json.loads((out / "own_ppl" / f"{run['generations'].replace('/', '_')}.json").read_text())
        assert kept == pytest.approx(fresh, rel=1e-6), run["run"]
    assert reused >= 4  # unremovable, kgw, kgw-llr, sir


def test_rerender_and_config_mismatch(finished_run, model_dir, corpus_file):
    out, _, methods = finished_run
    (out / "report.md").unlink()
    result = runner.invoke(app, ["report", str(out)])
    assert result.exit_code == 0 and (out / "report.md").exists()
    other = tiny_eval(model_dir, corpus_file, methods, n=5)
    with pytest.raises(ValueError, match="different settings"):
        pipeline.run_eval(other, out, progress=False)


def test_the_oracle_records_its_dtype_and_another_dtype_rescores_only_the_perplexities(
    finished_run, model_dir, corpus_file, tmp_path
):
    import shutil

    from openstamp.lab.evaluation.oracle import load_perplexities
    from openstamp.lab.evaluation.scoring import oracle_dtype

    out, results, methods = finished_run
    fast = oracle_dtype(tiny_eval(model_dir, corpus_file, methods))
    assert fast in ("bfloat16", "float32") and results["oracle"]["dtypes"] == [fast]
    assert f"in {fast} (its own tokenizer)" in (out / "report.md").read_text()
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    other = "float32" if fast == "bfloat16" else "bfloat16"
    before = {p.name: load_perplexities(p, "float32") for p in (copy / "ppl").glob("*.json")}
    sets = {r["generations"] for r in results["runs"]} | {"human", "unwatermarked/s0"}  # kgw and kgw-llr share one
    assert len(before) == len(sets) and all(f["dtype"] == fast for f in before.values())
    legacy = copy / "ppl" / "human.json"  # a file from before the dtype was recorded: it ran in the model's dtype
    legacy.write_text(json.dumps(before["human.json"]["values"]))
    written = lambda folder: {p.name: p.stat().st_mtime_ns for p in (copy / folder).glob("*.json")}  # noqa: E731
    scores, ppl = written("scores"), written("ppl")
    rerun = pipeline.run_eval(tiny_eval(model_dir, corpus_file, methods, oracle_dtype=other), copy, progress=False)
    after = {p.name: load_perplexities(p, "float32") for p in (copy / "ppl").glob("*.json")}
    rescored = sorted(name for name, t in written("ppl").items() if t != ppl[name])
    kept = {"human.json"} if other == "float32" else set()  # the legacy file says float32 already
    assert rescored == sorted(set(before) - kept) and all(f["dtype"] == other for f in after.values())
    assert rerun["oracle"]["dtypes"] == [other]
    for name in rescored:  # the same texts under the same oracle: each perplexity moves by rounding only
        assert after[name]["values"] == pytest.approx(before[name]["values"], rel=0.05), name
    assert written("scores") == scores  # no detector ran again


def test_the_eval_dtypes_are_recorded_resolved_and_a_run_from_before_them_ran_in_float32(
    finished_run, model_dir, corpus_file, tmp_path
):
    import shutil

    from openstamp.lab.attacks.common import open_eval
    from openstamp.model.load import fast_dtype

    out, results, methods = finished_run
    fields = ("score_dtype", "sample_dtype", "own_ppl_dtype")
    assert all(results["config"][name] == fast_dtype("cpu") for name in fields)  # 'fast', as this machine resolves it
    report = (out / "report.md").read_text()
    assert f"sampled in {fast_dtype('cpu')}" in report
    assert f"Detectors run their decoder in {fast_dtype('cpu')}" in report
    assert f"own perplexity in {fast_dtype('cpu')}" in report
    copy = tmp_path / "run"
    shutil.copytree(out, copy)
    for name in ("config.json", "results.json"):  # a run made before the fields existed
        data = json.loads((copy / name).read_text())
        for field in fields:
            (data.get("config", data)).pop(field)
        (copy / name).write_text(json.dumps(data))
    assert open_eval(copy).cfg.score_dtype == "float32"  # attacks score its texts as its own scores were made
    as_made = {name: "float32" for name in fields}
    for name in fields:
        with pytest.raises(ValueError, match=re.escape(f"--set '{name}=float32'")):
            pipeline._check_config(tiny_eval(model_dir, corpus_file, methods, **{**as_made, name: "bfloat16"}), copy)
    pipeline._check_config(tiny_eval(model_dir, corpus_file, methods, **as_made), copy)


def test_a_detector_marked_strength_free_scores_alike_at_every_strength(finished_run, model_dir, corpus_file):
    out, results, methods = finished_run
    cfg = EvalConfig.from_dict(json.loads((out / "config.json").read_text()))
    model, tokenizer = load_model(cfg.model)
    windows = json.loads((out / "data" / "prompts.json").read_text())
    texts = tokenizer.batch_decode([w["human"] for w in windows] + pipeline.load_generations(out, "unwatermarked/s0"))
    marked = [name for name in methods if pipeline.REGISTRY[name].scores_ignore_strength]
    assert {"gaussmark", "kgw", "unremovable", "sir"} <= set(marked) and "kgw-llr" not in marked
    for name in marked:
        method = pipeline.keyed_method(out, name, 0, cfg, model, tokenizer, [])
        one, other = (method.with_strength(s) for s in (0.5 * method.strength_value, 2.0 * method.strength_value))
        assert one.score(model, tokenizer, texts, 4) == other.score(model, tokenizer, texts, 4), name
    for name in ("openstamp-projected", "kgw-llr"):  # detectors that read the strength: the flag would be wrong
        method = pipeline.keyed_method(out, name, 0, cfg, model, tokenizer, [])
        one, other = (method.with_strength(s) for s in (0.5 * method.strength_value, 2.0 * method.strength_value))
        assert one.score(model, tokenizer, texts, 4) != other.score(model, tokenizer, texts, 4), name


def test_a_sweep_scores_the_negatives_of_a_strength_free_detector_once(model_dir, corpus_file, tmp_path, monkeypatch):
    from openstamp.lab.methods.gaussmark import GaussMark

    scored = []
    real = GaussMark.score

    def counting(self, base, tokenizer, texts, batch_size=16):
        scored.extend(texts)
        return real(self, base, tokenizer, texts, batch_size)

    monkeypatch.setattr(GaussMark, "score", counting)
    grids = {"gaussmark": [0.25, 0.5]}
    cfg = tiny_eval(model_dir, corpus_file, ("gaussmark",), oracle="none", sweep=True, grids=grids, lengths=(16,))
    results = pipeline.run_eval(cfg, tmp_path, progress=False)
    runs = [json.loads((tmp_path / "scores" / f"gaussmark@{s:g}_s0.json").read_text()) for s in (0.25, 0.5)]
    assert runs[0]["human"] == runs[1]["human"] and runs[0]["unwatermarked"] == runs[1]["unwatermarked"]
    # full length: 2 x 8 completions and the 16 negatives once; cut to 17 ids: 2 x 8 completions and 8 human texts
    assert len(scored) == len(set(scored)) == 2 * 8 + 16 + 2 * 8 + 8
    assert [r["metrics"]["auroc"] >= 0 for r in results["runs"]] == [True, True]


def test_an_interrupted_run_resumes_without_regenerating(model_dir, corpus_file, tmp_path, monkeypatch):
    cfg = tiny_eval(model_dir, corpus_file, ("openstamp",), oracle="none")  # 2 sets x 2 batches
    real, calls = pipeline.sample_completions, []

    def counting(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3 and interrupt:
            raise KeyboardInterrupt  # killed in the second generation set
        return real(*args, **kwargs)

    monkeypatch.setattr(pipeline, "sample_completions", counting)
    interrupt = True
    with pytest.raises(KeyboardInterrupt):
        pipeline.run_eval(cfg, tmp_path, progress=False)
    assert not (tmp_path / "results.json").exists()
    assert len(list((tmp_path / "generations").rglob("b*.json"))) == 2
    interrupt, calls[:] = False, []
    resumed = pipeline.run_eval(cfg, tmp_path, progress=False)
    assert len(calls) == 2  # only the two missing batches were generated
    assert len(list((tmp_path / "generations").rglob("b*.json"))) == 4
    assert (tmp_path / "report.md").exists() and resumed["runs"][0]["metrics"]["auroc"] >= 0
    timings = resumed["timings_s"]  # the killed invocation's seconds were kept beside the resumed one's
    assert timings["invocations"] == 2 and timings["stages"]["generate"] > 0 and timings["complete"]
    assert timings["total"] == pytest.approx(sum(timings["stages"].values()), abs=0.5)
    spent = timings["methods"]["openstamp"]  # the method's runs, over both invocations
    assert spent["generate"] > 0 and spent["score"] > 0
    assert all(spent[stage] <= timings["stages"][stage] + 1e-3 for stage in spent)
    report = (tmp_path / "report.md").read_text()
    assert "Time spent per stage, summed over 2 invocation(s)" in report
    assert "No perplexity oracle (`--oracle none`)." in report
    per_run = report.split("## Per run")[1].split("## Plots")[0]
    assert per_run.count("| openstamp@") == 1  # its row, with '-' where the oracle's columns would be


def test_too_few_windows_is_a_clear_error(model_dir, corpus_file, tmp_path):
    cfg = tiny_eval(model_dir, corpus_file, ("openstamp",), n=10_000, oracle="none")
    with pytest.raises(ValueError, match=re.escape("fewer than n=10000")):
        pipeline.run_eval(cfg, tmp_path, progress=False)


def test_eval_config_file_and_cli_overrides(model_dir, corpus_file, tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text(
        f"model: {model_dir}\nmethods: [openstamp]\ncorpus: {corpus_file}\n"
        f"key_corpus: {corpus_file}\nn: 4\nprompt_tokens: 8\nnew_tokens: 20\noracle: none\n"
        "batch_size: 4\nmethod_settings: {openstamp: {profile: small, n_lists: 8, shrinkage: 0.0, centre: false}}\n"
    )
    result = runner.invoke(app, ["eval", "--config", str(path), "--n", "3", "--out", str(tmp_path / "run"), "--quiet"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "config.json").read_text())["n"] == 3
    bad = runner.invoke(app, ["eval", "--config", str(path), "--set", "nonsense=1", "--out", str(tmp_path / "x")])
    assert bad.exit_code == 2 and "nonsense" in bad.output
    # completions too short for the detector to score any: refused before any work, with what to change
    short = runner.invoke(app, ["eval", "--config", str(path), "--new-tokens", "16", "--out", str(tmp_path / "y")])
    assert short.exit_code != 0 and "raise --new-tokens to 17" in " ".join(short.output.split())
    assert not (tmp_path / "y").exists()


def test_saved_keys_carry_fingerprints_for_the_base_model(finished_run, model_dir):
    from openstamp.key import WatermarkKey
    from openstamp.model.load import load_model
    from openstamp.model.patch import check_key

    out, _, _ = finished_run
    base, _ = load_model(str(model_dir))
    key = WatermarkKey.load(out / "keys" / "openstamp-projected" / "s0" / "key")
    assert check_key(base, key) == "original"  # reloaded keys (e.g. by the attacks) still match the model


def test_each_run_records_the_digest_of_the_key_that_made_it(finished_run, tmp_path):
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    from openstamp.lab.methods.common import key_digest

    out, results, _ = finished_run
    digest = {r["method"]: r["key_sha256"] for r in results["runs"]}
    key = out / "keys" / "openstamp-projected" / "s0"
    assert digest["openstamp-projected"] == key_digest(key)
    assert digest["kgw"] == digest["kgw-llr"]  # one seed's green lists, scored two ways
    assert len(set(digest.values())) == len(digest) - 1
    copy = tmp_path / "copy"
    shutil.copytree(key, copy)
    assert key_digest(copy) == digest["openstamp-projected"]  # the tensors, not where they lie
    tensors = load_file(str(copy / "key" / "key.safetensors"))
    selector = tensors["selector"].clone()
    selector.view(-1)[0] = torch.nextafter(selector.view(-1)[0], torch.tensor(float("inf")))  # one ulp
    save_file({**tensors, "selector": selector}, str(copy / "key" / "key.safetensors"))
    assert key_digest(copy) != digest["openstamp-projected"]


def test_length_curve_ends_at_the_full_scores_and_is_reported(finished_run):
    from openstamp.lab.evaluation.lengths import lengths_path
    from openstamp.storage import read_json

    out, results, methods = finished_run
    assert (out / "length_curve.png").exists()
    report = (out / "report.md").read_text()
    assert "## Detection against length" in report and "Human text cut to each length" in report
    for run in results["runs"]:
        curve = run["length_curve"]
        assert all(0 <= row["human_over_full_threshold"] <= 1 for row in curve)
        assert [row["tokens"] for row in curve] == [16, 32], run["run"]  # 64 and 128 exceed new_tokens 32
        full, m = curve[-1], run["metrics"]
        assert full["tpr_at_1pct_fpr"] == m["tpr_at_1pct_fpr"] and full["auroc"] == pytest.approx(m["auroc"])
        assert full["flagged_at_p_0.01"] == m.get("flagged_at_p_0.01")
        assert curve[0]["scored_tokens"] < full["scored_tokens"]  # the cut texts are shorter (re-tokenised)
        assert curve[0]["auroc"] is not None  # the 16-token texts were scored, not refused as too short
        assert read_json(lengths_path(out, run["run"]))["16"]["ids"] == 17  # 16 scored tokens after the first
    assert {(r["method"], r["tokens"]) for r in results["length_curve"]} == {(m, t) for m in methods for t in (16, 32)}


def test_the_eval_scores_decide_at_its_p_level_so_openstamp_skips_its_tail_bound(tmp_path, monkeypatch):
    # the tail bound only refines p-values below the permutation test's floor (test_detect covers that the
    # decisions at the level are the same without it); here: every score the eval makes is asked for at LEVEL
    from types import SimpleNamespace

    from openstamp.lab import detector
    from openstamp.lab.evaluation import scoring
    from openstamp.lab.evaluation.lengths import LEVEL

    levels = []

    def score_dicts(method, model, tokenizer, texts, batch, memo=None):
        levels.append(detector.needed_level())
        return [{"score": 1.0, "p_value": 0.5, "n_tokens": 2, "extra": {}} for _ in texts]

    monkeypatch.setattr(scoring, "score_dicts", score_dicts)
    monkeypatch.setattr(scoring, "load_generations", lambda out, name: [[1, 2, 3]])
    tokenizer = SimpleNamespace(batch_decode=lambda ids, skip_special_tokens: ["text"] * len(ids))
    cfg = SimpleNamespace(score_batch_size=4)
    scoring.score_run(tmp_path, "openstamp@1/s0", "openstamp@1/s0", None, None, tokenizer, [{"human": [4, 5]}], 0, cfg)
    assert levels == [LEVEL] * 3  # watermarked, human, unwatermarked
    assert detector.needed_level() == 0.0  # and only there


def test_length_curve_maths():
    from openstamp.lab.evaluation.lengths import curve, run_lengths

    assert run_lengths((128, 16, 64, 32, 200), 100) == [16, 32, 64] and run_lengths((), 100) == []

    def record(score, p=None):
        return {"score": score, "p_value": p, "n_tokens": 10, "extra": {}}

    human = [record(float(x), 0.5) for x in range(100)]  # 1% FPR threshold: 98 (one score above it)
    watermarked = [record(99.5, 0.001), record(98.5, 0.001), record(50.0, 0.2), record(None, None)]
    rows = curve({"10": {"watermarked": watermarked, "human": human}})
    assert rows[0]["tpr_at_1pct_fpr"] == 0.5 and rows[0]["flagged_at_p_0.01"] == 0.5  # the refused text: not flagged
    watermarked[-1] = record(1.0, 0.001)
    rows = curve({"10": {"watermarked": watermarked, "human": human}})
    assert rows[0]["flagged_at_p_0.01"] == 0.75 and rows[0]["human_flagged_at_p_0.01"] == 0.0
    no_p = [{**r, "p_value": None} for r in watermarked + human]  # a method without p-values
    assert curve({"10": {"watermarked": no_p[:4], "human": no_p[4:]}})[0]["flagged_at_p_0.01"] is None
    assert rows[0]["human_over_full_threshold"] == 0.01  # the full length against its own threshold
    # shorter human text spreads wider: at 5 tokens, 10 of 100 pass the threshold of the 10-token texts (98)
    short = [record(float(x) + (50 if x >= 90 else 0), 0.5) for x in range(100)]
    rows = curve(
        {"10": {"watermarked": watermarked, "human": human}, "5": {"watermarked": watermarked, "human": short}}
    )
    assert [r["tokens"] for r in rows] == [5, 10] and rows[0]["human_over_full_threshold"] == 0.1


def test_a_swept_length_curve_gets_one_panel_per_method(tmp_path):
    """A sweep's length curve: a panel per method (its strengths in it), so the figure widens with the methods; a
    comparison with one strength per method: every line in one panel."""
    from matplotlib.image import imread

    from openstamp.lab.evaluation.report import _length_plot

    def rows(grid):
        return [
            {"method": m, "strength": s, "tokens": t, "tpr_at_1pct_fpr": s * t / 64, "flagged_at_p_0.01": s * t / 70}
            for m, strengths in grid.items()
            for s in strengths
            for t in (16, 32, 64)
        ]

    widths = {}
    for name, grid in {"one": {"a": [0.5], "b": [1.0]}, "swept": {m: [0.25, 0.5, 1.0] for m in "abcde"}}.items():
        _length_plot(rows(grid), tmp_path / f"{name}.png")
        widths[name] = imread(tmp_path / f"{name}.png").shape[1]
    assert widths["one"] == round(5.5 * 110)  # one panel at the default size
    assert widths["swept"] == round(4 * 3.6 * 110)  # 5 methods: 4 panels a row


def test_cut_texts_scored_from_the_full_texts_states_match_a_plain_scoring(finished_run):
    """The length stage runs after the score stage inside one cache: a cut text takes the states of its full text."""
    from openstamp.lab.evaluation.lengths import lengths_path
    from openstamp.lab.hidden import HiddenCache, autocast_decoder, reusing
    from openstamp.storage import read_json

    out, results, _ = finished_run
    cfg = EvalConfig.from_dict(json.loads((out / "config.json").read_text()))
    model, tokenizer = load_model(cfg.model)
    for name in ("openstamp-projected", "kgw-llr"):  # a Detector and a method of its own, both running the decoder
        run = next(r for r in results["runs"] if r["method"] == name)
        method = pipeline.keyed_method(out, name, 0, cfg, model, tokenizer, []).with_strength(run["strength"])
        ids = pipeline.load_generations(out, run["generations"])
        full = tokenizer.batch_decode(ids, skip_special_tokens=True)
        cut = tokenizer.batch_decode([x[:17] for x in ids], skip_special_tokens=True)
        cache = HiddenCache()
        with reusing(cache), autocast_decoder(cfg.score_dtype):  # the dtype the eval's detectors ran in
            method.score(model, tokenizer, full, cfg.score_batch_size)
            reused = [s.score for s in method.score(model, tokenizer, cut, cfg.score_batch_size)]
        assert cache.prefix_hits >= 1, name  # some batch of cut texts ran no decoder
        if (
            name == "openstamp-projected"
        ):  # its kept detector (untied model here) took cut texts' statistics from full ones
            assert method._detector(model, tokenizer, cfg.score_batch_size).memo.hits >= 1
        with autocast_decoder(cfg.score_dtype):
            plain = [s.score for s in method.score(model, tokenizer, cut, cfg.score_batch_size)]
        stored = [s["score"] for s in read_json(lengths_path(out, run["run"]))["16"]["watermarked"]]
        # the same states up to rounding in kernels of another shape: bfloat16's rounding (8 bits) is coarser
        tol = dict(rel=1e-4, abs=1e-5) if cfg.score_dtype == "float32" else dict(rel=1e-2, abs=1e-2)
        assert reused == pytest.approx(plain, **tol) and stored == pytest.approx(plain, **tol)


def test_lengths_cached_with_another_cut_are_scored_again(tmp_path):
    from openstamp.lab.evaluation.lengths import lengths_path, score_lengths
    from openstamp.lab.methods.base import MethodScore

    class Tokenizer:
        def batch_decode(self, ids, skip_special_tokens):
            return [" ".join(map(str, x)) for x in ids]

    class Method:  # scores every token but the first, as the detectors do
        def __init__(self):
            self.seen = []

        def score(self, model, tokenizer, texts, batch):
            self.seen += texts
            return [MethodScore(float(len(t.split())), None, len(t.split()) - 1) for t in texts]

    ids = [list(range(40))] * 2
    path = lengths_path(tmp_path, "m@1/s0")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"16": {"watermarked": [], "human": []}}))  # cut to 16 ids before: 15 scored
    method = Method()
    score_lengths(tmp_path, "m@1/s0", method, None, Tokenizer(), ids, ids, [16, 32], 8)
    stored = json.loads(path.read_text())
    assert {n: stored[n]["ids"] for n in stored} == {"16": 17, "32": 33}
    assert [r["n_tokens"] for r in stored["16"]["watermarked"]] == [16, 16]
    score_lengths(tmp_path, "m@1/s0", method, None, Tokenizer(), ids, ids, [16, 32], 8)
    assert len(method.seen) == 8  # the second call found every length cached: nothing scored again


def test_a_run_written_before_a_new_setting_still_resumes(tmp_path):
    cfg = EvalConfig()
    stored = json.loads(json.dumps(cfg.to_dict()))
    del stored["lengths"]  # a field added after the run was written
    (tmp_path / "config.json").write_text(json.dumps(stored))
    pipeline._check_config(cfg, tmp_path)  # accepted: the new field is at its default
    assert json.loads((tmp_path / "config.json").read_text())["lengths"] == list(cfg.lengths)
    with pytest.raises(ValueError, match="different settings"):
        pipeline._check_config(EvalConfig(lengths=(32,)), tmp_path)


def test_one_length_or_seed_given_as_a_number():
    # --set lengths=64 and --set seeds=1 reach from_dict as YAML numbers, not lists or strings
    cfg = EvalConfig.from_dict({"lengths": 64, "seeds": 1})
    assert cfg.lengths == (64,) and cfg.seeds == (1,)
    assert EvalConfig.from_dict({"lengths": "16,32"}).lengths == (16, 32)


def test_a_run_grows_by_seeds_and_methods_but_not_by_other_changes(tmp_path):
    pipeline._check_config(EvalConfig(seeds=(0,), methods=("openstamp-projected", "kgw")), tmp_path)
    grown = EvalConfig(seeds=(0, 1, 2), methods=("openstamp-projected", "kgw", "sir"))
    pipeline._check_config(grown, tmp_path)  # accepted: seed 0's openstamp and kgw are re-used
    stored = json.loads((tmp_path / "config.json").read_text())
    assert stored["seeds"] == [0, 1, 2] and stored["methods"] == ["openstamp-projected", "kgw", "sir"]
    for other in (EvalConfig(seeds=(1, 2), methods=grown.methods), EvalConfig(seeds=(0, 1, 2), methods=("kgw",))):
        with pytest.raises(ValueError, match="different settings"):  # dropping a seed or a method is a change
            pipeline._check_config(other, tmp_path)
    with pytest.raises(ValueError, match="n: 200 there, 100 now") as refused:
        pipeline._check_config(EvalConfig(seeds=(0, 1, 2, 3), methods=grown.methods, n=100), tmp_path)
    assert str(refused.value).endswith("or resume it as it was made: add --set 'n=200'")
    other = EvalConfig(seeds=grown.seeds, methods=grown.methods, corpus="news", lengths=())
    with pytest.raises(ValueError) as refused:  # as after a changed default (the generation batch's 32 -> 100)
        pipeline._check_config(other, tmp_path)
    assert "--set 'corpus=news,wikipedia' --set 'lengths=[16, 32, 64, 128]'" in str(refused.value)


def test_a_killed_sweep_resumes_where_it_stopped(model_dir, corpus_file, tmp_path):
    """SIGKILL a real `openstamp eval --sweep` process mid-run; the rerun keeps every file it finished."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg = tiny_eval(model_dir, corpus_file, ("openstamp",), oracle="none", sweep=True, lengths=(16,))
    cfg_file = tmp_path / "sweep.json"
    settings = cfg.to_dict()
    settings["grids"] = {"openstamp": [1.0, 2.0, 3.0]}
    cfg_file.write_text(json.dumps(settings))
    out = tmp_path / "run"
    command = [sys.executable, "-m", "openstamp.cli", "eval", "--config", str(cfg_file), "--out", str(out), "--quiet"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not (out / "scores" / "openstamp@1_s0.json").exists():
            assert process.poll() is None, "the sweep ended before it could be killed"
            time.sleep(0.2)
        assert (out / "scores" / "openstamp@1_s0.json").exists(), "the first strength never finished"
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
    assert not (out / "results.json").exists()
    for path in out.rglob("*.json"):  # atomic writes: nothing half-written survives the kill
        json.loads(path.read_text())
    before = {p: p.read_bytes() for p in (out / "generations").rglob("b*.json")}
    resumed = pipeline.run_eval(EvalConfig.from_file(str(cfg_file)), out, progress=False)
    assert sorted(r["strength"] for r in resumed["runs"]) == [1.0, 2.0, 3.0]
    assert all(p.read_bytes() == data for p, data in before.items())  # nothing finished was regenerated
    assert len(list((out / "generations").rglob("b*.json"))) == 4 * 2  # unwatermarked + 3 strengths, 2 batches


def test_a_run_begun_before_timings_says_its_sums_are_incomplete(tmp_path):
    (tmp_path / "generations").mkdir()
    timings = record_timings(tmp_path, "t0", {"generate": 1.0}, untimed=True)
    assert not timings["complete"] and timings["total"] == 1.0
    later = record_timings(tmp_path, "t1", {"generate": 2.0, "score": 0.5})
    here = machine()  # each invocation records its processor and thread count; the sums list each machine once
    assert later == {
        "stages": {"generate": 3.0, "score": 0.5},
        "total": 3.5,
        "methods": {},
        "invocations": 2,
        "machines": [here],
        "complete": False,
    }
    assert set(here) == {"cpu", "threads"} and here["cpu"] and here["threads"] >= 1
    spent = {"kgw": {"generate": 1.0}, "sir": {"keys": 2.0, "score": 0.25}}
    record_timings(tmp_path, "t2", {"generate": 2.0, "keys": 2.0, "score": 0.5}, by_method=spent)
    last = record_timings(tmp_path, "t3", {"generate": 1.0}, by_method={"kgw": {"generate": 0.5}})
    assert last["methods"] == {"kgw": {"generate": 1.5}, "sir": {"keys": 2.0, "score": 0.25}}
    line = timing_lines(last)[0]
    assert (
        "Per method (its keys, completions, scores and the rest of its runs): sir 2 s (keys 2, score 0); kgw 2 s"
        in line
    )
    assert "outside any method's runs (the unwatermarked sets, the original model, the oracle) 5 s." in line


def test_the_clock_keeps_a_running_stage_in_timings_json_so_a_killed_eval_loses_little(tmp_path):
    import time

    clock = StageClock(tmp_path, "t0", every=0.05)
    read = lambda: json.loads((tmp_path / "timings.json").read_text())[-1]  # noqa: E731
    with clock.stage("load"):
        pass
    assert set(read()["seconds"]) == {"load"}  # written after every stage
    with clock.run("kgw"), clock.stage("generate"):
        time.sleep(0.4)
        running = read()  # what a SIGKILL now would leave: written by the clock's thread, mid-stage
    assert running["seconds"]["generate"] >= 0.2 and running["methods"]["kgw"]["generate"] >= 0.2
    with clock.stage("oracle"):  # outside any run: no method's part
        time.sleep(0.01)
    done = clock.save()
    assert done["stages"]["generate"] >= 0.4 and done["methods"] == {"kgw": {"generate": done["stages"]["generate"]}}
    assert done["invocations"] == 1 and read()["seconds"] == done["stages"]


def test_an_openstamp_key_saved_before_shrinkage_existed_is_read_as_unshrunk(model_dir, corpus_file, tmp_path):
    """A key saved without the shrinkage field fitted S without it (added_settings): an eval asking for shrinkage
    does not take it as a shrunk one."""
    settings = {"profile": "small", "n_lists": 8, "shrinkage": 2.0}
    methods = ("openstamp",)
    cfg = tiny_eval(model_dir, corpus_file, methods, oracle="none", lengths=[], method_settings={methods[0]: settings})
    pipeline.run_eval(cfg, tmp_path, progress=False)
    recorded = tmp_path / "keys" / "openstamp" / "s0" / "settings.json"
    saved = json.loads(recorded.read_text())
    assert saved.pop("shrinkage") == 2.0
    key = json.loads((tmp_path / "keys" / "openstamp" / "s0" / "key" / "key.json").read_text())
    assert key["stats"]["selector"]["ridge_lambda"] > 1e-3  # the shrunk penalty, recorded with the key
    recorded.write_text(json.dumps(saved))  # as a key saved before the field existed
    with pytest.raises(ValueError, match="shrinkage: 0.0 there, 2.0 now"):
        pipeline.run_eval(cfg, tmp_path, progress=False)


def test_a_key_built_with_other_settings_is_refused(model_dir, corpus_file, tmp_path):
    cfg = tiny_eval(model_dir, corpus_file, ("openstamp",), oracle="none")
    pipeline.run_eval(cfg, tmp_path, progress=False)
    recorded = tmp_path / "keys" / "openstamp" / "s0" / "settings.json"
    settings = json.loads(recorded.read_text())
    assert settings["n_lists"] == cfg.method_settings["openstamp"]["n_lists"]
    recorded.write_text(json.dumps({k: v for k, v in settings.items() if k != "n_lists"}))
    pipeline.run_eval(cfg, tmp_path, progress=False)  # a field added since the key was built takes today's value
    recorded.write_text(json.dumps({**settings, "n_lists": settings["n_lists"] + 1}))  # as if a default had changed
    with pytest.raises(ValueError, match="built with other openstamp settings \\(n_lists"):
        pipeline.run_eval(cfg, tmp_path, progress=False)
