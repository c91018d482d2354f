"""Weight quantizers for the quantization attack: real codecs where installed, simulated otherwise.

Every scheme is a weight-only quantize-dequantize: each weight ``W`` is replaced by
``dequant(quant(W))`` and the matmuls then run in the model's dtype. The record of each run says
which ``backend`` produced the weights and, when it is ``simulated``, why.

* ``int8``, ``nf4``: bitsandbytes' quantizers (``int8_vectorwise_quant``: per-row absmax to
  [-127, 127]; ``quantize_4bit``: QLoRA's NF4 code on blocks of 64), on CPU or CUDA. Simulated in
  plain torch (same codebooks) when bitsandbytes is missing or fails.
* ``gguf-q8_0``, ``gguf-q4_0``, ``gguf-q4_k_m``, ``gguf-q2_k``: llama.cpp's codecs (``openstamp.release.gguf_quants``)
  with ``llama-quantize``'s per-tensor types (``openstamp.release.gguf_export.tensor_type``), applied to
  the input embeddings too, as a GGUF file stores them. Quantizing rows in place gives the same
  weights as exporting and reloading: blocks run along a row, and the Q/K permutation only
  reorders rows.
* ``hqq-4bit``: HQQ (``hqq`` package), 4 bits, groups of 64, as transformers' ``HqqConfig``.
* ``quanto-int8``, ``quanto-int4``: optimum-quanto's ``quantize`` + ``freeze`` on each linear.

Head: GGUF recipes quantize ``output.weight`` (Q6_K, or Q8_0 in q8_0 files); transformers'
bitsandbytes, HQQ and quanto integrations keep lm_head unquantized. ``recipe_quantizes_head``
says which; either variant can be asked for. With a tied head the GGUF variants treat the one
shared matrix as llama.cpp does (quantized as the output tensor, or kept float with it); the
others untie first, so that only lm_head changes.
"""

from __future__ import annotations

import importlib.util
import logging
import re

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from openstamp.errors import MissingExtraError
from openstamp.model.patch import head, is_tied, untie
from openstamp.release.gguf_export import tensor_type
from openstamp.release.gguf_quants import roundtrip

log = logging.getLogger(__name__)

# QLoRA's NormalFloat-4 code (Dettmers et al. 2023), as bitsandbytes stores it
NF4_CODE = torch.tensor(
    [
        -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
        -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
        0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
        0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0,
    ]
)  # fmt: skip
# scheme -> (python module it needs, or None, the extra that installs it)
SCHEMES = {
    "int8": None,
    "nf4": None,
    "gguf-q8_0": "gguf",
    "gguf-q4_0": "gguf",
    "gguf-q4_k_m": "gguf",
    "gguf-q2_k": "gguf",
    "hqq-4bit": "hqq",
    "quanto-int8": "optimum.quanto",
    "quanto-int4": "optimum.quanto",
}
BITS = {"int8": 8, "nf4": 4, "gguf-q8_0": 8, "gguf-q4_0": 4, "gguf-q4_k_m": 4, "gguf-q2_k": 2, "hqq-4bit": 4}
BITS.update({"quanto-int8": 8, "quanto-int4": 4})


def recipe_quantizes_head(scheme: str) -> bool:
    """GGUF files quantize output.weight; transformers' integrations keep lm_head in float."""
    return scheme.startswith("gguf-")


def missing_backend(scheme: str) -> str | None:
    """A message when the package that ``scheme`` needs is not installed, else None."""
    module = SCHEMES[scheme]
    if module is None or _find(module):
        return None
    return f"{scheme} needs {module}: pip install 'openstamp[attacks]'"


def _find(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def quantize_int8(weight: torch.Tensor) -> torch.Tensor:
    """Per-row absmax INT8 quantize-dequantize: (out, in) -> (out, in), at most 255 values per row."""
    w = weight.float()
    scale = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-12) / 127.0
    return (torch.round(w / scale).clamp(-127, 127) * scale).to(weight.dtype)


