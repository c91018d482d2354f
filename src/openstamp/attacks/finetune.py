"""Fine-tuning durability: keep training the watermarked model on text; detect with the unchanged key.

The paper's setup (Appendix, "Fine-tuning setup details"), scaled to a CPU: LoRA with rank 16,
alpha 32 and dropout 0.1 on every linear layer of the blocks plus the unembedding (lm_head),
Adafactor with linear warm-up (the paper: 500 of 2,500 steps) and cosine decay. The paper's
batch of 48 x 512 tokens and 2,500 steps (~60M tokens) become options; the report states the
tokens seen. ``mode="full"`` trains every weight, ``mode="head"`` only lm_head (untied first).

Every ``every`` steps the model generates completions of the eval prompts (same sampling seeds
as the eval run) and each method's detector scores them with the original model. Decode-time
watermarks (KGW) do not live in the weights, so they are skipped with a note.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

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
from openstamp.corpus import Document, load_documents, split_documents
from openstamp.evaluation.pipeline import generate_set
from openstamp.methods import REGISTRY
from openstamp.models import load_model, model_device
from openstamp.patch import head, untie
from openstamp.storage import read_json
from openstamp.text import bos_prefix, encode

log = logging.getLogger(__name__)
MODES = ("lora", "full", "head")


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig:
    mode: str = option("lora", "lora (the paper's attack), full (every weight) or head (lm_head only)")
    corpus: str = option("wikipedia", "training text (packaged name, local file or hf: spec)")
    part: str = option("key", "hash half of the corpus to train on: key, heldout or all")
    steps: int = option(300, "optimizer steps (the paper: 2,500)")
    every: int = option(50, "generate and detect after every this many steps (the paper: 500)")
    batch_size: int = option(4, "sequences per step (the paper: 48)")
    seq_len: int = option(128, "tokens per sequence (the paper: 512)")
    lr: float = option(1e-4, "peak learning rate (the paper: 2e-5 over 60M tokens)")
    optimizer: str = option("adafactor", "adafactor (the paper's) or adamw")
    warmup_fraction: float = option(0.2, "fraction of the steps with a linear warm-up (the paper: 500 / 2,500)")
    lora_r: int = option(16, "LoRA rank")
    lora_alpha: int = option(32, "LoRA scaling factor alpha")
    lora_dropout: float = option(0.1, "LoRA dropout")
    n: int = option(64, "eval prompts completed and scored at each checkpoint")
    seed: int = option(0, "seed for the order of the training windows and for dropout")
    methods: tuple[str, ...] | None = option(None, "methods to attack (default: every weight-level method of the run)")

    def __post_init__(self) -> None:
        check(self.mode in MODES, f"mode must be one of {MODES}")
        check(self.part in ("key", "heldout", "all"), "part must be key, heldout or all")
        check(self.steps >= 1 and 1 <= self.every <= self.steps, "need steps >= 1 and 1 <= every <= steps")
        check(self.batch_size >= 1 and self.seq_len >= 8, "need batch_size >= 1 and seq_len >= 8")
        check(self.lr > 0 and 0 <= self.warmup_fraction < 1, "need lr > 0 and warmup_fraction in [0, 1)")
        check(self.optimizer in ("adafactor", "adamw"), "optimizer must be adafactor or adamw")
        check(self.lora_r >= 1 and 0 <= self.lora_dropout < 1, "need lora_r >= 1 and lora_dropout in [0, 1)")
        check(self.n >= 2, "n must be >= 2")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def checkpoints(self) -> list[int]:
        return sorted({0, *range(self.every, self.steps + 1, self.every), self.steps})


def training_windows(tokenizer: PreTrainedTokenizerBase, documents: list[Document], seq_len: int) -> torch.Tensor:
    """Consecutive full windows of every document, BOS first: long (N, seq_len)."""
    prefix = bos_prefix(tokenizer)
    body = seq_len - len(prefix)
    rows = [
        prefix + ids[start : start + body]
        for ids in encode(tokenizer, [d.text for d in documents])
        for start in range(0, len(ids) - body + 1, body)
    ]
    if not rows:
        raise ValueError(f"no document holds {seq_len} tokens; lower seq_len or use a longer corpus")
    return torch.tensor(rows, dtype=torch.long)


def lora_targets(model: PreTrainedModel) -> list[str]:
    """Names of the linear layers inside the decoder blocks, plus the unembedding's name."""
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.get_decoder().layers.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    names.add(next(name for name, module in model.named_modules() if module is head(model)))
    return sorted(names)


