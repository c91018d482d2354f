"""Choosing delta: the smallest strength that reaches a detection target, and what it costs."""

import dataclasses

import pytest
import torch
from conftest import SMALL_EMBED, fixed_secret, make_model
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.corpus import load_documents, split_documents
from openstamp.embed.build import build_key
from openstamp.embed.tune import TuneConfig, tune_delta
from openstamp.key import WatermarkKey
from openstamp.model.load import load_model
from openstamp.model.patch import head

runner = CliRunner()
SEARCH = {"tokens": 48, "n": 16, "prompt_tokens": 8, "low": 1.0, "high": 16.0, "steps": 3, "batch_size": 8}
LISTS = 32  # the tiny model needs many lists for its p-values to flag short texts


@pytest.fixture(scope="module")
def keyed(tokenizer, corpus_file, tiny_config, tmp_path_factory):
    # the tied tiny model: on the untied one the p-values flag few texts at any delta (see the closing note)
    path = tmp_path_factory.mktemp("tune-model")
    make_model(True, len(tokenizer) + 12).save_pretrained(path)
    tokenizer.save_pretrained(path)
    model, tokenizer = load_model(str(path))
    docs = load_documents(str(corpus_file))
    cfg = tiny_config.with_overrides({"selector.n_lists": LISTS})
    key = build_key(model, tokenizer, split_documents(docs, "key"), cfg, secret=b"tune" * 8, progress=False)
    return model, tokenizer, key, split_documents(docs, "heldout")


def test_an_easier_target_gets_a_smaller_delta(keyed):
    model, tokenizer, key, heldout = keyed
    before = head(model).weight.detach().clone()
    easy_key, easy = tune_delta(model, tokenizer, key, heldout, TuneConfig(target_tpr=0.1, **SEARCH), progress=False)
    hard_key, hard = tune_delta(model, tokenizer, key, heldout, TuneConfig(target_tpr=0.6, **SEARCH), progress=False)
    assert torch.equal(head(model).weight, before)  # the original model is left as it was
    assert easy["reached"] and easy["tpr"] >= 0.1 and easy_key.delta == easy["delta"]
    assert easy["delta"] < hard["delta"]
    assert hard_key.meta["tune"]["delta"] == hard_key.delta and hard_key.delta != key.delta
    # the chosen probe reached the target; the nearest probe below it did not
    for report in (easy, hard):
        target = report["settings"]["target_tpr"]
        chosen = next(p for p in report["probes"] if p["delta"] == report["delta"])
        below = [p for p in report["probes"] if p["delta"] < report["delta"]]
        if report["reached"]:
            assert chosen["tpr"] >= target and (not below or below[-1]["tpr"] < target)
        else:  # no probe reached it: the best one is returned, flagged as not reaching the target
            assert chosen["tpr"] == max(p["tpr"] for p in report["probes"]) and chosen["tpr"] < target
    # the cost grows with the strength
    costs = [p["own_ppl_change"] for p in hard["probes"]]
    assert len(costs) >= 2 and costs[-1] > costs[0]


def test_an_unreachable_target_says_so(keyed):
    model, tokenizer, key, heldout = keyed
    cfg = TuneConfig(target_tpr=1.0, **{**SEARCH, "high": 0.3, "low": 0.1, "tokens": 8})
    tuned, report = tune_delta(model, tokenizer, key, heldout, cfg, progress=False)
    assert not report["reached"] and [p["delta"] for p in report["probes"]] == [0.1, 0.2, 0.3]
    assert tuned.delta == report["delta"] and max(p["tpr"] for p in report["probes"]) < 1.0
    with pytest.raises(ValueError, match="fewer than n"):
        tune_delta(model, tokenizer, key, heldout[:1], dataclasses.replace(cfg, n=10_000), progress=False)


def test_cli_tune_and_embed_delta_auto(tiny_model_dir, corpus_file, tmp_path, monkeypatch):
    common = ["--model", str(tiny_model_dir), "--corpus", str(corpus_file), "--quiet"]
    flags = ["--tokens", "16", "--n", "8", "--steps", "1", "--high", "6", "--profile", "small"]
    flags += ["--set", "projection.enabled=false", "--set", "selector.n_lists=8", "--set", "states.n_states=256"]
    flags += ["--set", "states.window_tokens=96", "--set", "selector.min_cluster_size=5"]
    monkeypatch.chdir(tmp_path)  # without --key, as the command: the key goes to runs/tune/key
    result = runner.invoke(app, ["tune", *common, *flags, *fixed_secret(tmp_path, 16)])
    assert result.exit_code == 0, result.output
    assert "delta search" in result.output and "key only" in result.output
    k1 = tmp_path / "runs" / "tune" / "key"
    key = WatermarkKey.load(k1)
    assert key.secret == bytes([16]) * 32  # tune takes a secret as embed does
    assert key.delta == key.meta["tune"]["delta"]
    taken = runner.invoke(app, ["tune", *common, *flags])  # that key is not replaced without --overwrite
    assert taken.exit_code != 0 and "--overwrite" in taken.output and WatermarkKey.load(k1).key_id == key.key_id
    again = ["tune", "--from-key", str(k1), "--key", str(tmp_path / "k3"), *common, *flags[:8]]
    both = runner.invoke(app, [*again, *fixed_secret(tmp_path, 17)])
    assert both.exit_code == 2 and "keeps that key's secret" in both.output
    result = runner.invoke(app, [*again, "--low", "0.5"])
    assert result.exit_code == 0, result.output
    retuned = WatermarkKey.load(tmp_path / "k3")
    assert torch.equal(retuned.selector, key.selector) and retuned.secret == key.secret  # the same S and G
    embed = [a for a in SMALL_EMBED if a != "--quiet"]
    args = ["embed", "--out", str(tmp_path / "m"), "--key", str(tmp_path / "k2"), *common, *embed]
    args += fixed_secret(tmp_path, 15)
    result = runner.invoke(app, [*args, "--delta", "auto", "--tune-tokens", "16", "--target-tpr", "0.5"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "m" / "config.json").exists() and "tune" in WatermarkKey.load(tmp_path / "k2").meta
    bad = runner.invoke(app, [*args, "--delta", "strong", "--overwrite"])
    assert bad.exit_code != 0 and "number or 'auto'" in bad.output