def quantize_nf4(weight: torch.Tensor, block_size: int = 64, chunk_blocks: int = 1 << 16) -> torch.Tensor:
    """NF4 quantize-dequantize on blocks of ``block_size`` consecutive (row-major) weights.

    Each block is scaled by its absmax to [-1, 1] and rounded to the nearest of the 16 NF4
    values, so a block holds at most 16 distinct values. Any shape in, same shape out.
    """
    flat = weight.detach().reshape(-1)
    out = torch.empty(flat.numel(), dtype=weight.dtype, device=weight.device)
    code = NF4_CODE.to(weight.device)
    midpoints = (code[1:] + code[:-1]) / 2
    step = block_size * chunk_blocks
    for start in range(0, flat.numel(), step):
        part = flat[start : start + step].float()
        blocks = F.pad(part, (0, (-part.numel()) % block_size)).reshape(-1, block_size)
        absmax = blocks.abs().amax(dim=1, keepdim=True)
        index = torch.bucketize(blocks / absmax.clamp(min=1e-12), midpoints)
        out[start : start + part.numel()] = (code[index] * absmax).reshape(-1)[: part.numel()].to(weight.dtype)
    return out.reshape(weight.shape)


def bitsandbytes_problem() -> str | None:
    """Why bitsandbytes cannot quantize here, or None when it can (its CPU backend counts)."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed"
    return None


def bitsandbytes_roundtrip(weight: torch.Tensor, scheme: str, block_size: int) -> torch.Tensor:
    import bitsandbytes.functional as bnbf

    device = "cuda" if torch.cuda.is_available() else "cpu"
    w = weight.detach().to(device)
    if scheme == "nf4":
        packed, state = bnbf.quantize_4bit(w.float(), blocksize=block_size, quant_type="nf4")
        restored = bnbf.dequantize_4bit(packed, state)
    else:
        codes, scales, _ = bnbf.int8_vectorwise_quant(w.half())
        restored = bnbf.int8_vectorwise_dequant(codes, scales)
    return restored.to(device=weight.device, dtype=weight.dtype)


def hqq_roundtrip(weight: torch.Tensor, nbits: int = 4, group_size: int = 64) -> torch.Tensor:
    """HQQ quantize-dequantize (half-quadratic solver for the zero points), as HqqConfig does."""
    from hqq.core.quantize import BaseQuantizeConfig, HQQLinear

    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data = weight.detach().float().cpu().clone()
    cfg = BaseQuantizeConfig(nbits=nbits, group_size=group_size)
    quantized = HQQLinear(linear, cfg, compute_dtype=torch.float32, device="cpu", del_orig=True)
    return quantized.dequantize().reshape(weight.shape).to(device=weight.device, dtype=weight.dtype)


def quanto_roundtrip(weight: torch.Tensor, bits: int) -> torch.Tensor:
    """optimum-quanto's weight quantization of one linear (int8 per row, int4 in groups), dequantized."""
    from optimum.quanto import freeze, qint4, qint8, quantize

    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data = weight.detach().float().cpu().clone()
    wrapper = torch.nn.Sequential(linear)
    quantize(wrapper, weights=qint8 if bits == 8 else qint4)
    freeze(wrapper)
    return wrapper[0].weight.dequantize().detach().reshape(weight.shape).to(device=weight.device, dtype=weight.dtype)


def _gguf_role(name: str, is_head: bool, is_embed: bool) -> str:
    """A llama.cpp tensor name that carries the role ``tensor_type`` needs (any decoder, not just Llama)."""
    if is_head:
        return "output.weight"
    if is_embed:
        return "token_embd.weight"
    layer = re.search(r"layers\.(\d+)\.", name)
    index = layer.group(1) if layer else "0"
    parts = {"v_proj": "attn_v", "down_proj": "ffn_down", "o_proj": "attn_output"}
    role = next((role for part, role in parts.items() if part in name), "other")
    return f"blk.{index}.{role}.weight"


