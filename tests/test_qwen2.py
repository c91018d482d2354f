"""A second architecture: a tiny Qwen2 (attention biases; tied and untied) embeds, detects and audits like the
tiny Llama, through the same commands."""

from __future__ import annotations

import pytest
import torch
from conftest import SMALL_EMBED, fixed_secret, make_corpus, make_model
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader
from sklearn.metrics import roc_auc_score
from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
from typer.testing import CliRunner

from openstamp.cli import app
from openstamp.detect import Detector
from openstamp.key import WatermarkKey
from openstamp.model.generate import sample_completions
from openstamp.model.load import load_model
from openstamp.model.patch import check_key, head, is_tied
from openstamp.release.card import read_disclosure
from openstamp.release.gguf_export import QWEN2_SPLIT, export_gguf, guess_pre

runner = CliRunner()
QWEN2_KEYS = {
    f"qwen2.{k}"
    for k in (
        "context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
        "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon",
    )
}  # fmt: skip


def gguf_contents(path) -> tuple[dict, set[str]]:
    """A GGUF file's scalar metadata (arrays left out) and its tensor names."""
    reader = GGUFReader(path)
    fields = {k: f.contents() for k, f in reader.fields.items() if not k.startswith("tokenizer.ggml.") or
              k in ("tokenizer.ggml.model", "tokenizer.ggml.pre")}  # fmt: skip
    return fields, {t.name for t in reader.tensors}


def make_qwen2(tied: bool, vocab_size: int, hidden: int = 32, seed: int = 0) -> Qwen2ForCausalLM:
    model = make_model(tied, vocab_size, hidden, seed, config_class=Qwen2Config, model_class=Qwen2ForCausalLM)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.bias"):  # Qwen2's attention biases: non-zero, so they matter
                p.normal_(0, 0.1)
    return model.eval()


@pytest.fixture(scope="module", params=["tied", "untied"])
def qwen2_release(request, tokenizer, corpus_file, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"qwen2-{request.param}")
    model = make_qwen2(request.param == "tied", vocab_size=len(tokenizer) + 12)
    assert any(n.endswith("q_proj.bias") for n, _ in model.named_parameters())
    model.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    args = ["embed", "--model", str(root / "base"), "--corpus", str(corpus_file), "--out", str(root / "model")]
    args += [*fixed_secret(root, 5), "--seed", "0"]  # a random key's 24-text AUC now and then fell under the bar
    result = runner.invoke(app, [*args, "--key", str(root / "key"), "--delta", "2.0", *SMALL_EMBED])
    assert result.exit_code == 0, result.output
    return root, request.param


def test_a_qwen2_release_is_plain_and_keeps_its_tying(qwen2_release):
    root, mode = qwen2_release
    release = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(root / "base", dtype=torch.float32)
    key = WatermarkKey.load(root / "key")
    assert release.config.model_type == "qwen2" and is_tied(release) == (mode == "tied")
    assert check_key(release, key) == "watermarked" and check_key(base, key) == "original"
    assert not torch.equal(head(release).weight, head(base).weight)
    # the attention biases are the base's: only the unembedding (and, re-tied, the shared embedding) moved
    for (name, a), (_, b) in zip(release.named_parameters(), base.named_parameters(), strict=True):
        if name.endswith("bias"):
            assert torch.equal(a, b), name


def test_a_qwen2_release_is_detected(qwen2_release, corpus_file):
    root, _ = qwen2_release
    base, tok = load_model(str(root / "base"))
    release, _ = load_model(str(root / "model"))
    key = WatermarkKey.load(root / "key")
    prompts = [ids[:8] for ids in tok(make_corpus(24, 40, seed=7), add_special_tokens=False).input_ids]
    wm = sample_completions(release, tok, prompts, 48, seed=0, progress=False)
    plain = sample_completions(base, tok, prompts, 48, seed=0, progress=False)
    scores = [r.score for r in Detector(base, tok, key).detect(wm + plain)]
    assert roc_auc_score([1] * len(wm) + [0] * len(plain), scores) > 0.9


def test_detect_and_audit_commands_run_on_a_qwen2_release(qwen2_release):
    root, _ = qwen2_release
    text = " ".join(make_corpus(1, 40, seed=3))
    args = ["detect", "--model", str(root / "model"), "--key", str(root / "key"), "--min-tokens", "4", "--quiet"]
    result = runner.invoke(app, [*args, "--text", text])
    assert result.exit_code == 0, result.output
    assert '"status": "ok"' in result.stdout
    audit = runner.invoke(app, ["audit", str(root / "model"), "--key", str(root / "key")])
    assert audit.exit_code == 0, audit.output


