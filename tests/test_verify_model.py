"""verify-model: the weights test finds the release's offset (share, p-value), its null holds, vocabularies align."""

from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import torch
from conftest import make_model, saved_tensors
from safetensors.torch import save_file
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.key.key import WatermarkKey
from openstamp.key.prf import new_secret, permutations
from openstamp.provenance import verify_model
from openstamp.provenance.readers import read_weights
from openstamp.provenance.weights import weights_test

K = 199


def floor(key: WatermarkKey) -> float:
    """The smallest permutation p-value: the tiny keys have 6 or 8 lists, so a few of the K keyed permutations
    are the identity, which always reaches T."""
    identity = (permutations(key.secret, key.n_lists, K) == torch.arange(key.n_lists)).all(-1).sum()
    return (1 + int(identity)) / (K + 1)


def merged_dir(release, base, out, t: float):
    """A linear merge t * release + (1 - t) * base of every tensor, saved with the base's config and tokenizer."""
    rel, org = saved_tensors(release), saved_tensors(base)
    shutil.copytree(base, out, ignore=shutil.ignore_patterns("*.safetensors"))
    save_file({n: (t * rel[n] + (1 - t) * org[n]).contiguous() for n in org}, str(out / "model.safetensors"))
    return out


def test_release_base_and_merge(release, tiny_model_dir, tmp_path, tokenizer):
    key = WatermarkKey.load(release / "key")
    marked = verify_model(release / "model", key, tiny_model_dir, n_permutations=K)
    assert marked.share == pytest.approx(1.0, abs=0.01)
    assert marked.p_permutation == floor(key)
    assert marked.p_tail < 1e-6  # the tail bound goes below the permutation floor
    assert marked.rows_aligned == len(tokenizer)  # the padding rows beyond the tokenizer are left out
    plain = verify_model(tiny_model_dir, key, tiny_model_dir, n_permutations=K)
    assert plain.share == 0.0 and plain.p_value == 1.0
    merged = merged_dir(release / "model", tiny_model_dir, tmp_path / "m", 0.3)
    merge = verify_model(merged, key, tiny_model_dir, n_permutations=K)
    assert merge.share == pytest.approx(0.3, abs=0.01)
    assert merge.p_permutation == floor(key) and merge.p_tail < 1e-3


def test_reordered_and_extended_vocabulary(release, tiny_model_dir):
    key = WatermarkKey.load(release / "key")
    suspect = read_weights(release / "model")
    plain = verify_model(suspect, key, tiny_model_dir, n_permutations=K)
    n = len(suspect.tokens)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    extra = torch.randn(5, suspect.hidden_size)  # five new tokens appended, padding rows dropped
    shuffled = dataclasses.replace(
        suspect,
        head=torch.cat([suspect.head[:n][order], extra]),
        embed=torch.cat([suspect.embed[:n][order], extra]),
        tokens=[suspect.tokens[i] for i in order.tolist()] + [f"<new{i}>" for i in range(5)],
    )
    moved = verify_model(shuffled, key, tiny_model_dir, n_permutations=K)
    assert moved.alignment == "by-string" and plain.alignment == "identical"
    assert moved.rows_aligned == plain.rows_aligned == n
    assert moved.share == pytest.approx(plain.share, abs=1e-5)
    assert moved.statistic == pytest.approx(plain.statistic, rel=1e-5)


def test_retied_release_counts_the_input_embeddings(retied, tied_dir):
    result = verify_model(retied / "model", retied / "key", tied_dir, n_permutations=K)
    assert result.matrices == ["lm_head", "input_embeddings"]
    assert result.share == pytest.approx(1.0, abs=0.01)
    assert result.p_permutation == floor(WatermarkKey.load(retied / "key"))


@pytest.mark.parametrize("quant", ["q8_0", "q2_k"])  # q2_k: at this width its matrices fall back to Q4_0 and Q8_0
def test_gguf_export_is_found(release, tmp_path, tokenizer, quant):
    from openstamp.release.gguf_export import export_gguf

    key = WatermarkKey.load(release / "key")
    export_gguf(release / "model", tmp_path / "m.gguf", quant)
    result = verify_model(tmp_path / "m.gguf", key, key.meta["model"]["source"], n_permutations=K)
    assert result.rows_aligned == len(tokenizer)  # GGUF names the padding rows ([PAD300], ...): they align by string
    assert result.share == pytest.approx(1.0, abs=0.05)
    assert result.p_permutation == floor(key)


def test_p_value_is_uniform_over_random_secrets(retied):
    """An unrelated change (noise plus a shift along the selector) against 300 random secrets: P(p <= 0.1) ~ 0.1."""
    key = WatermarkKey.load(retied / "key")
    g = torch.Generator().manual_seed(1)
    rows = torch.arange(key.vocab_size)
    drift = torch.randn(key.vocab_size, key.hidden_size, generator=g) * 0.05
    drift += torch.randn(key.vocab_size, 1, generator=g) * key.selector_weights[0]
    p_perm, p_tail = [], []
    for _ in range(300):
        stat = weights_test([drift], rows, dataclasses.replace(key, secret=new_secret()), n_permutations=99)
        p_perm.append(stat.p_permutation)
        p_tail.append(stat.p_tail)
    below = sum(p <= 0.1 for p in p_perm) / len(p_perm)
    assert abs(below - 0.1) < 0.06  # 3.5 standard errors at n = 300
    assert sum(p <= 0.1 for p in p_tail) / len(p_tail) < 0.16  # the bound is valid (conservative)


