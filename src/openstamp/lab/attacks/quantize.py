"""Quantization: the watermarked model's weights through real quantizers; detect with the unquantized key.

The quantizers live in ``openstamp.lab.attacks.quantizers``: bitsandbytes INT8 and NF4 (on CPU or
CUDA; a plain-torch simulation of the same codebooks where bitsandbytes is missing), llama.cpp's
GGUF codecs (Q8_0, Q4_0, Q4_K_M and Q2_K with llama-quantize's per-tensor types), HQQ 4-bit and
optimum-quanto INT8/INT4. All are weight-only quantize-dequantize, so activation tricks such as
LLM.int8's fp16 outlier decomposition are not reproduced.

The head follows each scheme's real recipe by default: GGUF files quantize ``output.weight``,
transformers' bitsandbytes, HQQ and quanto integrations keep lm_head in float. ``head`` asks for
the other variant too (``recipe+float``, the default, adds the float-head variant beside every
recipe that quantizes the head). Every results row carries its ``backend`` and, when simulated, why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from openstamp.config import check, option
from openstamp.errors import MissingExtraError
from openstamp.lab.attacks.common import (
    AT_COST_HELP,
    attacked_metrics,
    by_method,
    cached_json,
    check_at_cost,
    config_dict,
    cost_note,
    detection_fields,
    file_name,
    load_method,
    mean_score,
    open_eval,
    prepare_out,
    score_texts,
    select_runs,
    watermarked_copy,
)
from openstamp.lab.attacks.quantizers import (
    BITS,
    SCHEMES,
    missing_backend,
    quantize_int8,
    quantize_model,
    quantize_nf4,
    recipe_quantizes_head,
)
from openstamp.lab.attacks.report import COMPARED, fmt, md_table, negatives_note, new_figure, publish, save_figure
from openstamp.lab.evaluation.pipeline import generate_set
from openstamp.lab.methods import REGISTRY, Carrier
from openstamp.model.load import load_model
from openstamp.storage import atomic_write_json, read_json

__all__ = ["BITS", "SCHEMES", "QuantizeConfig", "quantize_int8", "quantize_model", "quantize_nf4", "run_quantize"]
log = logging.getLogger(__name__)
HEAD_MODES = ("recipe", "recipe+float", "both", "quantized", "float")


@dataclass(frozen=True, kw_only=True)
class QuantizeConfig:
    schemes: tuple[str, ...] = option(("int8", "nf4"), f"among {', '.join(SCHEMES)}")
    head: str = option(
        "recipe+float",
        "recipe (each scheme's real default), recipe+float (also a float-head variant where the recipe "
        "quantizes lm_head), both, quantized or float",
    )
    backend: str = option(
        "auto", "int8/nf4: auto (bitsandbytes where it runs, else simulated), bitsandbytes or simulated"
    )
    block_size: int = option(64, "NF4 block size (bitsandbytes' default)")
    n: int | None = option(None, "eval prompts completed per method and scheme (default: all)")
    methods: tuple[str, ...] | None = option(None, "methods to attack (default: every method of the eval run)")
    at_cost: float | None = option(None, AT_COST_HELP)

    def __post_init__(self) -> None:
        check_at_cost(self.at_cost)
        check(len(self.schemes) >= 1 and set(self.schemes) <= set(SCHEMES), f"schemes must be among {tuple(SCHEMES)}")
        check(self.head in HEAD_MODES, f"head must be one of {HEAD_MODES}")
        check(self.backend in ("auto", "bitsandbytes", "simulated"), "backend must be auto, bitsandbytes or simulated")
        check(self.block_size >= 2, "block_size must be >= 2")
        check(self.n is None or self.n >= 2, "n must be >= 2")

    def variants(self) -> list[tuple[str, str, bool]]:
        """(label, scheme, quantize lm_head) for each model to attack; the label names the head when off-recipe."""
        out = []
        for scheme in self.schemes:
            recipe = recipe_quantizes_head(scheme)
            heads = {
                "recipe": [recipe],
                "recipe+float": [recipe, False] if recipe else [recipe],
                "both": [recipe, not recipe],
                "quantized": [True],
                "float": [False],
            }[self.head]
            out += [
                (scheme if q == recipe else f"{scheme}+{'quantized' if q else 'float'}-head", scheme, q) for q in heads
            ]
        return out


def run_quantize(eval_dir: Path, out: Path, cfg: QuantizeConfig, progress: bool = True) -> dict:
    """Quantize each run's watermarked model, generate from it, and detect with the unquantized key."""
    ev = open_eval(eval_dir)
    prepare_out(out, {"eval": str(ev.path.resolve()), **config_dict(cfg)})
    runs = select_runs(ev, cfg.methods, cfg.at_cost)
    base, tokenizer = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    n = min(cfg.n or len(ev.windows), len(ev.windows))
    rows, how = [], {}
    variants = cfg.variants()
    for scheme in dict.fromkeys(v[1] for v in variants):
        if problem := missing_backend(scheme):
            raise MissingExtraError(problem)
    for run in runs:
        eval_scores = ev.scores(run)
        rows.append(_row(run, "unquantized", _metrics(eval_scores["watermarked"][:n], eval_scores), None))
        for label, scheme, quantize_head in variants:
            path = out / "scores" / label / f"{file_name(run['run'])}.json"
            record = out / "quantized" / f"{label}.json"
            if not path.exists():
                method = load_method(ev, run, base)
                model = watermarked_copy(base, method)
                atomic_write_json(record, quantize_model(model, scheme, quantize_head, cfg.backend, cfg.block_size))
                if progress:
                    log.info("%s with %s weights: generating and scoring", run["run"], label)
                gen = f"{label}/{run['generations']}"
                processor = method.logits_processor()
                ids = generate_set(out, gen, model, tokenizer, ev.prompts(n), ev.cfg, run["seed"], processor, False)
                texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
                cached_json(path, score_texts, method, base, tokenizer, texts, ev.cfg)
                del model
            how[label] = read_json(record, "quantization record")
            rows.append(_row(run, label, _metrics(read_json(path, "scores"), eval_scores), how[label]))
    kept = (*(key for _, key in COMPARED), "tpr_at_0.1pct_fpr", "mean_score")
    summary = by_method(rows, kept, extra=("scheme",))
    columns = ["unquantized", *(v[0] for v in variants)]
    plot = _plot(summary, columns, out / "quantize_tpr.png")
    body = _section(ev, cfg, n, summary, columns, how, {r["method"]: r["decode_time"] for r in rows}, runs)
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


