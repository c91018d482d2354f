import json

import pytest
import torch
from conftest import fixed_secret
from transformers import AutoModelForCausalLM
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.corpus import CorpusError, load_documents, split_documents
from openstamp.embed.build import build_key
from openstamp.embed.pipeline import embed
from openstamp.key import WatermarkKey
from openstamp.model.load import ModelNotFoundError, load_model
from openstamp.model.patch import check_key

runner = CliRunner()


def test_build_key_on_a_tiny_model(tiny_model_dir, corpus_file, tiny_config, tokenizer):
    model, tok = load_model(str(tiny_model_dir))
    docs = load_documents(str(corpus_file))
    key = build_key(model, tok, docs, tiny_config, progress=False)
    assert key.selector.shape[1] == model.config.hidden_size and 2 <= key.n_lists <= 8
    assert key.projection is None
    stats = key.meta["stats"]
    assert stats["selector"]["effective_strength"] > 0
    assert set(stats["timings_s"]) == {"hidden_states", "selector", "green_lists"}
    padding_rows = range(len(tokenizer), key.vocab_size)
    assert set(padding_rows) <= set(key.never_green)


def test_embed_writes_a_plain_checkpoint_and_a_matching_key(tiny_model_dir, corpus_file, tiny_config, tmp_path):
    result = embed(
        str(tiny_model_dir),
        str(corpus_file),
        tmp_path / "model",
        tmp_path / "key",
        tiny_config,
        progress=False,
    )
    released = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    key = WatermarkKey.load(tmp_path / "key")
    assert check_key(released, key) == "watermarked"
    used = {d["sha256"] for d in key.meta["corpus"]["documents"]}
    held = {d.sha256 for d in split_documents(load_documents(str(corpus_file)), "heldout")}
    assert used and used.isdisjoint(held)
    assert key.meta["model"]["tied"] == result.key.meta["model"]["tied"]
    assert key.meta["versions"]["torch"] == torch.__version__


def test_embed_with_a_trained_projection(tiny_model_dir, corpus_file, tiny_config, tmp_path):
    cfg = tiny_config.with_overrides(
        {
            "projection.enabled": True,
            "projection.n_states": 256,
            "projection.epochs": 2,
            "projection.batch_size": 64,
        }
    )
    model, tok = load_model(str(tiny_model_dir))
    key = build_key(model, tok, load_documents(str(corpus_file)), cfg, progress=False)
    d = model.config.hidden_size
    assert key.projection.shape == (d, d)
    assert not torch.equal(key.projection, torch.eye(d))
    assert "heldout_corr" in key.meta["stats"]["projection"]


def test_bad_inputs_fail_early_with_clear_errors(tiny_model_dir, corpus_file, tiny_config, tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        embed(str(tiny_model_dir), str(tmp_path / "nope.txt"), tmp_path / "m", tmp_path / "k", tiny_config)
    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(CorpusError, match="no documents"):
        embed(str(tiny_model_dir), str(tmp_path / "empty.txt"), tmp_path / "m", tmp_path / "k", tiny_config)
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        embed("no-such-alias", str(corpus_file), tmp_path / "m", tmp_path / "k", tiny_config)
    (tmp_path / "file").write_text("x")
    with pytest.raises(PermissionError):
        embed(str(tiny_model_dir), str(corpus_file), tmp_path / "file" / "m", tmp_path / "k", tiny_config)
    assert not (tmp_path / "m").exists() and not (tmp_path / "k").exists()


def test_cli_embed_and_its_errors(tiny_model_dir, corpus_file, tmp_path):
    args = [
        "embed",
        "--model",
        str(tiny_model_dir),
        "--corpus",
        str(corpus_file),
        "--out",
        str(tmp_path / "m"),
        "--key",
        str(tmp_path / "k"),
        "--profile",
        "small",
        "--no-projection",
        "--lists",
        "6",
        "--set",
        "states.n_states=256",
        "--set",
        "states.window_tokens=96",
        "--set",
        "selector.min_cluster_size=5",
        "--delta",
        "2.0",
        "--quiet",
        *fixed_secret(tmp_path, 18),
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    header = json.loads((tmp_path / "k" / "key.json").read_text())
    assert header["delta"] == 2.0 and header["n_lists"] <= 6 and not header["projection"]
    assert header["config"]["profile"] == "small"  # a key records the profile its settings started from
    again = runner.invoke(app, args)
    assert again.exit_code == 2 and "already exists" in again.output
    bad = runner.invoke(app, ["embed", "--model", "nope", "--out", str(tmp_path / "x"), "--key", str(tmp_path / "y")])
    assert bad.exit_code == 2 and "unknown model" in bad.output


def test_cli_uses_a_given_secret(tiny_model_dir, corpus_file, tmp_path):
    secret = tmp_path / "secret.hex"
    secret.write_text("ab" * 32)
    args = [
        "embed",
        "--model",
        str(tiny_model_dir),
        "--corpus",
        str(corpus_file),
        "--profile",
        "small",
        "--no-projection",
        "--lists",
        "4",
        "--set",
        "states.n_states=128",
        "--set",
        "states.window_tokens=96",
        "--set",
        "selector.min_cluster_size=5",
        "--secret-file",
        str(secret),
        "--quiet",
    ]
    assert runner.invoke(app, [*args, "--out", str(tmp_path / "m1"), "--key", str(tmp_path / "k1")]).exit_code == 0
    assert (tmp_path / "k1" / "secret").read_bytes() == bytes([0xAB]) * 32
    secret.write_text("abcd")
    bad = runner.invoke(app, [*args, "--out", str(tmp_path / "m2"), "--key", str(tmp_path / "k2")])
    assert bad.exit_code == 2 and "at least 16" in bad.output
