"""Quantization: INT8 and 4-bit NF4 weights for the watermarked model; detect with the unquantized key.

Two paths give the quantized weights:

* ``bitsandbytes``: its own quantizers (``quantize_4bit`` / ``int8_vectorwise_quant``) round-trip
  each weight on a CUDA device. Used where bitsandbytes and a GPU are present.
* ``simulated``: the same codebooks in plain torch, on any device. INT8 is LLM.int8's weight
  format, a per-row (output channel) absmax scale to [-127, 127]; NF4 is QLoRA's 16-value
  NormalFloat codebook on blocks of 64 consecutive weights, each scaled by its absmax.

Both are weight-only quantize-dequantize: the matmuls then run in the model's dtype, so
LLM.int8's fp16 outlier decomposition of the activations is not reproduced. As in transformers'
bitsandbytes integration, every ``nn.Linear`` is quantized except lm_head (``include_head``
quantizes it too, untied first); embeddings and biases stay as they are.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from openstamp.attacks.common import (
    attacked_metrics,
    by_method,
    cached_json,
    config_dict,
    file_name,
    load_method,
    open_eval,
    prepare_out,
    score_texts,
    select_runs,
    watermarked_copy,
)
from openstamp.attacks.report import fmt, md_table, negatives_note, new_figure, publish, save_figure
from openstamp.config import check, option
from openstamp.evaluation.pipeline import generate_set
from openstamp.models import load_model
from openstamp.patch import head, untie
from openstamp.storage import atomic_write_json, read_json

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
SCHEMES = ("int8", "nf4")
BITS = {"int8": 8, "nf4": 4}


@dataclass(frozen=True, kw_only=True)
class QuantizeConfig:
    schemes: tuple[str, ...] = option(SCHEMES, "int8 and/or nf4")
    include_head: bool = option(False, "quantize lm_head too (transformers keeps it unquantized by default)")
    backend: str = option("auto", "auto (bitsandbytes where it runs, else simulated), bitsandbytes or simulated")
    block_size: int = option(64, "NF4 block size (bitsandbytes' default)")
    n: int | None = option(None, "eval prompts completed per method and scheme (default: all)")
    methods: tuple[str, ...] | None = option(None, "methods to attack (default: every method of the eval run)")

    def __post_init__(self) -> None:
        check(len(self.schemes) >= 1 and set(self.schemes) <= set(SCHEMES), f"schemes must be among {SCHEMES}")
        check(self.backend in ("auto", "bitsandbytes", "simulated"), "backend must be auto, bitsandbytes or simulated")
        check(self.block_size >= 2, "block_size must be >= 2")
        check(self.n is None or self.n >= 2, "n must be >= 2")


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
    """Why bitsandbytes cannot quantize here, or None when it can."""
    if importlib.util.find_spec("bitsandbytes") is None:
        return "bitsandbytes is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device (bitsandbytes' quantizers need one)"
    return None


def _bitsandbytes_roundtrip(weight: torch.Tensor, scheme: str, block_size: int) -> torch.Tensor:
    import bitsandbytes.functional as bnbf

    w = weight.detach().to("cuda")
    if scheme == "nf4":
        packed, state = bnbf.quantize_4bit(w, blocksize=block_size, quant_type="nf4")
        restored = bnbf.dequantize_4bit(packed, state)
    else:
        codes, scales, _ = bnbf.int8_vectorwise_quant(w.half())
        restored = bnbf.int8_vectorwise_dequant(codes, scales)
    return restored.to(device=weight.device, dtype=weight.dtype)


@torch.no_grad()
def quantize_model(model: PreTrainedModel, scheme: str, cfg: QuantizeConfig) -> dict:
    """Quantize-dequantize the model's linear weights in place; returns what was done and how."""
    check(scheme in SCHEMES, f"scheme must be one of {SCHEMES}")
    problem = bitsandbytes_problem() if cfg.backend != "simulated" else "the simulated backend was requested"
    if cfg.backend == "bitsandbytes" and problem:
        raise ValueError(f"cannot use bitsandbytes: {problem}")
    if cfg.include_head:
        untie(model)
    out_head = head(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and (cfg.include_head or m is not out_head)]
    relative = []
    for module in linears:
        weight, quantized = module.weight, None
        if problem is None:
            try:
                quantized = _bitsandbytes_roundtrip(weight, scheme, cfg.block_size)
            except Exception as err:  # an old or broken bitsandbytes: fall back, and say so in the report
                problem = f"bitsandbytes failed ({type(err).__name__}: {err})"
                log.warning("%s; using the simulated quantizer", problem)
        if quantized is None:
            quantized = quantize_int8(weight) if scheme == "int8" else quantize_nf4(weight, cfg.block_size)
        relative.append(float((quantized.float() - weight.float()).norm() / weight.float().norm().clamp(min=1e-12)))
        weight.copy_(quantized)
    return {
        "scheme": scheme,
        "backend": "bitsandbytes" if problem is None else "simulated",
        "why_not_bitsandbytes": problem,
        "matrices": len(linears),
        "parameters": int(sum(m.weight.numel() for m in linears)),
        "head_quantized": cfg.include_head,
        "mean_relative_error": float(np.mean(relative)) if relative else None,
    }


