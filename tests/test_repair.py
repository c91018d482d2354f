"""The backbone repair of a re-tied release: U~ stays, the layers learn the base's outputs back."""

import json

import pytest
import torch
from conftest import SMALL_EMBED, completion_auroc, fixed_secret, saved_tensors
from transformers import AutoConfig, AutoModelForCausalLM
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.corpus import load_documents, split_documents
from openstamp.detect import Detector
from openstamp.embed.repair import RepairConfig, document_windows, repair_backbone, window_kl
from openstamp.errors import InvalidKeyError, KeyMismatchError, RepairError
from openstamp.key import WatermarkKey
from openstamp.model.load import load_model
from openstamp.model.patch import head, is_tied

runner = CliRunner()
# transformers writes these itself on save and load; every other config field must be the base's
REWRITTEN = {"_name_or_path", "transformers_version", "torch_dtype", "dtype"}
# 20 steps at a rate that moves the tiny model within them (the default, 5e-5, is for real models over minutes)
FEW_STEPS = RepairConfig(minutes=5, max_steps=20, batch_size=4, seq_len=64, lr=3e-3)


@pytest.fixture(scope="module")
def repaired(retied, tied_dir, corpus_file, tmp_path_factory):
    """The re-tied release repaired for 20 steps, saved (model/), with its key recording the repair (key/)."""
    release, tok = load_model(str(retied / "model"))
    base, _ = load_model(str(tied_dir))
    docs = split_documents(load_documents(str(corpus_file)), "key")
    tied_before = release.get_input_embeddings().weight.detach().clone()
    heldout = document_windows(tok, split_documents(load_documents(str(corpus_file)), "heldout"), 64)
    kl_before = window_kl(release, base, heldout)
    report = repair_backbone(release, base, tok, docs, FEW_STEPS, progress=False)
    root = tmp_path_factory.mktemp("repaired")
    release.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    key = WatermarkKey.load(retied / "key")
    key.meta["repair"] = report
    key.save(root / "key")
    return {
        "root": root,
        "release": release,
        "base": base,
        "tokenizer": tok,
        "report": report,
        "tied_before": tied_before,
        "kl": (kl_before, window_kl(release, base, heldout)),
    }


def test_the_repair_lowers_the_unseen_kl_on_held_out_documents(repaired):
    before, after = repaired["kl"]
    assert after["unseen"] < 0.8 * before["unseen"]
    report = repaired["report"]
    assert report["steps"] == 20 and report["n_windows_heldin"] == report["n_windows_generated"] == 40
    assert report["kl_final"] < report["kl_initial"]
    assert report["heldout"]["unseen_kl_after"] < report["heldout"]["unseen_kl_before"]
    assert report["settings"]["max_steps"] == 20


def test_the_tied_unembedding_stays_bit_identical(repaired):
    release = repaired["release"]
    assert is_tied(release)
    assert torch.equal(release.get_input_embeddings().weight, repaired["tied_before"])
    assert all(p.requires_grad for p in release.parameters())  # the flags are as they were before the repair


def test_the_repaired_release_is_a_plain_checkpoint_of_the_base_shape_without_u(repaired, tied_dir):
    path = repaired["root"] / "model"
    loaded = AutoModelForCausalLM.from_pretrained(path).eval()
    base = AutoModelForCausalLM.from_pretrained(tied_dir)
    mine, theirs = loaded.config.to_dict(), AutoConfig.from_pretrained(tied_dir).to_dict()
    assert {k: v for k, v in mine.items() if k not in REWRITTEN} == {
        k: v for k, v in theirs.items() if k not in REWRITTEN
    }
    assert is_tied(loaded) and loaded.num_parameters() == base.num_parameters()
    assert torch.equal(head(loaded).weight, repaired["tied_before"])
    original = saved_tensors(tied_dir)["model.embed_tokens.weight"]
    release = saved_tensors(path)
    assert set(release) == set(saved_tensors(tied_dir))
    assert not any(t.shape == original.shape and torch.equal(t, original) for t in release.values())


def test_detection_runs_on_the_repaired_release_and_refuses_the_original(repaired, corpus_file):
    release, base, tok = repaired["release"], repaired["base"], repaired["tokenizer"]
    key = WatermarkKey.load(repaired["root"] / "key")
    assert key.meta["repair"] == repaired["report"]
    docs = load_documents(str(corpus_file))
    assert completion_auroc(release, base, tok, Detector(release, tok, key), docs) > 0.9
    with pytest.raises(KeyMismatchError, match="Detect with the released checkpoint"):
        Detector(base, tok, key)


def test_a_key_that_drops_its_repair_record_is_refused(repaired, tmp_path):
    path = tmp_path / "key"
    WatermarkKey.load(repaired["root"] / "key").save(path)
    header = json.loads((path / "key.json").read_text())
    del header["repair"]
    (path / "key.json").write_text(json.dumps(header))
    with pytest.raises(InvalidKeyError, match="edited"):
        WatermarkKey.load(path)


def test_the_repair_refuses_what_it_cannot_repair(repaired, tied_dir):
    base, tok = repaired["base"], repaired["tokenizer"]
    with pytest.raises(RepairError, match="carries no watermark"):
        repair_backbone(base, base, tok, [], FEW_STEPS, progress=False)
    untied = AutoModelForCausalLM.from_pretrained(tied_dir, tie_word_embeddings=False)
    with pytest.raises(RepairError, match="does not tie"):
        repair_backbone(untied, base, tok, [], FEW_STEPS, progress=False)
    with pytest.raises(ValueError, match="generated_fraction"):
        RepairConfig(generated_fraction=1.5)
    with pytest.raises(ValueError, match="minutes"):
        RepairConfig(minutes=0)


@pytest.mark.parametrize("tiny_model_dir", ["tied", "untied"], indirect=True)
def test_cli_embed_repairs_a_re_tied_release_and_refuses_an_untied_model(tiny_model_dir, corpus_file, tmp_path):
    args = ["embed", "--model", str(tiny_model_dir), "--corpus", str(corpus_file), *SMALL_EMBED]
    args += ["--out", str(tmp_path / "model"), "--key", str(tmp_path / "key"), "--repair-minutes", "0.03"]
    args += fixed_secret(tmp_path, 12)
    result = runner.invoke(app, args)
    if not json.loads((tiny_model_dir / "config.json").read_text())["tie_word_embeddings"]:
        assert result.exit_code == 2 and "does not tie lm_head" in " ".join(result.output.split())
        assert not (tmp_path / "model").exists() and not (tmp_path / "key").exists()
        return
    assert result.exit_code == 0, result.output
    assert "backbone repair:" in result.output
    report = WatermarkKey.load(tmp_path / "key").meta["repair"]
    assert report["steps"] >= 1 and report["settings"]["minutes"] == 0.03
    release = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    assert is_tied(release)
    assert json.loads((tmp_path / "model" / "watermark.json").read_text())["backbone_repaired"] is True
    assert "layers were trained a little after" in (tmp_path / "model" / "README.md").read_text()
    untie = runner.invoke(app, [*args, "--tied-head", "untie", "--overwrite"])
    assert untie.exit_code == 2 and "untie" in untie.output