def test_cli_prints_one_json_object(release, tiny_model_dir):
    args = ["verify-model", str(release / "model"), "--key", str(release / "key"), "--base", str(tiny_model_dir)]
    result = CliRunner().invoke(app, [*args, "--permutations", "99"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert {"p_value", "statistic", "share", "rows_aligned", "warnings", "test", "null"} <= set(data)
    assert data["share"] == pytest.approx(1.0, abs=0.01)


def bad_suspects(tmp_path, tokenizer):
    wide = tmp_path / "wide"
    make_model(False, vocab_size=len(tokenizer) + 12, hidden=64).save_pretrained(wide)
    from transformers import Qwen2Config, Qwen2ForCausalLM

    other = tmp_path / "qwen"
    make_model(False, len(tokenizer) + 12, config_class=Qwen2Config, model_class=Qwen2ForCausalLM).save_pretrained(
        other
    )
    (tmp_path / "notes.txt").write_text("not a model")
    (tmp_path / "fake.gguf").write_bytes(b"not a gguf file")
    (tmp_path / "empty").mkdir()
    return {
        "wide": (wide, "hidden size is 64"),
        "qwen": (other, "another architecture"),
        "missing": (tmp_path / "nowhere", "does not exist"),
        "text": (tmp_path / "notes.txt", "is not a model"),
        "fake": (tmp_path / "fake.gguf", "not a readable GGUF"),
        "empty": (tmp_path / "empty", "no safetensors weights"),
    }


def test_bad_suspects_exit_2_with_a_clear_message(release, tiny_model_dir, tmp_path, tokenizer):
    for name, (path, message) in bad_suspects(tmp_path / "bad", tokenizer).items():
        args = ["verify-model", str(path), "--key", str(release / "key"), "--base", str(tiny_model_dir)]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, (name, result.output)
        assert message in " ".join(result.stderr.split()), (name, result.stderr)


def test_service_route(retied, tied_dir, tmp_path):
    from fastapi.testclient import TestClient

    from openstamp.config import DetectConfig
    from openstamp.detect.detector import Detector
    from openstamp.service import ApiKeys, ServiceConfig, create_app

    detector = Detector.from_pretrained(str(retied / "model"), str(retied / "key"), DetectConfig(min_tokens=4))
    auth = {"Authorization": "Bearer test-token-0123456789abcdef"}
    keys = ApiKeys.from_lines(["test-token-0123456789abcdef"], "test")
    config = ServiceConfig(verify_roots=(str(retied),), verify_base=str(tied_dir))
    with TestClient(create_app(detector, config, keys)) as client:
        ok = client.post("/v1/verify-model", json={"path": "model", "permutations": 99}, headers=auth)
        assert ok.status_code == 200, ok.text
        assert ok.json()["share"] == pytest.approx(1.0, abs=0.01)
        assert client.post("/v1/verify-model", json={"path": "model"}).status_code == 401
        outside = client.post("/v1/verify-model", json={"path": str(tied_dir)}, headers=auth)
        assert outside.status_code == 403
        escape = client.post("/v1/verify-model", json={"path": "../"}, headers=auth)
        assert escape.status_code == 403
        assert client.post("/v1/verify-model", json={"path": "nowhere"}, headers=auth).status_code == 404
        not_model = client.post("/v1/verify-model", json={"path": "key"}, headers=auth)
        assert not_model.status_code == 400 and "not a causal LM" in not_model.json()["detail"]
    with TestClient(create_app(detector, ServiceConfig(), keys)) as client:
        assert client.post("/v1/verify-model", json={"path": "model"}, headers=auth).status_code == 403


def test_lora_adapter_is_merged_onto_its_base(release, tiny_model_dir, tmp_path):
    """A LoRA adapter directory is read as its base with the adapter merged: on the release it keeps the whole
    offset (the head is not among its targets), on the original (``adapter_base``) it carries none."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    key = WatermarkKey.load(release / "key")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(release / "model")
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)  # a non-zero update
    adapter = get_peft_model(model, lora)
    adapter.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    marked = verify_model(tmp_path / "adapter", key, tiny_model_dir, n_permutations=K)
    assert marked.share == pytest.approx(1.0, abs=0.01)
    assert marked.p_permutation == floor(key)
    assert any(f.name == "adapter_model.safetensors" for f in read_weights(tmp_path / "adapter").files)
    plain = verify_model(tmp_path / "adapter", key, tiny_model_dir, n_permutations=K, adapter_base=str(tiny_model_dir))
    assert plain.share == pytest.approx(0.0, abs=1e-6) and plain.p_value > 0.05
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": None}))
    args = ["verify-model", str(tmp_path / "adapter"), "--key", str(release / "key"), "--base", str(tiny_model_dir)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "names no base model" in " ".join(result.stderr.split()), result.output