def _metrics(attacked: list[dict], eval_scores: dict) -> dict:
    """Detection of the attacked texts, and their mean detector score (it moves where TPR saturates)."""
    return {**attacked_metrics(attacked, eval_scores), "mean_score": mean_score(attacked)}


def _row(run: dict, label: str, metrics: dict, how: dict | None) -> dict:
    return {
        **{k: run[k] for k in ("run", "method", "strength", "seed")},
        "scheme": label,
        "backend": how["backend"] if how else None,
        "why_simulated": how["why_simulated"] if how else None,
        "head_quantized": how["head_quantized"] if how else None,
        "decode_time": REGISTRY[run["method"]].carrier is Carrier.DECODER,
        **detection_fields(metrics),
        "mean_score": metrics["mean_score"],
    }


def _header(label: str, how: dict) -> str:
    if label == "unquantized":
        return "Unquantized"
    return f"{label.upper()} [{how[label]['backend']}]" if label in how else label.upper()


def _section(
    ev, cfg: QuantizeConfig, n: int, summary: list[dict], columns: list[str], how: dict, decode: dict, runs: list[dict]
) -> list[str]:
    def table(key: str) -> list[str]:
        rows = []
        for method in dict.fromkeys(s["method"] for s in summary):
            cells = {s["scheme"]: fmt(s[key]) for s in summary if s["method"] == method}
            label = f"{method} (decode-time)" if decode.get(method) else method
            rows.append([label, *[cells.get(c, "-") for c in columns]])
        return md_table(["method", *[_header(c, how) for c in columns]], rows)

    paths = []
    for label, info in how.items():
        reason = f" ({info['why_simulated']})" if info["why_simulated"] else ""
        head = "lm_head quantized" if info["head_quantized"] else "lm_head float"
        recipe = "as the recipe does" if info["head_as_recipe"] else "unlike the recipe"
        types = info.get("tensor_types")
        kinds = f", GGUF types {', '.join(f'{k} x{v}' for k, v in sorted(types.items()))}" if types else ""
        error = fmt(info["mean_relative_error"], 4)
        paths.append(
            f"{label.upper()}: {info['backend']} backend{reason}; {head} ({recipe}); {info['matrices']} weight "
            f"matrices ({info['parameters']:,} weights{kinds}), mean relative error {error}"
        )
    return [
        f"The watermarked models of `{ev.path}` with quantize-dequantized weights (column headers: scheme "
        "[backend]; a simulated backend is plain torch with the same codebook, the reason is given below). "
        f"Each completed the first {n} eval prompts (the eval's sampling seeds); each method's unchanged detector "
        f"scored them with the original, unquantized model. {negatives_note(ev)} Decode-time methods run their "
        "logits processor on the quantized unwatermarked model. Cells: mean ± sd over seeds."
        + cost_note(ev, cfg.at_cost, runs),
        "",
        *[f"- {p}" for p in paths],
        *[line for label, key in COMPARED for line in ("", f"{label}:", "", *table(key))],
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
