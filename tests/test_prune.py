"""Pruning: the masks reach the requested sparsity, Wanda uses the input norms, and the attack runs."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import make_model
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.lab.attacks.prune import (
    PruneConfig,
    input_norms,
    magnitude_mask,
    prunable,
    prune_model,
    run_prune,
    wanda_mask,
)
from openstamp.model.patch import head, is_tied

runner = CliRunner()


def test_wanda_prunes_by_weight_times_input_norm_per_row():
    weight = torch.tensor([[1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0]])
    norms = torch.tensor([10.0, 1.0, 1.0, 0.1])  # scores row 0: 10 2 3 0.4; row 1: 40 3 2 0.1
    keep = wanda_mask(weight, norms, 0.5)
    assert keep.tolist() == [[True, False, True, False], [True, True, False, False]]
    assert magnitude_mask(weight, 0.5).sum() == 4 and not magnitude_mask(weight, 0.5)[:, 0].all()


def test_input_norms_match_the_activations(tokenizer):
    model = make_model(False, len(tokenizer))
    layers = prunable(model, include_head=True)
    ids = torch.randint(3, len(tokenizer), (2, 12))
    norms = input_norms(model, layers, ids)
    hidden = model.get_decoder()(input_ids=ids).last_hidden_state.detach()  # lm_head's input
    assert torch.allclose(norms["lm_head"], hidden.reshape(-1, hidden.shape[-1]).norm(dim=0), rtol=1e-4)


@pytest.mark.parametrize("pruner", ["magnitude", "wanda"])
@pytest.mark.parametrize("include_head", [False, True])
def test_every_layer_reaches_the_requested_sparsity(pruner, include_head, tokenizer):
    model = make_model(True, len(tokenizer))
    embeddings = model.get_input_embeddings().weight.detach().clone()
    cfg = PruneConfig(pruner=pruner, include_head=include_head)
    norms = input_norms(model, prunable(model, include_head), torch.randint(3, len(tokenizer), (2, 16)))
    for sparsity in (0.1, 0.3, 0.5):
        reached = prune_model(model, sparsity, cfg, norms)
        assert len(reached) == 2 * 7 + include_head  # q k v o gate up down per block (+ lm_head)
        for name, value in reached.items():
            width = prunable(model, include_head)[name].weight.shape[1]
            assert sparsity - 1.0 / width <= value <= sparsity + 1e-9, (name, value)
    assert is_tied(model) != include_head
    assert torch.equal(model.get_input_embeddings().weight, embeddings)
    assert include_head == bool((head(model).weight == 0).any())


def test_bad_sparsities_are_refused():
    for bad in ((0.0,), (1.0,), (0.2, 1.5)):
        with pytest.raises(ValueError, match=r"\(0, 1\)"):
            PruneConfig(sparsities=bad)


def test_prune_attack_end_to_end_and_cli(eval_dir, corpus_file, tmp_path):
    out = tmp_path / "prune"
    cfg = PruneConfig(
        sparsities=(0.3,), calibration=str(corpus_file), calibration_windows=2, seq_len=32, n=4, ppl_windows=2
    )
    results = run_prune(eval_dir, out, cfg, progress=False)
    assert {(r["method"], r["sparsity"]) for r in results["runs"]} == {
        (m, s) for m in ("openstamp", "unremovable") for s in (0.0, 0.3)
    }
    assert 0.25 < results["sparsity_reached"]["wanda/s0.3"]["min"] <= 0.3
    assert all(r["ppl"] > 1 for r in results["runs"])
    assert "30%" in (eval_dir / "attacks" / "prune.md").read_text()
    args = ["attack", "prune", "--eval", str(eval_dir), "--out", str(tmp_path / "p"), "--method", "magnitude"]
    small = ["--n", "2", "--ppl-windows", "1", "--seq-len", "32", "--calibration", str(corpus_file)]
    result = runner.invoke(app, [*args, "--sparsity", "0.5", *small])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "p" / "settings.json").read_text())["sparsities"] == [0.5]
    bad = runner.invoke(app, [*args, "--sparsity", "1.0", *small])
    assert bad.exit_code == 2 and "(0, 1)" in bad.output
