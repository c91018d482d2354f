"""GGUF: llama.cpp's codecs decode what our encoders write, and an exported release still detects."""

import hashlib

import numpy as np
import pytest
import torch
from conftest import completion_auroc
from gguf import GGML_QUANT_SIZES, GGUFReader, quants
from gguf import GGMLQuantizationType as T
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    LlamaConfig,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.corpus import load_documents
from openstamp.detect import Detector
from openstamp.embed.pipeline import embed
from openstamp.key import WatermarkKey
from openstamp.model.load import load_model
from openstamp.model.patch import is_tied
from openstamp.release import gguf_export
from openstamp.release.gguf_export import export_gguf, tensor_type
from openstamp.release.gguf_quants import encode, roundtrip

runner = CliRunner()
CODECS = (T.Q8_0, T.Q6_K, T.Q5_0, T.Q4_K, T.Q4_0, T.Q3_K, T.Q2_K)  # finest to coarsest, as llama.cpp ranks them


def weights(rows=48, cols=512, seed=0) -> np.ndarray:
    """Gaussian rows at scales over four decades, plus an all-zero row and a constant row."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32) * np.logspace(-3, 1, rows, dtype=np.float32)[:, None]
    w[0], w[1] = 0.0, 0.25
    return w


def relative_error(qtype: T, w: np.ndarray) -> float:
    return float(np.linalg.norm(roundtrip(w, qtype) - w) / np.linalg.norm(w))


@pytest.mark.parametrize("qtype", CODECS)
def test_encoders_write_blocks_that_llama_cpp_decodes(qtype):
    w = weights()
    block, size = GGML_QUANT_SIZES[qtype]
    data = encode(w, qtype)
    assert data.dtype == np.uint8 and data.shape == (w.shape[0], w.shape[1] // block * size)
    back = quants.dequantize(data, qtype)
    assert back.shape == w.shape and np.all(np.isfinite(back))
    assert np.all(back[0] == 0)  # zeros stay zeros
    # per block, the error is at most one quantization step of that block's range
    blocks, got = w[2:].reshape(-1, block), back[2:].reshape(-1, block)
    spread = blocks.max(axis=1) - np.minimum(blocks.min(axis=1), 0)
    # Q2_K's fit minimises the absolute error, so it may clip a block's extremes by more than half a step
    levels = {T.Q8_0: 127, T.Q6_K: 31, T.Q5_0: 15, T.Q4_K: 15, T.Q4_0: 7, T.Q3_K: 4, T.Q2_K: 2.5}[qtype]
    assert np.all(np.abs(got - blocks).max(axis=1) <= 1.05 * np.abs(blocks).max(axis=1) / levels + 1e-3 * spread)


def test_error_ranks_like_llama_cpps_types():
    w = weights(64, 1024, seed=1)[2:]
    errors = [relative_error(q, w) for q in CODECS]
    assert errors == sorted(errors), dict(zip([q.name for q in CODECS], errors, strict=True))
    assert errors[0] < 0.01 and errors[CODECS.index(T.Q4_0)] < 0.12  # 8-bit well under 1%, 4-bit 5-10% on Gaussians
    assert errors[-1] < 0.35  # 2-bit (Q2_K): around 30%


# sha256 of the bytes llama.cpp writes for golden_input(): ggml-quants.c (quantize_q4_K, quantize_q6_K, ...,
# no importance matrix) as vendored in llama-cpp-python 0.3.36, built with gcc -O2 on x86-64. Q2_K and Q3_K: a
# harness linking that ggml-quants.c (gcc 12 -O2 -ffp-contract=off -DNDEBUG, x86-64) called
# quantize_q2_K / quantize_q3_K(golden_input(), dst, 24, 512, NULL) (= quantize_row_q2_K_ref / _q3_K_ref); the
# same harness reproduced the Q4_K and Q6_K hashes below
LLAMA_CPP_SHA256 = {
    T.Q2_K: "6ccc94b4b699127cdc7549f7ff1820211e79889a148a72891ad5ae95b6b14473",
    T.Q3_K: "48dec3d5d9b647d111741ee84974c860bd8af20a0390264a419ca9a3260f49c0",
    T.Q4_K: "e7280ece203f175424f03a81beb2ffd2d8980c41c2d2ff46709198608ed1104e",
    T.Q6_K: "966a9030718db78b2d42ddadbcfdd0f70a1ba0265dce3f7ded4f995415faba62",
    T.Q8_0: "788cd4e33f8aaf1f810765abea815c07b1fc49da2fec1d8d8cc5005116b6321d",
    T.Q4_0: "39c382ea2e48701e77e98975c3301d4dfc9e40accc243997b53e7e77df8a9676",
    T.Q5_0: "1b981bf6410a04cad6fcffb4c11f335b04dc7d1757a91409a8385f120d435e54",
}


def golden_input() -> np.ndarray:
    """Exactly representable, platform-independent float32 rows over 15 octaves, with zero and constant rows."""
    rng = np.random.default_rng(1234)
    x = rng.integers(-1000, 1001, size=(24, 512)).astype(np.float32) / np.float32(997)
    x *= np.float32(2.0) ** rng.integers(-12, 4, size=(24, 1)).astype(np.float32)
    x[0], x[1], x[2, :256] = 0, 0.5, 0
    x[3] = np.where(np.arange(512) % 7 == 0, x[3], 0)
    return x


@pytest.mark.parametrize("qtype", CODECS)
def test_encoders_match_llama_cpp_byte_for_byte(qtype, monkeypatch):
    monkeypatch.setattr("openstamp.release.gguf_quants.CHUNK_WEIGHTS", 3 * 512)  # chunking must not change the bytes
    assert hashlib.sha256(encode(golden_input(), qtype).tobytes()).hexdigest() == LLAMA_CPP_SHA256[qtype]


def test_k_quant_rows_must_fill_superblocks():
    for qtype in (T.Q4_K, T.Q2_K):
        with pytest.raises(ValueError, match="multiple of 256"):
            encode(np.ones((2, 96), np.float32), qtype)


def test_q2_k_block_layout():
    """84 bytes per 256 weights: 16 scale bytes (scale in the low nibble, min in the high), 64 bytes of 2-bit
    codes (byte l of each 32 holds weights l, l + 32, l + 64, l + 96 of its half), fp16 d, fp16 dmin."""
    w = weights(8, 768, seed=2)
    data = encode(w, T.Q2_K)
    assert GGML_QUANT_SIZES[T.Q2_K] == (256, 84) and data.shape == (8, 3 * 84)
    blocks = data.reshape(-1, 84)
    scales, qs = blocks[:, :16], blocks[:, 16:80]
    d, dmin = blocks[:, 80:84].copy().view(np.float16).astype(np.float32).T[:, :, None, None]
    codes = (qs.reshape(-1, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8)[:, None]) & 3  # (block, half, shift, l)
    codes = codes.reshape(-1, 16, 16).astype(np.float32)  # (block, sub-block, weight)
    sc, m = (scales & 0xF).astype(np.float32), (scales >> 4).astype(np.float32)
    ours = d * sc[:, :, None] * codes - dmin * m[:, :, None]
    np.testing.assert_allclose(ours.reshape(w.shape), quants.dequantize(data, T.Q2_K), rtol=0, atol=1e-6)
    live = np.abs(w.reshape(-1, 256)).max(axis=1) > 0
    assert np.all(sc.max(axis=1)[live] == 15)  # the largest sub-block scale sets d = max / 15
    assert np.all(blocks[~live] == 0)  # an all-zero block is all zero bytes


def test_types_follow_llama_quantize():
    def kind(name, shape, file_type="q4_k_m", has_output=True):
        return tensor_type(name, shape, file_type, 32, has_output)

    assert kind("blk.5.attn_q.weight", (1024, 1024)) == T.Q4_K
    assert kind("blk.0.attn_v.weight", (256, 1024)) == T.Q6_K  # use_more_bits: first eighth of the layers
    assert kind("blk.5.attn_v.weight", (256, 1024)) == T.Q4_K
    assert kind("blk.31.ffn_down.weight", (1024, 2816)) == T.Q6_K  # and the last eighth
    assert kind("blk.31.ffn_down.weight", (1024, 2880)) == T.Q8_0  # Q6_K wanted, 2880 % 256 != 0
    assert kind("blk.5.attn_q.weight", (576, 576)) == T.Q5_0  # Q4_K wanted, 576 % 256 != 0
    assert kind("output.weight", (5000, 1024)) == T.Q6_K and kind("token_embd.weight", (5000, 1024)) == T.Q4_K
    assert kind("token_embd.weight", (5000, 1024), has_output=False) == T.Q6_K  # tied: the embedding is the head
    assert kind("token_embd.weight", (5000, 576), has_output=False) == T.Q8_0  # SmolLM2-135M's width
    assert kind("blk.1.attn_norm.weight", (1024,)) == T.F32
    assert kind("output.weight", (5000, 1024), "q8_0") == T.Q8_0
    assert kind("output.weight", (5000, 1024), "q4_0") == T.Q6_K
    assert kind("blk.3.ffn_up.weight", (2816, 1024), "f16") == T.F16
    # q2_k: llama.cpp keeps attn_v (Q4_K with n_gqa >= 4, else Q3_K), ffn_down and attn_output at more bits
    assert kind("blk.5.attn_q.weight", (1024, 1024), "q2_k") == T.Q2_K
    assert kind("blk.5.ffn_up.weight", (2816, 1024), "q2_k") == T.Q2_K
    assert kind("token_embd.weight", (5000, 1024), "q2_k") == T.Q2_K
    assert kind("blk.5.attn_v.weight", (256, 1024), "q2_k") == T.Q3_K
    assert tensor_type("blk.5.attn_v.weight", (256, 1024), "q2_k", 32, True, n_gqa=4) == T.Q4_K
    assert kind("blk.5.ffn_down.weight", (1024, 2816), "q2_k") == T.Q3_K
    assert kind("blk.5.attn_output.weight", (1024, 1024), "q2_k") == T.Q3_K
    assert kind("output.weight", (5000, 1024), "q2_k") == T.Q6_K
    assert kind("token_embd.weight", (5000, 1024), "q2_k", has_output=False) == T.Q6_K
    assert kind("blk.5.attn_q.weight", (576, 576), "q2_k") == T.Q4_0  # Q2_K and Q3_K fall back to Q4_0
    assert kind("blk.5.attn_output.weight", (576, 576), "q2_k") == T.Q4_0
    assert kind("output.weight", (5000, 576), "q2_k") == T.Q8_0
    with pytest.raises(ValueError, match="unknown GGUF type"):
        kind("output.weight", (8, 256), "q3_k")


@pytest.fixture(scope="module")
def stamped(tiny_model_dir, corpus_file, tiny_config, tmp_path_factory):
    """A watermarked tiny release (tied: re-tied) and its key."""
    root = tmp_path_factory.mktemp("gguf-release")
    cfg = tiny_config.with_overrides({"green.delta": 2.0})
    embed(str(tiny_model_dir), str(corpus_file), root / "model", root / "key", cfg, progress=False)
    return root


def test_f32_export_reloads_to_the_same_model_and_tokenizer(stamped):
    path = stamped / "model" / "f32.gguf"
    record = export_gguf(stamped / "model", path, "f32")
    release = AutoModelForCausalLM.from_pretrained(stamped / "model", dtype=torch.float32).eval()
    reloaded = AutoModelForCausalLM.from_pretrained(stamped / "model", gguf_file=path.name, dtype=torch.float32)
    assert record["tied"] == is_tied(release) == reloaded.config.tie_word_embeddings
    assert set(record["tensor_types"]) == {"F32"}
    ids = torch.tensor([[1, 5, 9, 30, 200, 17]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded.eval()(ids).logits, release(ids).logits, rtol=0, atol=1e-5)
    text = "the river city council voted on a new plan"
    theirs = AutoTokenizer.from_pretrained(stamped / "model", gguf_file=path.name)
    ours = AutoTokenizer.from_pretrained(stamped / "model")
    assert theirs(text, add_special_tokens=False).input_ids == ours(text, add_special_tokens=False).input_ids


@pytest.mark.parametrize("quant", ["q8_0", "q4_k_m"])
def test_quantized_export_still_detects(stamped, tiny_model_dir, corpus_file, quant):
    path = stamped / "model" / f"{quant}.gguf"
    result = runner.invoke(
        app, ["export", "gguf", "--model", str(stamped / "model"), "--out", str(path), "--quant", quant]
    )
    assert result.exit_code == 0, result.output
    reloaded = AutoModelForCausalLM.from_pretrained(stamped / "model", gguf_file=path.name, dtype=torch.float32).eval()
    base, tok = load_model(str(tiny_model_dir))
    key = WatermarkKey.load(stamped / "key")
    docs = load_documents(str(corpus_file))
    assert completion_auroc(reloaded, base, tok, Detector(base, tok, key), docs) > 0.9


def test_export_errors(stamped, tokenizer, tmp_path, monkeypatch):
    model = stamped / "model"
    out = tmp_path / "m.gguf"
    cases = [
        (["--model", str(tmp_path / "missing"), "--out", str(out)], "does not exist"),
        (["--model", str(model), "--out", str(out), "--quant", "q3_k"], "unknown GGUF type"),
    ]
    shape = dict(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                 num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    MistralForCausalLM(MistralConfig(**shape)).save_pretrained(tmp_path / "mistral")
    cases.append((["--model", str(tmp_path / "mistral"), "--out", str(out)], "llama and qwen2 architectures only"))
    Qwen2ForCausalLM(Qwen2Config(**shape, use_sliding_window=True, sliding_window=16)).save_pretrained(tmp_path / "swa")
    cases.append((["--model", str(tmp_path / "swa"), "--out", str(out)], "sliding-window"))
    for args, message in cases:
        result = runner.invoke(app, ["export", "gguf", *args])
        assert result.exit_code == 2 and message in result.output, result.output
    out.write_bytes(b"keep me")
    result = runner.invoke(app, ["export", "gguf", "--model", str(model), "--out", str(out), "--quant", "q8_0"])
    assert result.exit_code == 2 and "--overwrite" in result.output and out.read_bytes() == b"keep me"

    def broken(data, qtype):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(gguf_export, "encode", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        export_gguf(model, out, "q8_0", overwrite=True)
    assert out.read_bytes() == b"keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf", "mistral", "swa"]


@pytest.mark.parametrize("quant", ["q8_0", "q4_0", "q4_k_m"])
def test_the_attack_path_gives_the_weights_of_an_exported_file(tiny_model_dir, tmp_path, quant):
    from openstamp.lab.attacks.quantizers import quantize_model

    path = tmp_path / "m.gguf"
    export_gguf(tiny_model_dir, path, quant)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    quantize_model(model, f"gguf-{quant}", quantize_head=True)
    theirs = dict(reloaded.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(theirs[name], param, rtol=0, atol=1e-7, msg=name)
        assert param.dim() == 1 or not torch.equal(param, original[name])  # every matrix went through a codec


@pytest.mark.parametrize(("quant", "bound"), [("f16", 1e-3), ("bf16", 1e-2), ("q6_k", 0.05)])
def test_other_file_types_load_back(tiny_model_dir, tmp_path, quant, bound):
    path = tmp_path / "m.gguf"
    record = export_gguf(tiny_model_dir, path, quant)
    assert record["tensor_types"]["F32"] == 5  # the norms
    reloaded = dict(AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name).named_parameters())
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    for name, param in model.named_parameters():
        error = float((reloaded[name] - param).detach().norm() / param.detach().norm())
        assert error < bound, (name, error)


@pytest.mark.parametrize(("tied", "kv_heads", "attn_v"), [(True, 2, "Q3_K"), (False, 1, "Q4_K")])
def test_q2_k_export_reads_back(tokenizer, tmp_path, tied, kv_heads, attn_v):
    """A 256-wide model (the tiny ones fall back to Q4_0): llama.cpp's Q2_K mix, readable by gguf and
    transformers, and the weights the lab's gguf-q2_k attack gives."""
    from openstamp.lab.attacks.quantizers import quantize_model

    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, tie_word_embeddings=tied)  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0, 0.15)
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    path = tmp_path / "m.gguf"
    result = runner.invoke(app, ["export", "gguf", "--model", str(tmp_path), "--out", str(path), "--quant", "Q2_K"])
    assert result.exit_code == 0, result.output
    types = {t.name: t.tensor_type.name for t in GGUFReader(path).tensors}
    layer = {"attn_q": "Q2_K", "attn_k": "Q2_K", "attn_v": attn_v, "attn_output": "Q3_K", "ffn_gate": "Q2_K",
             "ffn_up": "Q2_K", "ffn_down": "Q3_K", "attn_norm": "F32", "ffn_norm": "F32"}  # fmt: skip
    expected = {f"blk.{i}.{part}.weight": kind for i in range(2) for part, kind in layer.items()}
    expected |= {"output_norm.weight": "F32", "token_embd.weight": "Q6_K" if tied else "Q2_K"}
    expected |= {} if tied else {"output.weight": "Q6_K"}
    assert types == expected
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    reloaded = dict(reloaded.named_parameters())
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    info = quantize_model(model, "gguf-q2_k", quantize_head=True)
    assert info["tensor_types"]["Q2_K"] == 8 + (not tied) and info["tensor_types"]["Q3_K"] == 6 - 2 * (kv_heads == 1)
    for name, param in model.named_parameters():
        torch.testing.assert_close(reloaded[name], param, rtol=0, atol=1e-7, msg=name)
        error = float((param.detach() - original[name]).norm() / original[name].norm())
        assert param.dim() == 1 or 0 < error < 0.4, (name, error)  # Q2_K around 30%, Q3_K 15%, Q6_K 2%