def test_f32_gguf_export_of_a_qwen2_release_reloads_to_the_same_model(qwen2_release, tmp_path):
    root, mode = qwen2_release
    record = export_gguf(root / "model", tmp_path / "f32.gguf", "f32")
    assert record["architecture"] == "qwen2" and record["pre"] == "qwen2" and set(record["tensor_types"]) == {"F32"}
    fields, names = gguf_contents(tmp_path / "f32.gguf")
    assert fields["general.architecture"] == "qwen2" and fields["tokenizer.ggml.model"] == "gpt2"
    assert fields["tokenizer.ggml.pre"] == "qwen2"
    assert QWEN2_KEYS <= set(fields) and "qwen2.rope.dimension_count" not in fields  # as convert_hf_to_gguf writes
    assert {"blk.1.attn_q.bias", "blk.1.attn_k.bias", "blk.1.attn_v.bias"} <= names
    assert ("output.weight" in names) == (mode == "untied") == (not record["tied"])
    disclosure = read_disclosure(root / "model")
    got = {k: v for k, v in fields.items() if k.startswith("openstamp.")}
    assert disclosure is not None and got == pytest.approx(disclosure.gguf_metadata())

    # the file alone (no config.json next to it) gives back the release: biases, tying and logits
    release = AutoModelForCausalLM.from_pretrained(root / "model", dtype=torch.float32).eval()
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="f32.gguf", dtype=torch.float32).eval()
    assert reloaded.config.model_type == "qwen2" and is_tied(reloaded) == (mode == "tied")
    theirs = dict(reloaded.named_parameters())
    for name, param in release.named_parameters():
        if name.endswith("bias"):
            assert torch.equal(theirs[name], param), name
    ids = torch.tensor([[1, 5, 9, 30, 200, 17, 250]])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, release(ids).logits, rtol=0, atol=1e-5)
    text = "the river city council voted 12345 to 678 on a new plan"  # Qwen2 splits digits one by one
    ours = AutoTokenizer.from_pretrained(root / "model")
    gguf_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file="f32.gguf")
    assert gguf_tok(text, add_special_tokens=False).input_ids == ours(text, add_special_tokens=False).input_ids


def test_quantized_qwen2_export_still_detects(qwen2_release, tmp_path):
    root, _ = qwen2_release
    path = tmp_path / "q8_0.gguf"
    result = runner.invoke(
        app, ["export", "gguf", "--model", str(root / "model"), "--out", str(path), "--quant", "q8_0"]
    )
    assert result.exit_code == 0, result.output
    types = {t.name: t.tensor_type for t in GGUFReader(path).tensors}
    assert types["blk.0.attn_q.bias"] == T.F32 and types["blk.0.attn_q.weight"] == T.Q8_0  # biases stay F32
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    base, tok = load_model(str(root / "base"))
    key = WatermarkKey.load(root / "key")
    prompts = [ids[:8] for ids in tok(make_corpus(24, 40, seed=7), add_special_tokens=False).input_ids]
    wm = sample_completions(reloaded, tok, prompts, 48, seed=0, progress=False)
    plain = sample_completions(base, tok, prompts, 48, seed=0, progress=False)
    scores = [r.score for r in Detector(base, tok, key).detect(wm + plain)]
    assert roc_auc_score([1] * len(wm) + [0] * len(plain), scores) > 0.9


def test_the_pre_tokenizer_name_follows_the_split_regex(tokenizer):
    """Qwen2's regex splits digits one by one; GGUF's ``tokenizer.ggml.pre`` must say so, or llama.cpp
    tokenizes numbers like GPT-2. (transformers gives a qwen2 checkpoint's tokenizer Qwen2's regex.)"""
    qwen = Tokenizer(models.BPE(unk_token="<unk>"))
    qwen.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    assert guess_pre(PreTrainedTokenizerFast(tokenizer_object=qwen)) == "qwen2"
    assert guess_pre(tokenizer) == "default"  # GPT-2's byte-level split


def test_an_untied_model_whose_embeddings_are_its_head_quantized_twice_is_found(tokenizer):
    """The packaged Qwen2.5-Coder-0.5B GGUF stores U twice (output.weight in Q8_0, token_embd in Q5_0) although
    upstream ties them; converted untied, a release would leave a near copy of U beside U~. The conversion ties
    such twins."""
    from openstamp.model.load import embedding_name, quantized_twins

    twin = make_qwen2(False, vocab_size=len(tokenizer) + 12)
    with torch.no_grad():
        head_w = twin.lm_head.weight
        twin.get_input_embeddings().weight.copy_(head_w + 0.01 * torch.randn_like(head_w))  # a coarser copy
    assert quantized_twins(twin)
    assert embedding_name(twin) == "model.embed_tokens.weight"
    assert not quantized_twins(make_qwen2(False, vocab_size=len(tokenizer) + 12))  # independent matrices
    assert not quantized_twins(make_qwen2(True, vocab_size=len(tokenizer) + 12))  # already one tensor
