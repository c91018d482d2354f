"""Write a (watermarked) Llama- or Qwen2-architecture Hugging Face checkpoint as a GGUF file.

Tensor names and metadata follow llama.cpp's ``convert_hf_to_gguf.py``: ``LlamaModel`` permutes
the Q/K rows (rotary halves interleaved) and writes ``llama.vocab_size``, the rope dimension and
the key/value lengths; ``Qwen2Model`` writes the Q/K rows as they are, adds the attention biases
(``blk.N.attn_{q,k,v}.bias``) and leaves those three keys to llama.cpp's defaults. The per-tensor
types follow ``llama_tensor_get_type`` of ``llama-quantize`` (no importance matrix), the same for
both architectures, so a ``q4_k_m`` file holds the codes llama.cpp itself would write:

* 1-D tensors (norms, biases) stay F32; every other weight gets the file type's base type (Q4_K
  for ``q4_k_m``).
* ``output.weight`` gets Q6_K in every quantized type except Q8_0 (``q8_0`` keeps Q8_0). A tied
  model has no ``output.weight``: the one shared matrix ``token_embd.weight`` (= ``U~``) is then
  the output tensor, so it gets the output's type. This is what llama.cpp does for tied models,
  and what ``retie`` releases need: the file holds ``U~`` once and no copy of ``U``.
* ``q4_k_m`` also gives Q6_K to ``attn_v`` and ``ffn_down`` of layers where
  ``use_more_bits(i, n) = i < n/8 or i >= 7n/8 or (i - n/8) % 3 == 2``.
* ``q2_k`` keeps ``attn_v`` at Q4_K when at least 4 query heads share a key/value head
  (``n_gqa >= 4``), else at Q3_K, and ``ffn_down`` and ``attn_output`` at Q3_K.
* A row length that the type's block size does not divide falls back as llama.cpp does:
  Q2_K, Q3_K -> Q4_0, Q4_K -> Q5_0, Q6_K -> Q8_0, anything else -> F16 (SmolLM2-135M's 576 is
  not a multiple of 256).

llama-quantize picks the ``use_more_bits`` layers of ``attn_v`` by counting tensors in file order;
this writer stores layers in order, so the count is the layer index.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGML_QUANT_VERSION, GGUFWriter, LlamaFileType, SpecialVocab, TokenType
from gguf import GGMLQuantizationType as T
from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX as QWEN2_SPLIT

from openstamp.model.patch import is_tied
from openstamp.release.card import Disclosure, read_disclosure
from openstamp.release.gguf_quants import encode
from openstamp.storage import check_can_write

log = logging.getLogger(__name__)

# file type -> (base tensor type, general.file_type)
FILE_TYPES = {
    "f32": (T.F32, LlamaFileType.ALL_F32),
    "f16": (T.F16, LlamaFileType.MOSTLY_F16),
    "bf16": (T.BF16, LlamaFileType.MOSTLY_BF16),
    "q8_0": (T.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "q6_k": (T.Q6_K, LlamaFileType.MOSTLY_Q6_K),
    "q4_0": (T.Q4_0, LlamaFileType.MOSTLY_Q4_0),
    "q4_k_m": (T.Q4_K, LlamaFileType.MOSTLY_Q4_K_M),
    "q2_k": (T.Q2_K, LlamaFileType.MOSTLY_Q2_K),
}
FLOAT_FILE_TYPES = ("f32", "f16", "bf16")
FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q6_K: T.Q8_0}
HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_PARTS = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
LAYER_NAME = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")
BIASED_PARTS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")  # Qwen2's attention biases
ARCHITECTURES = ("llama", "qwen2")
# the split regex of a tokenizer -> its tokenizer.ggml.pre (llama.cpp's name for that pre-tokenizer)
KNOWN_PRE = {QWEN2_SPLIT: "qwen2"}


def gguf_name(hf_name: str) -> str:
    """``model.layers.3.self_attn.q_proj.weight`` -> ``blk.3.attn_q.weight`` (llama.cpp's names)."""
    if hf_name in HF_TO_GGUF:
        return HF_TO_GGUF[hf_name]
    match = LAYER_NAME.fullmatch(hf_name)
    if match is None or match.group(2) not in LAYER_PARTS:
        raise ValueError(f"no GGUF name for tensor {hf_name} (only plain Llama and Qwen2 checkpoints are supported)")
    if match.group(3) == "bias" and match.group(2) not in BIASED_PARTS:
        raise ValueError(f"no GGUF name for tensor {hf_name} (only the q, k and v projections may have biases)")
    return f"blk.{match.group(1)}.{LAYER_PARTS[match.group(2)]}.{match.group(3)}"


def _use_more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def tensor_type(
    name: str, shape: tuple[int, ...], file_type: str, n_layers: int, has_output: bool, n_gqa: int = 1
) -> T:
    """The GGUF type llama.cpp gives tensor ``name`` (GGUF name, HF shape (out, in)) in ``file_type``.

    ``n_gqa`` is query heads per key/value head (llama.cpp's ``n_gqa()``); only ``q2_k`` reads it.
    Left out of llama.cpp's rules: those for Falcon, for 8-expert models, and the 70B one that
    raises a Q3_K or Q4_K ``attn_v`` to Q5_K (llama.cpp's ``LLM_TYPE_70B``, the 80-layer Llama).
    """
    if file_type not in FILE_TYPES:
        raise ValueError(f"unknown GGUF type {file_type!r}; choose one of {', '.join(FILE_TYPES)}")
    base = FILE_TYPES[file_type][0]
    if len(shape) < 2:
        return T.F32
    if file_type in FLOAT_FILE_TYPES:
        return base
    row = shape[-1]
    kind = base
    if name == "output.weight" or (not has_output and name == "token_embd.weight"):
        if row % GGML_QUANT_SIZES[base][0]:
            kind = T.Q8_0
        elif base != T.Q8_0:
            kind = T.Q6_K
    elif file_type == "q4_k_m" and (".attn_v." in name or ".ffn_down." in name):
        if _use_more_bits(int(name.split(".")[1]), n_layers):
            kind = T.Q6_K
    elif file_type == "q2_k" and ".attn_v." in name:
        kind = T.Q4_K if n_gqa >= 4 else T.Q3_K
    elif file_type == "q2_k" and (".ffn_down." in name or ".attn_output." in name):
        kind = T.Q3_K
    if row % GGML_QUANT_SIZES[kind][0]:
        kind = FALLBACK.get(kind, T.F16)
        if row % GGML_QUANT_SIZES[kind][0]:
            kind = T.F16
    return kind


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf's Q/K row order (rotary halves interleaved); transformers' loader undoes it."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_supported(config) -> None:
    """Raise ValueError unless ``config`` is a plain Llama or Qwen2 that this exporter writes correctly."""
    if config.model_type not in ARCHITECTURES:
        raise ValueError(f"GGUF export supports the llama and qwen2 architectures only, not {config.model_type!r}")
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"GGUF export does not support rope scaling {rope.get('rope_type')!r}")
    if config.model_type == "llama":
        if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
            raise ValueError("GGUF export does not support Llama checkpoints with biases")
        return
    if getattr(config, "use_sliding_window", False):
        raise ValueError("GGUF export does not support Qwen2 checkpoints with sliding-window attention")
    head_dim = getattr(config, "head_dim", None)
    if head_dim is not None and head_dim != config.hidden_size // config.num_attention_heads:
        raise ValueError(f"GGUF export does not support a Qwen2 head_dim ({head_dim}) other than hidden/heads")


