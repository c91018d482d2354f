"""Pruning: zero a fraction of the watermarked model's weights, then detect with the unchanged key.

Unstructured pruning of every ``nn.Linear`` in the decoder blocks (lm_head too with
``include_head``, untied first as the quantization attack does; embeddings stay):

* magnitude: per layer, zero the floor(s n) weights of smallest |W_ij| over the whole matrix.
* wanda (Sun et al. 2023): score S_ij = |W_ij| * ||X_j||_2, where ||X_j||_2 is the L2 norm of
  input feature j over every calibration token; per output row, zero the floor(s d_in) lowest
  scores. The input norms are collected with forward hooks in one pass of the unpruned model
  over a few calibration windows of a packaged corpus (Wanda's reference code prunes block by
  block with the previous blocks already pruned; one pass is the simpler variant).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from openstamp.config import check, option
from openstamp.corpus import load_documents, split_documents
from openstamp.lab.attacks.common import (
    AT_COST_HELP,
    DETECTION,
    by_method,
    check_at_cost,
    config_dict,
    cost_note,
    file_name,
    load_method,
    open_eval,
    prepare_out,
    watermarked_copy,
)
from openstamp.lab.attacks.report import DETECTION_TABLES, negatives_note, publish, titled_tables
from openstamp.lab.attacks.weights import (
    attacked_row,
    cached_perplexity,
    detect_attacked,
    quality_windows,
    setting_table,
    tpr_and_ppl_plot,
    weight_runs,
)
from openstamp.lab.training import training_windows
from openstamp.model.load import load_model, model_device
from openstamp.model.patch import head, untie

log = logging.getLogger(__name__)
PRUNERS = ("magnitude", "wanda")


@dataclass(frozen=True, kw_only=True)
class PruneConfig:
    pruner: str = option("wanda", f"one of {PRUNERS}")
    sparsities: tuple[float, ...] = option((0.1, 0.2, 0.3, 0.4, 0.5), "fractions of each layer's weights zeroed")
    include_head: bool = option(False, "prune lm_head too (untied first)")
    calibration: str = option("wikipedia", "corpus of Wanda's calibration windows (its key half)")
    calibration_windows: int = option(8, "calibration windows")
    seq_len: int = option(128, "tokens per calibration and perplexity window")
    n: int | None = option(None, "eval prompts completed per sparsity (default: all)")
    ppl_windows: int = option(16, "held-out windows for perplexity")
    methods: tuple[str, ...] | None = option(None, "methods to attack (default: every weight-level method of the run)")
    at_cost: float | None = option(None, AT_COST_HELP)

    def __post_init__(self) -> None:
        check(self.pruner in PRUNERS, f"pruner must be one of {PRUNERS}")
        check(
            len(self.sparsities) >= 1 and all(0 < s < 1 for s in self.sparsities), "every sparsity must lie in (0, 1)"
        )
        check(self.calibration_windows >= 1 and self.ppl_windows >= 1, "need at least one window of each kind")
        check(self.seq_len >= 8, "seq_len must be >= 8")
        check(self.n is None or self.n >= 2, "n must be >= 2")
        check_at_cost(self.at_cost)


def magnitude_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Bool (out, in): False for the floor(sparsity * numel) entries of smallest |W| in the whole matrix."""
    k = int(sparsity * weight.numel())
    keep = torch.ones(weight.numel(), dtype=torch.bool, device=weight.device)
    keep[torch.argsort(weight.abs().reshape(-1).float())[:k]] = False
    return keep.reshape(weight.shape)


