"""The quantization attack's backends: each real quantizer where installed, and the head recipes."""

import pytest
import torch
from conftest import make_model

from openstamp.errors import MissingExtraError
from openstamp.lab.attacks import quantizers
from openstamp.lab.attacks.quantizers import quantize_model, quantize_nf4
from openstamp.model.patch import head, is_tied


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.norm())


def snapshot(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_bitsandbytes_nf4_matches_the_simulated_codebook(tokenizer):
    pytest.importorskip("bitsandbytes")
    w = torch.randn(48, 256) * 0.1
    torch.testing.assert_close(quantizers.bitsandbytes_roundtrip(w, "nf4", 64), quantize_nf4(w, 64), rtol=0, atol=1e-6)
    model = make_model(False, len(tokenizer))
    info = quantize_model(model, "int8", False, backend="bitsandbytes")
    assert info["backend"] == "bitsandbytes" and info["why_simulated"] is None
    assert all(len(torch.unique(row)) <= 255 for row in model.model.layers[0].mlp.up_proj.weight)


@pytest.mark.parametrize(
    ("scheme", "module", "levels", "group"),
    [
        ("hqq-4bit", "hqq", 16, 64),
        ("quanto-int8", "optimum.quanto", 255, None),
        ("quanto-int4", "optimum.quanto", 16, 32),
    ],
)
def test_real_quantizers_keep_few_levels_and_lm_head(scheme, module, levels, group, tokenizer):
    pytest.importorskip(module)
    model = make_model(True, len(tokenizer))
    before = snapshot(model)
    info = quantize_model(model, scheme, quantize_head=False)
    assert info["backend"] == scheme.split("-")[0] and info["why_simulated"] is None and info["head_as_recipe"]
    assert is_tied(model) and torch.equal(head(model).weight, before["model.embed_tokens.weight"])
    weight = model.model.layers[1].self_attn.q_proj.weight
    original = before["model.layers.1.self_attn.q_proj.weight"]
    pieces = weight.reshape(-1, group) if group else weight
    assert all(len(torch.unique(p)) <= levels for p in pieces)
    assert 0 < relative(weight, original) < (0.02 if levels > 16 else 0.2)


@pytest.mark.parametrize("tied", [True, False])
def test_gguf_recipe_quantizes_the_head_and_the_embeddings(tied, tokenizer):
    model = make_model(tied, len(tokenizer))
    before = snapshot(model)
    info = quantize_model(model, "gguf-q4_k_m", quantize_head=True)
    assert (
        info["backend"] == "gguf" and info["head_as_recipe"] and sum(info["tensor_types"].values()) == info["matrices"]
    )
    assert is_tied(model) == tied  # the shared matrix is quantized once, as llama.cpp's output tensor
    assert not torch.equal(model.get_input_embeddings().weight, before["model.embed_tokens.weight"])
    assert not torch.equal(head(model).weight, before["model.embed_tokens.weight" if tied else "lm_head.weight"])

    model = make_model(tied, len(tokenizer))
    info = quantize_model(model, "gguf-q4_k_m", quantize_head=False)
    assert not info["head_as_recipe"]
    assert torch.equal(head(model).weight, before["model.embed_tokens.weight" if tied else "lm_head.weight"])
    assert not torch.equal(model.model.layers[0].mlp.down_proj.weight, before["model.layers.0.mlp.down_proj.weight"])


def test_gguf_q2_k_keeps_llama_cpps_higher_types(tokenizer):
    model = make_model(False, len(tokenizer), hidden=256)  # 256 wide: the K-quants' rows fill their blocks
    before = snapshot(model)
    info = quantize_model(model, "gguf-q2_k", quantize_head=True)
    # per layer q, k, gate, up at Q2_K; v (2 query heads per key/value head), o, down at Q3_K; embeddings Q2_K
    assert info["tensor_types"] == {"Q2_K": 9, "Q3_K": 6, "Q6_K": 1} and quantizers.BITS["gguf-q2_k"] == 2
    name = "model.layers.0.mlp.up_proj.weight"
    assert 0.2 < relative(model.model.layers[0].mlp.up_proj.weight, before[name]) < 0.4  # 2 bits: about 30%


def test_a_missing_backend_names_the_extra(tokenizer, monkeypatch):
    monkeypatch.setattr(quantizers, "_find", lambda module: False)
    with pytest.raises(MissingExtraError, match=r"openstamp\[attacks\]"):
        quantize_model(make_model(False, len(tokenizer)), "hqq-4bit", quantize_head=False)
    with pytest.raises(ValueError, match="unknown scheme"):
        quantize_model(make_model(False, len(tokenizer)), "int3", quantize_head=False)


def test_the_attack_help_names_every_scheme():
    import inspect

    from openstamp.lab.cli.attack import quantize

    listed = inspect.signature(quantize).parameters["scheme"].default.help
    assert [s for s in quantizers.SCHEMES if s not in listed] == []
