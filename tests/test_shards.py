"""Evaluations run as shards (each its own seeds) merge into what one folder holding every seed reports."""

import json
import shutil

import pytest
from test_evaluation import tiny_eval
from typer.testing import CliRunner

import openstamp.lab.evaluation.pipeline as pipeline
from openstamp.cli import app
from openstamp.lab.evaluation.shards import load_shard, merge_into, merge_shards


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tokenizer, corpus_file):
    """Seed 0 and seed 1 each in its own folder, and one folder grown from seed 0 to seeds 0 and 1."""
    from conftest import make_model

    root = tmp_path_factory.mktemp("shards")
    model_dir = root / "model"
    make_model(tied=False, vocab_size=len(tokenizer) + 12).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    config = lambda seeds: tiny_eval(model_dir, corpus_file, ("openstamp",), oracle="none", seeds=seeds)  # noqa: E731
    pipeline.run_eval(config((0,)), root / "s0", progress=False)
    pipeline.run_eval(config((1,)), root / "s1", progress=False)
    shutil.copytree(root / "s0", root / "both")
    both = pipeline.run_eval(config((0, 1)), root / "both", progress=False)  # seed 0 re-used, seed 1 run again
    return root, both


def test_merged_shards_report_what_one_folder_with_every_seed_reports(runs):
    root, both = runs
    merged = merge_into(root / "merged", [root / "s0", root / "s1"])
    assert merged["config"] == both["config"]
    merged, both = json.loads(json.dumps(merged)), json.loads(json.dumps(both))  # as results.json holds them
    for field in ("runs", "summary", "length_curve", "references", "downstream_original"):
        assert merged[field] == both[field], field
    point = merged["summary"][0]
    assert point["seeds"] == 2 and point["tpr_at_1pct_fpr"]["ci"][0] <= point["tpr_at_1pct_fpr"]["mean"]
    assert [s["seeds"] for s in merged["shards"]] == [[0], [1]]
    stages = {k for s in merged["shards"] for k in s["timings_s"]["stages"]}
    assert merged["timings_s"]["stages"].keys() == stages and merged["timings_s"]["shards"] == 2


def test_merge_runs_command_writes_results_report_and_plots(runs):
    root, _ = runs
    out = root / "merged-cli"
    result = CliRunner().invoke(
        app, ["merge-runs", str(root / "s0"), str(root / "s1" / "results.json"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "seeds 0, 1" in result.output.replace("\n", " ")
    for name in ("results.json", "report.md", "roc.png", "scores_hist.png"):
        assert (out / name).exists(), name
    report = (out / "report.md").read_text()
    assert "seeds 0, 1" in report and "of 2 shards (machine time, not wall-clock)" in report
    again = CliRunner().invoke(app, ["eval", "--out", str(out), "--quiet"])  # a merged folder is not a run to resume
    assert again.exit_code == 2 and "holds results but no run" in again.output.replace("\n", " ")
    assert not (out / "config.json").exists()


def _edited(root, name, edit):
    """A copy of shard ``name``'s results, changed by ``edit``."""
    path, results = load_shard(root / name)
    edit(results)
    return f"{path} (edited)", results


def test_shards_that_do_not_belong_together_are_refused(runs):
    root, _ = runs
    s0 = load_shard(root / "s0")
    with pytest.raises(ValueError, match="at least two"):
        merge_shards([s0])
    with pytest.raises(ValueError, match="seed 0 is in both"):
        merge_shards([s0, load_shard(root / "both")])
    with pytest.raises(
        ValueError, match="not shards of one comparison: they ran other settings \\(n: 8 there, 9 now\\)"
    ):
        merge_shards([_edited(root, "s1", lambda r: r["config"].update(n=9)), s0])
    with pytest.raises(ValueError, match="differ in the human reference, so they did not score the same text"):
        merge_shards([s0, _edited(root, "s1", lambda r: r["references"]["human"].update(own_ppl_original=1.0))])
    with pytest.raises(ValueError, match="before results kept each run's scores"):
        merge_shards([s0, _edited(root, "s1", lambda r: [run.pop("scores") for run in r["runs"]])])
    with pytest.raises(ValueError, match="is an `openstamp eval` run folder"):
        merge_into(root / "s0", [root / "s0", root / "s1"])
    with pytest.raises(ValueError, match="holds no results.json"):
        load_shard(root / "model")
    assert json.loads((root / "s0" / "results.json").read_text())["config"]["seeds"] == [0]  # nothing was touched


def test_shards_run_in_other_dtypes_merge_only_when_told(runs):
    root, _ = runs
    s0 = load_shard(root / "s0")
    ours = s0[1]["config"].get("sample_dtype", "float32")

    def other_machine(scale: float, field: str = "own_ppl_original"):
        """Seed 1 as sampled in float16, its human reference's ``field`` scaled (seq_rep_3: moved by scale - 1)."""

        def edit(results):
            results["config"]["sample_dtype"] = "float16"
            human = results["references"]["human"]
            human[field] = human[field] + scale - 1 if field == "seq_rep_3" else human[field] * scale

        return _edited(root, "s1", edit)

    with pytest.raises(ValueError, match="sample_dtype: .* \\(merge with --mixed-dtypes\\)"):
        merge_shards([s0, other_machine(1.005)])
    merged = merge_shards([s0, other_machine(1.005)], mixed_dtypes=True)  # perplexities agree to 1%
    assert merged["config"]["sample_dtype"] == f"{ours} (seed 0), float16 (seed 1)"
    assert merged["dtypes"] == {"sample_dtype": {"0": ours, "1": "float16"}}
    assert merged["config"]["score_dtype"] == s0[1]["config"]["score_dtype"]  # the same everywhere: kept as it was
    with pytest.raises(ValueError, match="did not score the same text"):
        merge_shards([s0, other_machine(1.05)], mixed_dtypes=True)  # 5%: other text, not another dtype
    with pytest.raises(ValueError, match="did not score the same text"):
        merge_shards([s0, other_machine(1.005, "seq_rep_3")], mixed_dtypes=True)  # no dtype moves a text's repeats
    with pytest.raises(ValueError, match="did not score the same text"):
        merge_shards([s0, _edited(root, "s1", lambda r: r["references"]["human"].update(own_ppl_original=1.0))])

    out = root / "merged-dtypes"
    shard = out.parent / "s1-float16.json"
    shard.write_text(json.dumps(other_machine(1.005)[1]))
    result = CliRunner().invoke(app, ["merge-runs", str(root / "s0"), str(shard), "--out", str(out), "--mixed-dtypes"])
    assert result.exit_code == 0, result.output
    assert f"sampled in {ours} (seed 0), float16 (seed 1)" in (out / "report.md").read_text()