def guess_pre(tokenizer) -> str:
    """``tokenizer.ggml.pre`` for a byte-level BPE tokenizer: ``qwen2`` when it splits text with
    Qwen2's regex, else ``default`` (llama.cpp's generic GPT-2 split)."""
    pre = json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer") or {}
    for part in pre.get("pretokenizers", [pre]):
        regex = (part.get("pattern") or {}).get("Regex") if part.get("type") == "Split" else None
        if regex in KNOWN_PRE:
            return KNOWN_PRE[regex]
    return "default"


def _vocab(writer: GGUFWriter, model_dir: Path, tokenizer, n_vocab: int, pre: str) -> None:
    """Byte-level BPE vocabulary as convert_hf_to_gguf's ``get_vocab_base`` writes it (model ``gpt2``)."""
    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    if spec["model"]["type"] != "BPE" or "ByteLevel" not in json.dumps(spec.get("decoder")):
        raise ValueError("GGUF export supports byte-level BPE tokenizers (GPT-2 style) only")
    by_id = {i: t for t, i in tokenizer.get_vocab().items()}
    added = tokenizer.added_tokens_decoder
    tokens, types = [], []
    for i in range(n_vocab):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            types.append(TokenType.CONTROL if added[i].special else TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    SpecialVocab(model_dir, load_merges=True, n_vocab=n_vocab).add_to_gguf(writer, quiet=True)
    if tokenizer.bos_token_id is not None:  # newer gguf-py reads this from the post-processor; ask the tokenizer
        writer.add_add_bos_token(tokenizer("a").input_ids[:1] == [tokenizer.bos_token_id])


def _metadata(writer: GGUFWriter, config, name: str, file_type: str) -> None:
    rope = getattr(config, "rope_parameters", None) or {}
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    llama = config.model_type == "llama"
    writer.add_type("model")
    writer.add_name(name)
    if llama:
        writer.add_vocab_size(config.vocab_size)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    if llama:  # Qwen2Model leaves these to llama.cpp, which derives them from the head count
        writer.add_rope_dimension_count(head_dim)
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_file_type(FILE_TYPES[file_type][1])
    writer.add_quantization_version(GGML_QUANT_VERSION)


def _disclosure(writer: GGUFWriter, disclosure: Disclosure) -> None:
    """The release's disclosure as ``openstamp.<field>`` keys (strings, bools, uint32, float64)."""
    for key, value in disclosure.gguf_metadata().items():
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_float64(key, float(value))


def write_gguf(
    model, tokenizer, model_dir: str | os.PathLike, out: str | os.PathLike, file_type: str, overwrite: bool = False,
    pre: str | None = None, disclosure: Disclosure | None = None,
) -> dict:  # fmt: skip
    """Write ``model`` (a loaded ``LlamaForCausalLM`` or ``Qwen2ForCausalLM``) and its tokenizer to
    ``out`` atomically.

    ``model_dir`` supplies merges and special tokens (tokenizer.json, tokenizer_config.json).
    ``pre`` is ``tokenizer.ggml.pre``; llama.cpp picks it by hashing the tokenizer's output, and
    ``default`` is its generic byte-level pre-tokenizer; None takes ``guess_pre(tokenizer)``
    (``qwen2`` for Qwen2's split regex, else ``default``). A ``disclosure`` goes into the metadata
    as ``openstamp.<field>``. Returns a record: path, bytes, seconds, whether lm_head was tied,
    how many tensors got each type, and the disclosure written (or None).
    """

    if file_type not in FILE_TYPES:
        raise ValueError(f"unknown GGUF type {file_type!r}; choose one of {', '.join(FILE_TYPES)}")
    config = model.config
    check_supported(config)
    out = check_can_write(out, overwrite)
    guessed = guess_pre(tokenizer)
    if pre is None:
        pre = guessed
    elif pre != guessed and guessed != "default":
        log.warning("the tokenizer splits text like %r but tokenizer.ggml.pre is %r; llama.cpp will split "
                    "differently (pass --pre %s)", guessed, pre, guessed)  # fmt: skip
    start = time.perf_counter()
    tied = is_tied(model)
    state = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.tmp-", dir=out.parent)
    os.close(fd)
    counts: dict[str, int] = {}
    n_gqa = config.num_attention_heads // (getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
    try:
        writer = GGUFWriter(tmp, config.model_type)
        _metadata(writer, config, Path(model_dir).name, file_type)
        _vocab(writer, Path(model_dir), tokenizer, config.vocab_size, pre)
        if disclosure is not None:
            _disclosure(writer, disclosure)
        for hf_name, tensor in state.items():
            name = gguf_name(hf_name)
            data = tensor.detach().to(torch.float32).cpu().numpy()
            if config.model_type == "llama" and name.endswith("attn_q.weight"):
                data = _permute(data, config.num_attention_heads)
            elif config.model_type == "llama" and name.endswith("attn_k.weight"):
                data = _permute(data, config.num_key_value_heads)
            kind = tensor_type(name, data.shape, file_type, config.num_hidden_layers, not tied, n_gqa)
            counts[kind.name] = counts.get(kind.name, 0) + 1
            encoded = encode(data, kind)
            writer.add_tensor(name, encoded, raw_dtype=kind if encoded.dtype == np.uint8 else None)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return {
        "path": str(out),
        "file_type": file_type,
        "bytes": out.stat().st_size,
        "seconds": round(time.perf_counter() - start, 2),
        "tied": tied,
        "architecture": config.model_type,
        "pre": pre,
        "tensor_types": counts,
        "disclosure": disclosure.to_dict() if disclosure is not None else None,
    }


def export_gguf(
    model_dir: str | os.PathLike, out: str | os.PathLike, file_type: str, overwrite: bool = False,
    pre: str | None = None, disclose: bool = True,
) -> dict:  # fmt: skip
    """Load a Hugging Face checkpoint directory (Llama or Qwen2) in float32 and write it as GGUF
    ``file_type``; ``pre`` as in ``write_gguf``.

    With ``disclose`` (the default), the folder's watermark.json, when there is one, goes into
    the file's metadata (``openstamp.method``, ``openstamp.key_id``, ...).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} is not a model directory (no config.json)")
    if file_type not in FILE_TYPES:
        raise ValueError(f"unknown GGUF type {file_type!r}; choose one of {', '.join(FILE_TYPES)}")
    check_supported(AutoConfig.from_pretrained(model_dir))
    check_can_write(out, overwrite)
    disclosure = read_disclosure(model_dir) if disclose else None
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    return write_gguf(model, tokenizer, model_dir, out, file_type, overwrite, pre, disclosure)
