"""Model merging: average the watermarked model with another model (the base or a fine-tune).

People merge open weights all the time. The other model (``with_model``) defaults to the
original base, which is the strongest dilution: every merge pulls U~ = U + dW back towards U.

The formulas are mergekit's (v0.1.5), applied per tensor by name, in plain torch. mergekit
installs next to torch 2.13 / transformers 5.23, but it is a disk-to-disk pipeline (YAML config,
sharded checkpoints in, a model directory out) with its own dependencies; the attack merges
in memory at several t per run, so it reimplements the per-tensor maths (t = weight of the
other model; t = 0 is the watermarked model, t = 1 the other):

* linear: (1 - t) a + t b.
* slerp: on flattened float32 copies, a^ = a / |a|, b^ = b / |b| (a norm <= eps counts as 1),
  d = clamp(a^ . b^, -1, 1); if |d| > 0.9995, lerp; else theta = acos d and
  sin((1 - t) theta) / sin(theta) a + sin(t theta) / sin(theta) b.
* ties and dare_ties, against the base (task vectors tau_i = W_i - base, weights w = (1 - t, t)):
  sparsify each tau_i (ties: keep the top max(1, floor(density n)) entries by |tau|; dare:
  keep each with probability density, then rescale to the same L1 norm), scale by w_i, elect
  the sign of sum_i w_i tau_i (>= 0 is +), keep the entries that agree with it, and add
  sum / (sum of the agreeing weights) (ties: the disjoint mean) or the plain sum (dare_ties,
  mergekit's default normalize=False) to the base.

A bias the other model (or the base) lacks counts as zero: Unremovable adds a bias to lm_head.
A tied model shares embed_tokens and lm_head; merging by parameter name keeps the tie (the one
tensor is merged once). If only the other model is untied, the release is untied first so that
its head is merged with the other head, and the report says so.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel

from openstamp.config import check, option
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
from openstamp.model.load import load_model
from openstamp.model.patch import head, is_tied, untie

log = logging.getLogger(__name__)
MERGES = ("linear", "slerp", "ties", "dare_ties")
INTERPOLATIONS = ("linear", "slerp")


@dataclass(frozen=True, kw_only=True)
class MergeConfig:
    with_model: str | None = option(None, "the model merged in (default: the eval's base model); id, dir or alias")
    merges: tuple[str, ...] = option(MERGES, f"merge methods among {MERGES}")
    t: tuple[float, ...] = option((0.1, 0.3, 0.5, 0.7), "weights of the other model for linear and slerp")
    task_t: float = option(0.5, "weight of the other model for ties and dare_ties (the watermarked one: 1 - t)")
    density: float = option(0.5, "fraction of each task vector kept by ties and dare_ties")
    seed: int = option(0, "seed of DARE's random drops")
    n: int | None = option(None, "eval prompts completed per setting (default: all)")
    ppl_windows: int = option(16, "held-out windows for perplexity")
    seq_len: int = option(128, "tokens per perplexity window")
    methods: tuple[str, ...] | None = option(None, "methods to attack (default: every weight-level method of the run)")
    at_cost: float | None = option(None, AT_COST_HELP)

    def __post_init__(self) -> None:
        check(len(self.merges) >= 1 and set(self.merges) <= set(MERGES), f"merges must be among {MERGES}")
        check(len(self.t) >= 1 and all(0 <= t <= 1 for t in self.t), "every t must lie in [0, 1]")
        check(0 <= self.task_t <= 1, "task_t must lie in [0, 1]")
        check(0 < self.density <= 1, "density must lie in (0, 1]")
        check(self.n is None or self.n >= 2, "n must be >= 2")
        check(self.ppl_windows >= 1 and self.seq_len >= 8, "need ppl_windows >= 1 and seq_len >= 8")
        check_at_cost(self.at_cost)

    def settings(self) -> list[tuple[str, float]]:
        """Every (merge, t) the attack runs: the t grid for linear and slerp, task_t for the others."""
        return [(m, t) for m in self.merges for t in (self.t if m in INTERPOLATIONS else (self.task_t,))]


# -- per-tensor formulas ---------------------------------------------------------------------------


def lerp(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """(1 - t) a + t b, any shape; exact at t = 0 and t = 1."""
    return ((1 - t) * a.float() + t * b.float()).to(a.dtype)


def slerp(a: torch.Tensor, b: torch.Tensor, t: float, dot_threshold: float = 0.9995, eps: float = 1e-8) -> torch.Tensor:
    """Spherical interpolation of two same-shape tensors as flat vectors (mergekit's), lerp when colinear."""
    work = torch.float64 if a.dtype == torch.float64 else torch.float32
    x, y = a.reshape(-1).to(work), b.reshape(-1).to(work)
    norm_x, norm_y = x.norm(), y.norm()
    norm_x = torch.where(norm_x > eps, norm_x, 1)
    norm_y = torch.where(norm_y > eps, norm_y, 1)
    dot = float(((x / norm_x) * (y / norm_y)).sum().clamp(-1, 1))
    if abs(dot) > dot_threshold:
        return lerp(a, b, t)
    theta = torch.acos(torch.tensor(dot, dtype=work))
    coef_a, coef_b = torch.sin((1 - t) * theta) / torch.sin(theta), torch.sin(t * theta) / torch.sin(theta)
    return (coef_a * x + coef_b * y).reshape(a.shape).to(a.dtype)


def sparsify(tau: torch.Tensor, density: float, how: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """ties: keep the max(1, floor(density n)) largest |tau|; dare: Bernoulli(density) drops, L1 rescaled."""
    if density >= 1:
        return tau
    if how == "magnitude":
        k = max(1, int(density * tau.numel()))
        mask = torch.zeros(tau.numel(), dtype=tau.dtype)
        mask[torch.argsort(tau.abs().reshape(-1).float(), descending=True)[:k]] = 1
        return tau * mask.reshape(tau.shape)
    kept = tau * torch.bernoulli(torch.full(tau.shape, density), generator=generator).to(tau.dtype)
    before, after = tau.abs().sum(), kept.abs().sum()
    return kept if before < 1e-7 or after < 1e-7 else kept * (before / after)


def task_merge(
    base: torch.Tensor,
    tensors: list[torch.Tensor],
    weights: list[float],
    density: float,
    how: str,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """TIES (``how="ties"``) or DARE-TIES (``"dare_ties"``) of ``tensors`` against ``base``, all one shape."""
    check(how in ("ties", "dare_ties"), "how must be ties or dare_ties")
    sparsified = [
        sparsify(t.float() - base.float(), density, "magnitude" if how == "ties" else "random", generator)
        for t in tensors
    ]
    w = torch.tensor(weights, dtype=torch.float32).reshape(-1, *([1] * base.dim()))
    deltas = torch.stack(sparsified) * w
    majority = torch.where(deltas.sum(0) >= 0, 1.0, -1.0)
    agree = (deltas.sign() == majority).float()
    mixed = (deltas * agree).sum(0)
    if how == "ties":  # mergekit's normalize=True: the disjoint mean
        divisor = (w * agree).sum(0)
        mixed = mixed / torch.where(divisor == 0, 1.0, divisor)
    return (base.float() + mixed).to(base.dtype)


# -- whole models ----------------------------------------------------------------------------------


def check_compatible(release: PreTrainedModel, other: PreTrainedModel, name: str = "the --with model") -> None:
    """Refuse a model whose vocabulary or any parameter shape differs from the release's."""
    if tuple(head(release).weight.shape) != tuple(head(other).weight.shape):
        raise ValueError(
            f"{name} has an unembedding of shape {tuple(head(other).weight.shape)}; the release's is "
            f"{tuple(head(release).weight.shape)} (a different vocabulary or width cannot be merged)"
        )
    theirs = dict(other.named_parameters(remove_duplicate=False))
    for key, p in release.named_parameters(remove_duplicate=False):
        if key not in theirs and key.endswith("bias"):
            continue  # a model without this bias has a zero bias (Unremovable adds one to lm_head)
        if key not in theirs or theirs[key].shape != p.shape:
            found = tuple(theirs[key].shape) if key in theirs else "missing"
            raise ValueError(f"{name} does not match the release at {key}: {found} vs {tuple(p.shape)}")


def _counterpart(named: dict[str, torch.Tensor], key: str, like: torch.Tensor) -> torch.Tensor:
    """The other model's tensor named ``key``; zeros for a bias it does not have."""
    return named[key] if key in named else torch.zeros_like(like)


@torch.no_grad()
def merge_models(
    model: PreTrainedModel,
    other: PreTrainedModel,
    how: str,
    t: float,
    base: PreTrainedModel | None = None,
    density: float = 1.0,
    seed: int = 0,
) -> dict:
    """Merge ``other`` into ``model`` in place, tensor by tensor (``base`` for ties/dare_ties). Returns notes."""
    check(how in MERGES, f"merge must be one of {MERGES}")
    check(how in INTERPOLATIONS or base is not None, f"{how} needs the base model")
    check_compatible(model, other)
    untied = is_tied(model) and not is_tied(other) and untie(model)
    theirs = dict(other.named_parameters(remove_duplicate=False))
    origin = dict(base.named_parameters(remove_duplicate=False)) if base is not None else {}
    generator = torch.Generator().manual_seed(seed)
    for key, p in model.named_parameters():  # a tied tensor appears once, so it is merged once
        b = _counterpart(theirs, key, p)
        if how == "linear":
            p.copy_(lerp(p, b, t))
        elif how == "slerp":
            p.copy_(slerp(p, b, t))
        else:
            p.copy_(task_merge(_counterpart(origin, key, p), [p, b], [1 - t, t], density, how, generator))
    return {"untied": bool(untied), "tied": is_tied(model)}


def run_merge(eval_dir: Path, out: Path, cfg: MergeConfig, progress: bool = True) -> dict:
    """Merge each weight-level run's watermarked model with ``cfg.with_model`` at every setting; detect."""
    ev = open_eval(eval_dir)
    runs, skipped = weight_runs(ev, cfg.methods, cfg.at_cost)
    base, tokenizer = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    other = base if cfg.with_model is None else load_model(cfg.with_model, dtype=ev.cfg.dtype, device=ev.cfg.device)[0]
    check_compatible(base, other)  # before anything is written, so a corrected --with can reuse --out
    prepare_out(out, {"eval": str(ev.path.resolve()), **config_dict(cfg)})
    n = min(cfg.n or len(ev.windows), len(ev.windows))
    windows = quality_windows(ev.cfg.corpus, tokenizer, cfg.ppl_windows, cfg.seq_len)
    other_ppl = cached_perplexity(out / "ppl" / "with_model.json", other, windows)
    rows, notes = [], {}
    for run in runs:
        method, eval_scores = load_method(ev, run, base), ev.scores(run)
        model = watermarked_copy(base, method)
        ppl = cached_perplexity(out / "ppl" / "watermarked" / f"{file_name(run['run'])}.json", model, windows)
        for how in cfg.merges:
            rows.append(attacked_row(run, eval_scores["watermarked"][:n], eval_scores, ppl, merge=how, t=0.0))
        for how, t in cfg.settings():
            tag = f"{how}/t{t:g}"
            merged = copy.deepcopy(model)
            notes[how] = merge_models(merged, other, how, t, base, cfg.density, cfg.seed)
            if progress:
                log.info("%s merged (%s, t=%g): generating and scoring", run["run"], how, t)
            scores = detect_attacked(out, tag, ev, run, method, base, tokenizer, merged, n)
            ppl_t = cached_perplexity(out / "ppl" / tag / f"{file_name(run['run'])}.json", merged, windows)
            rows.append(attacked_row(run, scores, eval_scores, ppl_t, merge=how, t=t))
            del merged
    summary = by_method(rows, (*DETECTION, "mean_score", "ppl"), extra=("merge", "t"))
    plot = tpr_and_ppl_plot(summary, "t", "merge", out / "merge_tpr.png", "t (weight of the other model)", "merging")
    results = {
        "settings": config_dict(cfg),
        "eval": str(ev.path),
        "n": n,
        "with_model": cfg.with_model or ev.cfg.model,
        "with_model_ppl": other_ppl,
        "skipped": skipped,
        "notes": notes,
        "runs": rows,
        "summary": summary,
    }
    publish(out, "merge", "model merging", _section(ev, cfg, results), [plot], results, ev.path)
    return results


def _section(ev, cfg: MergeConfig, results: dict) -> list[str]:
    label = lambda s: "t=0 (watermarked)" if s["t"] == 0 else f"{s['merge']} t={s['t']:g}"  # noqa: E731
    summary = [{**s, "setting": label(s)} for s in results["summary"]]
    untied = [how for how, note in results["notes"].items() if note["untied"]]
    lines = [
        f"Each weight-level watermarked model of `{ev.path}` was merged with `{results['with_model']}` "
        f"(held-out perplexity {results['with_model_ppl']:.2f}) tensor by tensor, with mergekit's formulas: "
        f"linear and SLERP at t = {', '.join(f'{t:g}' for t in cfg.t)} (t is the other model's weight; t = 0 is "
        f"the watermarked model), TIES and DARE-TIES against the original base with weights ({1 - cfg.task_t:g}, "
        f"{cfg.task_t:g}) and density {cfg.density:g} (DARE seed {cfg.seed}). Each merged model completed the first "
        f"{results['n']} eval prompts; each method's unchanged detector scored them with the original model. "
        f"Quality: perplexity on {cfg.ppl_windows} held-out windows of {cfg.seq_len} tokens of the eval's corpus. "
        f"{negatives_note(ev)} Cells: mean ± sd over seeds." + cost_note(ev, cfg.at_cost, results["runs"]),
        *titled_tables(
            lambda metric: setting_table(summary, "setting", metric, 2 if metric == "ppl" else 3),
            (*DETECTION_TABLES, ("Mean detector score:", "mean_score"), ("Held-out perplexity:", "ppl")),
        ),
    ]
    if untied:
        lines += ["", "The release's tied head was untied before merging with the untied other model."]
    if results["skipped"]:
        lines += ["", f"Skipped: {', '.join(results['skipped'])} (decode-time watermarks are not in the weights)."]
    return lines