def run_quantize(eval_dir: Path, out: Path, cfg: QuantizeConfig, progress: bool = True) -> dict:
    """Quantize each run's watermarked model, generate from it, and detect with the unquantized key."""
    ev = open_eval(eval_dir)
    prepare_out(out, {"eval": str(ev.path.resolve()), **config_dict(cfg)})
    runs = select_runs(ev, cfg.methods)
    base, tokenizer = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    n = min(cfg.n or len(ev.windows), len(ev.windows))
    rows, how = [], {}
    for run in runs:
        eval_scores = ev.scores(run)
        rows.append(_row(run, "unquantized", attacked_metrics(eval_scores["watermarked"][:n], eval_scores)))
        for scheme in cfg.schemes:
            path = out / "scores" / scheme / f"{file_name(run['run'])}.json"
            if not path.exists():
                method = load_method(ev, run, base)
                model = watermarked_copy(base, method)
                atomic_write_json(out / "quantized" / f"{scheme}.json", quantize_model(model, scheme, cfg))
                if progress:
                    log.info("%s with %s weights: generating and scoring", run["run"], scheme)
                gen = f"{scheme}/{run['generations']}"
                processor = method.logits_processor()
                ids = generate_set(out, gen, model, tokenizer, ev.prompts(n), ev.cfg, run["seed"], processor, False)
                texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
                cached_json(path, score_texts, method, base, tokenizer, texts, ev.cfg.score_batch_size)
                del model
            how[scheme] = read_json(out / "quantized" / f"{scheme}.json", "quantization record")
            rows.append(_row(run, scheme, attacked_metrics(read_json(path, "scores"), eval_scores)))
    summary = by_method(rows, ("auroc", "tpr_at_1pct_fpr", "tpr_at_0.1pct_fpr"), extra=("scheme",))
    columns = ["unquantized", *cfg.schemes]
    plot = _plot(summary, columns, out / "quantize_tpr.png")
    body = _section(ev, cfg, n, summary, columns, how, {r["method"]: r["decode_time"] for r in rows})
    results = {
        "settings": config_dict(cfg),
        "eval": str(ev.path),
        "n": n,
        "quantization": how,
        "runs": rows,
        "summary": summary,
    }
    publish(out, "quantize", "quantization", body, [plot], results, ev.path)
    return results


def _row(run: dict, scheme: str, metrics: dict) -> dict:
    from openstamp.methods import REGISTRY, Carrier

    return {
        **{k: run[k] for k in ("run", "method", "strength", "seed")},
        "scheme": scheme,
        "decode_time": REGISTRY[run["method"]].carrier is Carrier.DECODER,
        **{k: metrics[k] for k in ("auroc", "tpr_at_1pct_fpr", "tpr_at_0.1pct_fpr")},
    }


def _section(
    ev, cfg: QuantizeConfig, n: int, summary: list[dict], columns: list[str], how: dict, decode: dict
) -> list[str]:
    def table(key: str) -> list[str]:
        rows = []
        for method in dict.fromkeys(s["method"] for s in summary):
            cells = {s["scheme"]: fmt(s[key]) for s in summary if s["method"] == method}
            label = f"{method} (decode-time)" if decode.get(method) else method
            rows.append([label, *[cells.get(c, "-") for c in columns]])
        return md_table(["method", *[c.upper() if c in SCHEMES else "Unquantized" for c in columns]], rows)

    paths = []
    for scheme, info in how.items():
        reason = f" ({info['why_not_bitsandbytes']})" if info["why_not_bitsandbytes"] else ""
        paths.append(
            f"{scheme.upper()}: {info['backend']} path{reason}; {info['matrices']} weight matrices "
            f"({info['parameters']:,} weights), mean relative error {fmt(info['mean_relative_error'], 4)}"
        )
    head_note = "lm_head quantized too" if cfg.include_head else "lm_head kept unquantized, as transformers does"
    return [
        f"The watermarked models of `{ev.path}` with INT8 (per-row absmax, LLM.int8's weight format) or NF4 "
        f"(QLoRA's code, blocks of {cfg.block_size}) weights, {head_note}. Each completed the first {n} eval prompts "
        "(the eval's sampling seeds); each method's unchanged detector scored them with the original, unquantized "
        f"model. {negatives_note(ev)} Decode-time methods run their logits processor on the quantized "
        "unwatermarked model. Cells: mean ± sd over seeds.",
        "",
        "Quantization path: " + "; ".join(paths) + ".",
        "",
        "TPR@1%FPR:",
        "",
        *table("tpr_at_1pct_fpr"),
        "",
        "AUROC:",
        "",
        *table("auroc"),
    ]


def _plot(summary: list[dict], columns: list[str], path: Path) -> Path:
    methods = list(dict.fromkeys(s["method"] for s in summary))
    fig, ax = new_figure(max(5.0, 1.2 * len(methods) + 2), 3.8)
    width = 0.8 / len(columns)
    for j, column in enumerate(columns):
        values = {s["method"]: s["tpr_at_1pct_fpr"]["mean"] or 0.0 for s in summary if s["scheme"] == column}
        x = np.arange(len(methods)) + (j - (len(columns) - 1) / 2) * width
        ax.bar(x, [values.get(m, 0.0) for m in methods], width, label=column)
    ax.set_xticks(np.arange(len(methods)), methods, rotation=20, fontsize=8)
    ax.set(ylim=(0, 1.05), ylabel="TPR @ 1% FPR (human negatives)", title="detectability under quantization")
    ax.legend(fontsize=8)
    return save_figure(fig, path)