def wanda_mask(weight: torch.Tensor, input_norm: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Bool (out, in): per row, False for the floor(sparsity * in) lowest |W_ij| * ||X_j||_2 (input_norm: (in,))."""
    score = weight.abs().float() * input_norm.float().to(weight.device)[None, :]
    k = int(sparsity * weight.shape[1])
    keep = torch.ones_like(weight, dtype=torch.bool)
    keep.scatter_(1, torch.argsort(score, dim=1)[:, :k], False)
    return keep


def prunable(model: PreTrainedModel, include_head: bool) -> dict[str, torch.nn.Linear]:
    """The linear layers of the decoder blocks by name, plus lm_head when asked (untied first)."""
    if include_head:
        untie(model)
    layers = {
        f"layers.{name}": m for name, m in model.get_decoder().layers.named_modules() if isinstance(m, torch.nn.Linear)
    }
    if include_head:
        layers["lm_head"] = head(model)
    return layers


@torch.inference_mode()
def input_norms(model: PreTrainedModel, layers: dict[str, torch.nn.Linear], windows: torch.Tensor) -> dict:
    """||X_j||_2 over every token of ``windows`` (N, T) for each layer's input: {name: (in,)} via forward hooks."""
    sums = {name: torch.zeros(m.in_features, dtype=torch.float64) for name, m in layers.items()}

    def hook(name):
        def record(module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).double().cpu()
            sums[name] += (x * x).sum(0)

        return record

    handles = [m.register_forward_pre_hook(hook(name)) for name, m in layers.items()]
    try:
        device = model_device(model)
        for row in windows:
            model(input_ids=row[None].to(device))
    finally:
        for h in handles:
            h.remove()
    return {name: s.sqrt().float() for name, s in sums.items()}


@torch.no_grad()
def prune_model(
    model: PreTrainedModel, sparsity: float, cfg: PruneConfig, norms: dict | None = None
) -> dict[str, float]:
    """Prune in place; ``norms`` (from ``input_norms``) are needed for Wanda. Returns each layer's sparsity."""
    check(0 < sparsity < 1, "sparsity must lie in (0, 1)")
    check(cfg.pruner != "wanda" or norms is not None, "wanda needs the calibration input norms")
    reached = {}
    for name, layer in prunable(model, cfg.include_head).items():
        w = layer.weight
        keep = magnitude_mask(w, sparsity) if cfg.pruner == "magnitude" else wanda_mask(w, norms[name], sparsity)
        w.mul_(keep.to(w.dtype))
        reached[name] = int((w == 0).sum()) / w.numel()
    return reached


def calibration_norms(model: PreTrainedModel, tokenizer, cfg: PruneConfig) -> dict:
    """Wanda's input norms of ``model`` on ``cfg.calibration_windows`` windows of the calibration corpus."""
    docs = split_documents(load_documents(cfg.calibration), "key")
    windows = training_windows(tokenizer, docs, cfg.seq_len)[: cfg.calibration_windows]
    return input_norms(model, prunable(model, cfg.include_head), windows)


def run_prune(eval_dir: Path, out: Path, cfg: PruneConfig, progress: bool = True) -> dict:
    """Prune each weight-level run's watermarked model at every sparsity; detect and measure perplexity."""
    ev = open_eval(eval_dir)
    prepare_out(out, {"eval": str(ev.path.resolve()), **config_dict(cfg)})
    runs, skipped = weight_runs(ev, cfg.methods, cfg.at_cost)
    base, tokenizer = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    n = min(cfg.n or len(ev.windows), len(ev.windows))
    windows = quality_windows(ev.cfg.corpus, tokenizer, cfg.ppl_windows, cfg.seq_len)
    rows, reached = [], {}
    for run in runs:
        method, eval_scores = load_method(ev, run, base), ev.scores(run)
        model = watermarked_copy(base, method)
        ppl = cached_perplexity(out / "ppl" / "watermarked" / f"{file_name(run['run'])}.json", model, windows)
        rows.append(attacked_row(run, eval_scores["watermarked"][:n], eval_scores, ppl, sparsity=0.0))
        norms = calibration_norms(model, tokenizer, cfg) if cfg.pruner == "wanda" else None
        for sparsity in cfg.sparsities:
            tag = f"{cfg.pruner}/s{sparsity:g}"
            pruned = copy.deepcopy(model)
            layers = prune_model(pruned, sparsity, cfg, norms)
            reached[tag] = {"min": min(layers.values()), "max": max(layers.values()), "layers": len(layers)}
            if progress:
                log.info("%s pruned (%s, %.0f%%): generating and scoring", run["run"], cfg.pruner, 100 * sparsity)
            scores = detect_attacked(out, tag, ev, run, method, base, tokenizer, pruned, n)
            ppl_s = cached_perplexity(out / "ppl" / tag / f"{file_name(run['run'])}.json", pruned, windows)
            rows.append(attacked_row(run, scores, eval_scores, ppl_s, sparsity=sparsity))
            del pruned
    summary = by_method(rows, (*DETECTION, "mean_score", "ppl"), extra=("sparsity",))
    for s in summary:
        s["pruner"] = cfg.pruner
    plot = tpr_and_ppl_plot(summary, "sparsity", "pruner", out / "prune_tpr.png", "sparsity", "pruning")
    results = {
        "settings": config_dict(cfg),
        "eval": str(ev.path),
        "n": n,
        "skipped": skipped,
        "sparsity_reached": reached,
        "runs": rows,
        "summary": summary,
    }
    publish(out, "prune", f"pruning ({cfg.pruner})", _section(ev, cfg, results), [plot], results, ev.path)
    return results


def _section(ev, cfg: PruneConfig, results: dict) -> list[str]:
    what = {
        "magnitude": "magnitude pruning (the smallest |W| of each layer)",
        "wanda": f"Wanda (|W| times the input norm, per output row; norms from {cfg.calibration_windows} windows of "
        f"`{cfg.calibration}`)",
    }[cfg.pruner]
    head_note = "lm_head pruned too (untied first)" if cfg.include_head else "lm_head and the embeddings kept"
    summary = [{**s, "setting": f"{s['sparsity']:.0%}"} for s in results["summary"]]
    lines = [
        f"Each weight-level watermarked model of `{ev.path}` was pruned with {what} in every linear layer of the "
        f"blocks, {head_note}, at sparsities {', '.join(f'{s:.0%}' for s in cfg.sparsities)} (0% is the watermarked "
        f"model). Each pruned model completed the first {results['n']} eval prompts; each method's unchanged "
        f"detector scored them with the original model. Quality: perplexity on {cfg.ppl_windows} held-out windows "
        f"of {cfg.seq_len} tokens of the eval's corpus. {negatives_note(ev)} Cells: mean ± sd over seeds."
        + cost_note(ev, cfg.at_cost, results["runs"]),
        *titled_tables(
            lambda metric: setting_table(summary, "setting", metric, 2 if metric == "ppl" else 3),
            (*DETECTION_TABLES, ("Mean detector score:", "mean_score"), ("Held-out perplexity:", "ppl")),
        ),
    ]
    if results["skipped"]:
        lines += ["", f"Skipped: {', '.join(results['skipped'])} (decode-time watermarks are not in the weights)."]
    return lines