def test_the_gguf_metadata_discloses_the_watermark(stamped, tmp_path):
    from gguf import GGUFReader

    from openstamp.release.card import Disclosure, read_disclosure

    disclosure = read_disclosure(stamped / "model")
    assert disclosure is not None and disclosure.key_id == WatermarkKey.load(stamped / "key").key_id
    export_gguf(stamped / "model", tmp_path / "on.gguf", "f32")
    fields = GGUFReader(tmp_path / "on.gguf").fields
    got = {k: fields[k].contents() for k in fields if k.startswith("openstamp.")}
    assert got == pytest.approx(disclosure.gguf_metadata())
    assert {"openstamp.method", "openstamp.key_id", "openstamp.gamma", "openstamp.n_lists"} <= set(got)
    assert Disclosure.from_gguf_metadata({**got, "general.name": "x"}) == disclosure  # the reader's inverse
    result = runner.invoke(app, ["export", "gguf", "--model", str(stamped / "model"), "--out",
                                 str(tmp_path / "off.gguf"), "--quant", "f32", "--no-disclose"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert not [k for k in GGUFReader(tmp_path / "off.gguf").fields if k.startswith("openstamp.")]


def test_the_audit_reads_a_gguf_file(stamped, tiny_model_dir, tmp_path):
    from openstamp.release.audit import audit

    path = tmp_path / "release.gguf"
    export_gguf(stamped / "model", path, "f32")
    findings = audit(path, stamped / "key")
    assert not [f for f in findings if f.severity == "high"], findings
    by = {f.check: f for f in findings}
    assert by["disclosure"].message.startswith("openstamp.* metadata disclose the watermark")
    assert "carries the watermark" in by["fingerprint"].message  # F32 keeps the head bit for bit
    with_base = audit(path, stamped / "key", str(tiny_model_dir))
    assert any(f.check == "base" and "differs from the public base" in f.message for f in with_base)
    assert not any(f.check == "base" and "tensors beyond lm_head" in f.message for f in with_base)
    (tmp_path / "broken.gguf").write_bytes(b"GGUF not really")
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        audit(tmp_path / "broken.gguf")


def test_the_audit_flags_a_gguf_of_an_untied_export_of_a_tied_model(tiny_model_dir, corpus_file, tiny_config, tmp_path):
    if not is_tied(AutoModelForCausalLM.from_pretrained(tiny_model_dir)):
        pytest.skip("an untied base has no tied head to export untied")
    from openstamp.release.audit import audit

    cfg = tiny_config.with_overrides({"green.delta": 2.0})
    embed(str(tiny_model_dir), str(corpus_file), tmp_path / "model", tmp_path / "key", cfg, progress=False,
          tied_head="untie")  # fmt: skip
    export_gguf(tmp_path / "model", tmp_path / "untied.gguf", "q8_0")
    high = {f.check: f.message for f in audit(tmp_path / "untied.gguf", tmp_path / "key") if f.severity == "high"}
    assert set(high) == {"tied head", "near copy"} and "not removal-resistant" in high["tied head"]
    assert high["near copy"].startswith("token_embd.weight is a near copy of the original unembedding U")


def test_the_audit_rounds_the_base_as_a_quantized_file_stores_its_head(stamped, tiny_model_dir, tmp_path):
    from openstamp.release.audit import audit

    export_gguf(tiny_model_dir, tmp_path / "base.gguf", "q8_0")
    export_gguf(stamped / "model", tmp_path / "release.gguf", "q8_0")
    plain = [f.message for f in audit(tmp_path / "base.gguf", base=str(tiny_model_dir)) if f.check == "base"]
    assert any("identical to the base" in m and "as this file rounds it (Q8_0)" in m for m in plain), plain
    marked = [f.message for f in audit(tmp_path / "release.gguf", base=str(tiny_model_dir)) if f.check == "base"]
    assert any("differs from the public base" in m for m in marked), marked
