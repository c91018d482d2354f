"""Resolve a model (hub id, local directory, or packaged alias) to a model and tokenizer.

A packaged GGUF is converted once into a safetensors folder in the cache, so later
loads take under a second and give identical logits.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from openstamp.assets import PACKAGED_MODELS, PackagedModel, cache_root, gguf_path, sha256_file
from openstamp.errors import ModelNotFoundError
from openstamp.model.similarity import similarity
from openstamp.storage import atomic_directory

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return "auto"
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {sorted(DTYPES)} or 'auto'")
    return DTYPES[dtype]


def fast_dtype(device: str = "cpu") -> str:
    """bfloat16 where ``device`` computes it natively (a CUDA GPU with bf16, a CPU with AVX512-BF16 or AMX), else
    float32: bfloat16 emulated on an older CPU is slower than float32."""
    where = resolve_device(device)
    if where.type == "cuda":
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float32"
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private, so absent in some versions
    native = (getattr(torch.cpu, name, lambda: False)() for name in checks)
    return "bfloat16" if any(native) else "float32"


def sampling_copy(model: PreTrainedModel, dtype: str) -> PreTrainedModel:
    """A copy of ``model`` (watermark included, ties kept) cast to ``dtype`` for sampling; ``model`` itself for float32
    (the model as loaded) or where it already has that dtype.

    The copy runs eager attention: on a CPU, PyTorch's scaled-dot-product kernel is slower in bfloat16 than in
    float32 for one-token decode steps, and the copy with eager attention samples 1.5-2x as fast as the float32
    model (``benchmarks/speed/generate_speed.py``). The original's weights are left as they are.
    """
    if dtype == "float32" or model.dtype == resolve_dtype(dtype):
        return model
    cast = copy.deepcopy(model).to(resolve_dtype(dtype))
    if cast.device.type == "cpu":
        cast.set_attn_implementation("eager")
    return cast.eval()


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return torch.device(device)


def convert_packaged(asset: PackagedModel, cache_dir: str | os.PathLike | None = None) -> Path:
    """Convert a packaged GGUF once into ``<cache>/models/<alias>`` and return that folder."""
    root = cache_root(cache_dir)
    target = root / "models" / asset.alias
    if (target / "config.json").exists():
        return target
    gguf = gguf_path(asset, root)
    log.info("converting %s to safetensors in %s (once; takes 20-60 s)", gguf.name, target)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    source = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = source.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # transformers refuses to save a model marked as GGUF-quantized
    state = source.state_dict()
    retied = not config.tie_word_embeddings and quantized_twins(source)
    if retied:  # upstream ties its head; the GGUF holds two quantized copies of U: keep the finer one, tied
        log.info("%s stores lm_head and the input embeddings as two copies of one matrix; tying them", gguf.name)
        config.tie_word_embeddings = True
        state[embedding_name(source)] = state["lm_head.weight"]
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state)
    with atomic_directory(target, overwrite=True) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        provenance = {"alias": asset.alias, "gguf": gguf.name, "gguf_sha256": sha256_file(gguf), "retied": retied}
        (tmp / "openstamp_source.json").write_text(json.dumps(provenance, indent=2))
    return target


TWIN_COSINE = 0.99  # two quantizations of one matrix agree far closer; unrelated matrices sit near 0


def quantized_twins(model: PreTrainedModel) -> bool:
    """Whether an untied model's head and input embeddings are one matrix quantized twice (centred cosine at least
    ``TWIN_COSINE``), as in a GGUF of a tied model whose converter wrote ``output.weight`` beside ``token_embd``.
    Released untied, such a model would leak the watermark: its input embeddings are a near copy of U."""
    head_w, embed_w = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    if head_w.shape != embed_w.shape or head_w.data_ptr() == embed_w.data_ptr():
        return False
    rows = range(0, len(head_w), 8192)
    blocks = (head_w[i : i + 8192].detach() for i in rows), (embed_w[i : i + 8192].detach() for i in rows)
    return similarity(*blocks).cosine >= TWIN_COSINE


def embedding_name(model: PreTrainedModel) -> str:
    """The state-dict name of ``model``'s input embedding matrix."""
    embed = model.get_input_embeddings()
    return next(f"{name}.weight" for name, module in model.named_modules() if module is embed)


def resolve_model_path(spec: str, cache_dir: str | os.PathLike | None = None) -> str:
    """Turn a model spec into something ``from_pretrained`` accepts."""
    path = Path(spec).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise ModelNotFoundError(f"{path} is not a Hugging Face model directory (no config.json)")
        return str(path)
    if spec in PACKAGED_MODELS:
        return str(convert_packaged(PACKAGED_MODELS[spec], cache_dir))
    if _HUB_ID.match(spec):
        return spec
    raise ModelNotFoundError(
        f"unknown model {spec!r}: not a directory, not a packaged alias ({', '.join(PACKAGED_MODELS)}) "
        "and not a hub id (org/name)"
    )


def load_tokenizer(spec: str, cache_dir: str | os.PathLike | None = None) -> PreTrainedTokenizerBase:
    path = resolve_model_path(spec, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    spec: str,
    *,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    cache_dir: str | os.PathLike | None = None,
    device_map: str | dict | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a causal LM and its tokenizer from a hub id, a local directory or a packaged alias.

    ``device_map`` (e.g. ``"auto"``) hands placement to accelerate, which spreads a model that
    does not fit one device over GPUs, CPU memory and disk; ``device`` is then ignored.
    """
    path = resolve_model_path(spec, cache_dir)
    placement = {"device_map": device_map} if device_map is not None else {}
    try:
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype), **placement)
    except OSError as err:
        where = "the Hugging Face hub" if path == spec and not Path(spec).exists() else path
        raise ModelNotFoundError(f"could not load model {spec!r} from {where}: {err}") from err
    except SafetensorError as err:  # a truncated or corrupt weights file: one line, as the audit says it
        raise ValueError(f"could not load model {spec!r}: its safetensors weights are not readable: {err}") from err
    if device_map is None:
        model.to(resolve_device(device))
    model.eval()
    return model, tokenizer


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device
