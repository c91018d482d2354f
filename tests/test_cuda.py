"""The paths a GPU user takes (`--device cuda`), on the tiny models. Skipped where no CUDA GPU is found: CI has none,
so these run by hand on a GPU machine (`python -m pytest tests/test_cuda.py`)."""

import dataclasses
import json

import pytest
import torch
from conftest import SMALL_EMBED, make_model
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.detect.detector import Detector
from openstamp.key.key import WatermarkKey

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

TEXTS = [
    "the river city council voted on a new plan for public parks and schools while farmers reported rain",
    "scientists measured the glacier and found it shrinking faster than expected the museum opened an exhibit",
]


def test_detection_on_cuda_scores_as_on_cpu(release):
    """The same release, key and texts give the same scores and p-values on the GPU as on the CPU."""
    on = {
        device: Detector.from_pretrained(str(release / "model"), str(release / "key"), device=device).detect(TEXTS)
        for device in ("cpu", "cuda")
    }
    for cpu, gpu in zip(on["cpu"], on["cuda"], strict=True):
        assert cpu.status == gpu.status == "ok"
        assert gpu.n_tokens == cpu.n_tokens
        assert gpu.score == pytest.approx(cpu.score, abs=1e-4)
        assert gpu.p_value == pytest.approx(cpu.p_value, rel=1e-2, abs=1e-4)


def test_embedding_on_cuda_gives_the_cpu_key(tiny_model_dir, corpus_file, tmp_path):
    """`embed --device cuda` builds the key the CPU builds from the same model, corpus, secret and seed: the same
    green lists, and a selector as close as the GPU's arithmetic allows, so its release is the CPU's to within that."""
    (tmp_path / "secret").write_text("ab" * 32)
    keys = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        args = ["embed", "--model", str(tiny_model_dir), "--corpus", str(corpus_file), "--out", str(out / "model")]
        args += ["--key", str(out / "key"), "--device", device, "--seed", "3"]
        args += ["--secret-file", str(tmp_path / "secret")]
        result = CliRunner().invoke(app, [*args, *SMALL_EMBED])
        assert result.exit_code == 0, result.output
        keys[device] = WatermarkKey.load(out / "key")
    cpu, gpu = keys["cpu"], keys["cuda"]
    assert torch.equal(gpu.green, cpu.green)
    scale = cpu.delta_w().abs().max().item()
    assert (gpu.delta_w() - cpu.delta_w()).abs().max().item() <= 1e-3 * scale


def test_eval_on_cuda_runs_every_method(tmp_path, tokenizer, corpus_file):
    """A tiny `openstamp eval --set device=cuda` of every registered method (the tiny model its own perplexity
    oracle) completes, records the device, and scores every run. OpenStamp without its projection: a GPU machine
    may lack the packaged sentence embedder."""
    from test_evaluation import METHODS, tiny_eval

    from openstamp.lab.evaluation.pipeline import run_eval

    model = tmp_path / "model"
    make_model(tied=False, vocab_size=len(tokenizer) + 12).save_pretrained(model)
    tokenizer.save_pretrained(model)
    cfg = tiny_eval(model, corpus_file, device="cuda")
    settings = {
        **cfg.method_settings,
        "openstamp-projected": {**cfg.method_settings["openstamp-projected"], "projection": False},
    }
    run_eval(dataclasses.replace(cfg, method_settings=settings), tmp_path / "eval", progress=False)
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["config"]["device"] == "cuda"
    assert sorted(r["method"] for r in results["runs"]) == sorted(METHODS)
    for run in results["runs"]:
        assert run["metrics"]["auroc"] is not None, run["run"]