@torch.no_grad()
def _gguf_quantize(model: PreTrainedModel, scheme: str, quantize_head: bool) -> tuple[list, dict[str, int]]:
    """(parameter, quantize-dequantized value) pairs, and how many matrices got each GGUF type."""
    file_type = scheme.removeprefix("gguf-")
    tied, out_w, in_w = is_tied(model), head(model).weight, model.get_input_embeddings().weight
    text_config = model.config.get_text_config()
    n_layers, n_heads = text_config.num_hidden_layers, text_config.num_attention_heads
    n_gqa = n_heads // (getattr(text_config, "num_key_value_heads", None) or n_heads)
    done, changed, types = set(), [], {}
    for name, param in model.named_parameters(remove_duplicate=True):
        if param.dim() != 2 or param.data_ptr() in done:
            continue
        done.add(param.data_ptr())
        is_head = param is out_w or (tied and param is in_w)
        if is_head and not quantize_head:
            continue
        role = _gguf_role(name, is_head and not tied, param is in_w)
        kind = tensor_type(role, tuple(param.shape), file_type, n_layers, has_output=not tied, n_gqa=n_gqa)
        types[kind.name] = types.get(kind.name, 0) + 1
        restored = torch.from_numpy(roundtrip(param.detach().float().cpu().numpy(), kind))
        changed.append((param, restored.to(device=param.device, dtype=param.dtype)))
    return changed, types


@torch.no_grad()
def quantize_model(
    model: PreTrainedModel, scheme: str, quantize_head: bool, backend: str = "auto", block_size: int = 64
) -> dict:
    """Quantize-dequantize the model's weights in place; returns what was done, by which backend, and why.

    ``backend`` matters for int8 and nf4 only: auto (bitsandbytes where it runs, else simulated),
    bitsandbytes, or simulated. Other schemes have one backend each and raise when it is missing.
    """
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; choose among {', '.join(SCHEMES)}")
    if problem := missing_backend(scheme):
        raise MissingExtraError(problem)
    why, types = None, None
    if scheme.startswith("gguf-"):
        (pairs, types), kind = _gguf_quantize(model, scheme, quantize_head), "gguf"
    else:
        if quantize_head:
            untie(model)
        out_head = head(model)
        linears = [
            m for m in model.modules() if isinstance(m, torch.nn.Linear) and (quantize_head or m is not out_head)
        ]
        kind, why = _backend(scheme, backend)
        pairs = []
        for module in linears:
            restored, kind, why = _one(module.weight, scheme, kind, why, block_size)
            pairs.append((module.weight, restored))
    relative = [float((q.float() - p.float()).norm() / p.float().norm().clamp(min=1e-12)) for p, q in pairs]
    for param, restored in pairs:
        param.copy_(restored)
    return {
        "scheme": scheme,
        "backend": kind,
        "why_simulated": why,
        "matrices": len(pairs),
        "parameters": int(sum(p.numel() for p, _ in pairs)),
        "head_quantized": quantize_head,
        "head_as_recipe": quantize_head == recipe_quantizes_head(scheme),
        "tensor_types": types,
        "mean_relative_error": float(np.mean(relative)) if relative else None,
    }


def _backend(scheme: str, backend: str) -> tuple[str, str | None]:
    if scheme.startswith("hqq"):
        return "hqq", None
    if scheme.startswith("quanto"):
        return "quanto", None
    if backend == "simulated":
        return "simulated", "the simulated backend was requested"
    problem = bitsandbytes_problem()
    if backend == "bitsandbytes" and problem:
        raise ValueError(f"cannot use bitsandbytes: {problem}")
    return ("simulated", problem) if problem else ("bitsandbytes", None)


def _one(
    weight: torch.Tensor, scheme: str, kind: str, why: str | None, block_size: int
) -> tuple[torch.Tensor, str, str | None]:
    if kind == "hqq":
        return hqq_roundtrip(weight), kind, why
    if kind == "quanto":
        return quanto_roundtrip(weight, BITS[scheme]), kind, why
    if kind == "bitsandbytes":
        try:
            return bitsandbytes_roundtrip(weight, scheme, block_size), kind, why
        except Exception as err:  # an old or broken bitsandbytes: fall back, and say so in the report
            why = f"bitsandbytes failed ({type(err).__name__}: {err})"
            log.warning("%s; using the simulated quantizer", why)
            kind = "simulated"
    restored = quantize_int8(weight) if scheme == "int8" else quantize_nf4(weight, block_size)
    return restored, kind, why