def prepare(model: PreTrainedModel, cfg: FinetuneConfig) -> PreTrainedModel:
    """Make the weights of ``cfg.mode`` trainable; LoRA wraps the model with peft (rank, alpha, dropout)."""
    if cfg.mode == "lora":
        from peft import LoraConfig, get_peft_model

        model.requires_grad_(False)
        lora = LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, target_modules=lora_targets(model)
        )
        return get_peft_model(model, lora)
    if cfg.mode == "head":
        untie(model)
        model.requires_grad_(False)
        head(model).requires_grad_(True)  # its weight, and its bias where it has one
        return model
    return model.requires_grad_(True)


def _optimizer(params: list[torch.nn.Parameter], cfg: FinetuneConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    from transformers.optimization import Adafactor

    return Adafactor(params, lr=cfg.lr, scale_parameter=False, relative_step=False, warmup_init=False)


def train(
    model: PreTrainedModel,
    windows: torch.Tensor,
    cfg: FinetuneConfig,
    on_checkpoint: Callable[[int, float], None] | None = None,
) -> list[float]:
    """Causal-LM training on ``windows`` (N, T) for ``cfg.steps`` steps; returns the per-step losses.

    ``on_checkpoint(step, mean loss since the last checkpoint)`` runs at step 0 and at every
    checkpoint with the model in eval mode; the RNG state is restored around it, so training
    does not depend on what the callback does (a resumed run replays the same steps).
    """
    from transformers import get_cosine_schedule_with_warmup

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _optimizer(params, cfg)
    schedule = get_cosine_schedule_with_warmup(optimizer, int(cfg.warmup_fraction * cfg.steps), cfg.steps)
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    order = torch.empty(0, dtype=torch.long)
    device, losses, checkpoints = model_device(model), [], set(cfg.checkpoints())

    def checkpoint(step: int) -> None:
        if on_checkpoint is not None and step in checkpoints:
            model.eval()
            state = torch.get_rng_state()
            recent = losses[-cfg.every :] if losses else [float("nan")]
            on_checkpoint(step, float(np.mean(recent)))
            torch.set_rng_state(state)

    checkpoint(0)
    for step in range(1, cfg.steps + 1):
        while len(order) < cfg.batch_size:
            order = torch.cat([order, torch.randperm(len(windows), generator=generator)])
        batch, order = windows[order[: cfg.batch_size]].to(device), order[cfg.batch_size :]
        model.train()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        checkpoint(step)
    model.eval()
    return losses


def run_finetune(eval_dir: Path, out: Path, cfg: FinetuneConfig, progress: bool = True) -> dict:
    """Fine-tune each weight-level run's watermarked model; detect at every checkpoint; plot TPR vs steps."""
    ev = open_eval(eval_dir)
    prepare_out(out, {"eval": str(ev.path.resolve()), **config_dict(cfg)})
    runs = select_runs(ev, cfg.methods)
    skipped = sorted({r["method"] for r in runs if not REGISTRY[r["method"]].weight_level})
    runs = [r for r in runs if r["method"] not in skipped]
    base, tokenizer = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    n = min(cfg.n, len(ev.windows))
    windows = None
    rows = []
    for run in runs:
        losses_path = out / "losses" / f"{file_name(run['run'])}.json"
        if not losses_path.exists():
            if windows is None:
                windows = training_windows(
                    tokenizer, split_documents(load_documents(cfg.corpus), cfg.part), cfg.seq_len
                )
            cached_json(losses_path, _attack_run, ev, run, base, tokenizer, windows, n, cfg, out, progress)
        losses = read_json(losses_path, "loss record")
        eval_scores = ev.scores(run)
        for step in cfg.checkpoints():
            if step == 0:  # the eval run's own completions: same model, prompts and seeds
                scores = eval_scores["watermarked"][:n]
            else:
                scores = read_json(_scores_path(out, run, step), "checkpoint scores")
            metrics = attacked_metrics(scores, eval_scores)
            rows.append(
                {
                    **{k: run[k] for k in ("run", "method", "strength", "seed")},
                    "step": step,
                    "tokens": step * cfg.tokens_per_step,
                    "train_loss": losses.get(str(step)),
                    **{k: metrics[k] for k in ("auroc", "tpr_at_1pct_fpr", "tpr_at_0.1pct_fpr")},
                    # TPR saturates at small scale; the mean score shows how much signal is left
                    "mean_score": float(np.mean([s["score"] for s in scores if s["score"] is not None])),
                }
            )
    summary = by_method(
        rows, ("auroc", "tpr_at_1pct_fpr", "tpr_at_0.1pct_fpr", "mean_score", "train_loss"), extra=("step",)
    )
    plot = _durability_plot(summary, cfg, out / "finetune_tpr.png")
    body = _section(ev, cfg, n, summary, skipped, windows)
    results = {
        "settings": config_dict(cfg),
        "eval": str(ev.path),
        "n": n,
        "skipped": skipped,
        "runs": rows,
        "summary": summary,
    }
    publish(out, "finetune", f"fine-tuning durability ({cfg.mode})", body, [plot], results, ev.path)
    return results


def _scores_path(out: Path, run: dict, step: int) -> Path:
    return out / "scores" / file_name(run["run"]) / f"step{step:05d}.json"


def _attack_run(ev, run, base, tokenizer, windows, n, cfg: FinetuneConfig, out: Path, progress: bool) -> dict:
    """Train one run's watermarked copy; generate and score at each checkpoint. Returns {step: loss}."""
    method = load_method(ev, run, base)
    model = prepare(watermarked_copy(base, method), cfg)
    prompts, losses = ev.prompts(n), {}

    def on_checkpoint(step: int, loss: float) -> None:
        losses[str(step)] = None if step == 0 else loss
        path = _scores_path(out, run, step)
        if step == 0 or path.exists():
            return
        if progress:
            log.info("%s after %d %s steps: generating and scoring", run["run"], step, cfg.mode)
        ids = generate_set(
            out, f"{run['run']}/step{step:05d}", model, tokenizer, prompts, ev.cfg, run["seed"], None, False
        )
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        cached_json(path, score_texts, method, base, tokenizer, texts, ev.cfg.score_batch_size)

    if progress:
        log.info("fine-tuning %s (%s, %d steps)", run["run"], cfg.mode, cfg.steps)
    train(model, windows, cfg, on_checkpoint)
    return losses


def _durability_plot(summary: list[dict], cfg: FinetuneConfig, path: Path) -> Path:
    fig, ax = new_figure(5.5, 4.0)
    for method in dict.fromkeys(s["method"] for s in summary):
        points = [s for s in summary if s["method"] == method]
        mean = np.array([s["tpr_at_1pct_fpr"]["mean"] or 0.0 for s in points])
        sd = np.array([s["tpr_at_1pct_fpr"]["sd"] or 0.0 for s in points])
        steps = [s["step"] for s in points]
        ax.plot(steps, mean, "o-", label=method)
        ax.fill_between(steps, mean - sd, mean + sd, alpha=0.15)
    ax.set(
        ylim=(-0.02, 1.02),
        xlabel=f"{cfg.mode} fine-tuning steps ({cfg.tokens_per_step:,} tokens each)",
        ylabel="TPR @ 1% FPR (human negatives)",
        title="detectability under fine-tuning",
    )
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _section(ev, cfg: FinetuneConfig, n: int, summary: list[dict], skipped: list[str], windows) -> list[str]:
    steps = cfg.checkpoints()
    what = {
        "lora": f"LoRA (rank {cfg.lora_r}, alpha {cfg.lora_alpha}, dropout {cfg.lora_dropout}) on every linear layer "
        "of the blocks and on lm_head",
        "full": "full fine-tuning of every weight",
        "head": "fine-tuning of lm_head only (untied from the input embeddings)",
    }[cfg.mode]
    pool = f"{len(windows):,} windows" if windows is not None else "windows"
    lines = [
        f"Each weight-level watermarked model of `{ev.path}` was trained further with {what}, on `{cfg.corpus}` "
        f"({cfg.part} part; {pool} of {cfg.seq_len} tokens): {cfg.optimizer}, peak learning rate {cfg.lr:g}, "
        f"{cfg.warmup_fraction:.0%} linear warm-up then cosine decay, batch {cfg.batch_size} x {cfg.seq_len} tokens. "
        f"Scale: {cfg.steps} steps = {cfg.steps * cfg.tokens_per_step:,} tokens seen (the paper: 2,500 steps, about "
        f"60M tokens). At each checkpoint the model completed the first {n} eval prompts (the eval's sampling seeds) "
        "and each method's unchanged detector scored them with the original model; step 0 is the eval run's own "
        f"completions. {negatives_note(ev)} Cells: mean ± sd over seeds.",
        "",
        "TPR@1%FPR:",
        "",
        *_step_table(summary, steps, "tpr_at_1pct_fpr"),
        "",
        "AUROC:",
        "",
        *_step_table(summary, steps, "auroc"),
        "",
        "Mean detector score of the completions (each method's own statistic: mean LLR for OpenStamp, z-score for "
        "Unremovable and GaussMark):",
        "",
        *_step_table(summary, steps, "mean_score"),
    ]
    if skipped:
        lines += [
            "",
            f"Skipped: {', '.join(skipped)} (decode-time watermarks live in the generation call, not in the weights).",
        ]
    return lines


def _step_table(summary: list[dict], steps: list[int], key: str) -> list[str]:
    rows = []
    for method in dict.fromkeys(s["method"] for s in summary):
        cells = {s["step"]: fmt(s[key]) for s in summary if s["method"] == method}
        rows.append([method, *[cells.get(step, "-") for step in steps]])
    return md_table(["method", *[f"step {s}" for s in steps]], rows)
