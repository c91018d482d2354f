"""Fine-tuning durability: keep training the watermarked model on text; detect with the unchanged key.

The paper's setup (Appendix, "Fine-tuning setup details"), scaled to a CPU: LoRA with rank 16,
alpha 32 and dropout 0.1 on every linear layer of the blocks plus the unembedding (lm_head),
Adafactor with linear warm-up (the paper: 500 of 2,500 steps) and cosine decay. The paper's
batch of 48 x 512 tokens and 2,500 steps (~60M tokens) become options; the report states the
tokens seen. ``mode="full"`` trains every weight, ``mode="head"`` only lm_head (untied first).

The training loop lives in openstamp.lab.training (shared with the instruction-tuning attack).
Every ``every`` steps the model generates completions of the eval prompts (same sampling seeds
as the eval run) and each method's detector scores them with the original model. Decode-time
watermarks (KGW) do not live in the weights, so they are skipped with a note.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from openstamp.config import check, option
from openstamp.corpus import load_documents, split_documents
from openstamp.lab.attacks.common import (
    AT_COST_HELP,
    DETECTION,
    attacked_metrics,
    by_method,
    cached_json,
    check_at_cost,
    config_dict,
    cost_note,
    detection_fields,
    file_name,
    load_method,
    open_eval,
    prepare_out,
    score_texts,
    watermarked_copy,
)
from openstamp.lab.attacks.report import (
    DETECTION_TABLES,
    fmt,
    md_table,
    negatives_note,
    new_figure,
    publish,
    save_figure,
    titled_tables,
)
from openstamp.lab.attacks.weights import weight_runs
from openstamp.lab.evaluation.pipeline import generate_set
from openstamp.lab.training import TrainConfig, prepare, train, training_windows
from openstamp.model.load import load_model
from openstamp.storage import read_json

log = logging.getLogger(__name__)
__all__ = ["FinetuneConfig", "attack_run", "checkpoint_rows", "prepare", "run_finetune", "train", "training_windows"]


@dataclass(frozen=True, kw_only=True)
class FinetuneConfig(TrainConfig):
    """The shared training settings (openstamp.lab.training.TrainConfig) plus the plain-text corpus."""

    corpus: str = option("wikipedia", "training text (packaged name, local file or hf: spec)")
    part: str = option("key", "hash half of the corpus to train on: key, heldout or all")
    at_cost: float | None = option(None, AT_COST_HELP)

    def __post_init__(self) -> None:
        super().__post_init__()
        check(self.part in ("key", "heldout", "all"), "part must be key, heldout or all")
        check_at_cost(self.at_cost)


def run_finetune(eval_dir: Path, out: Path, cfg: FinetuneConfig, progress: bool = True) -> dict:
    """Fine-tune each weight-level run's watermarked model; detect at every checkpoint; plot TPR vs steps."""
    ev = open_eval(eval_dir)
    prepare_out(out, {"eval": str(ev.path.resolve()), **config_dict(cfg)})
    runs, skipped = weight_runs(ev, cfg.methods, cfg.at_cost)
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
            cached_json(losses_path, attack_run, ev, run, base, tokenizer, (windows, None), n, cfg, out, progress)
        rows += checkpoint_rows(ev, run, out, cfg, n, read_json(losses_path, "loss record"))
    summary = by_method(rows, (*DETECTION, "mean_score", "train_loss"), extra=("step",))
    plot = durability_plot(summary, cfg, out / "finetune_tpr.png")
    body = _section(ev, cfg, n, summary, skipped, windows, rows)
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


def scores_path(out: Path, run: dict, step: int) -> Path:
    return out / "scores" / file_name(run["run"]) / f"step{step:05d}.json"


def attack_run(ev, run, base, tokenizer, data: tuple, n: int, cfg: TrainConfig, out: Path, progress: bool) -> dict:
    """Train one run's watermarked copy on ``data`` = (windows, labels or None); generate and score
    at each checkpoint (the eval's prompts and sampling seeds). Returns {step: recent mean loss}."""
    method = load_method(ev, run, base)
    model = prepare(watermarked_copy(base, method), cfg)
    prompts, losses = ev.prompts(n), {}

    def on_checkpoint(step: int, loss: float) -> None:
        losses[str(step)] = None if step == 0 else loss
        path = scores_path(out, run, step)
        if step == 0 or path.exists():
            return
        if progress:
            log.info("%s after %d %s steps: generating and scoring", run["run"], step, cfg.mode)
        ids = generate_set(
            out, f"{run['run']}/step{step:05d}", model, tokenizer, prompts, ev.cfg, run["seed"], None, False
        )
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        cached_json(path, score_texts, method, base, tokenizer, texts, ev.cfg)

    if progress:
        log.info("training %s (%s, %d steps)", run["run"], cfg.mode, cfg.steps)
    windows, labels = data
    train(model, windows, cfg, on_checkpoint, labels, desc=f"training {run['run']}", progress=progress)
    return losses


def checkpoint_rows(ev, run: dict, out: Path, cfg: TrainConfig, n: int, losses: dict) -> list[dict]:
    """One row per checkpoint: detection against the eval's negatives, mean score, training loss.

    Step 0 is the eval run's own completions (same model, prompts and seeds).
    """
    eval_scores, rows = ev.scores(run), []
    for step in cfg.checkpoints():
        scores = eval_scores["watermarked"][:n] if step == 0 else read_json(scores_path(out, run, step), "scores")
        metrics = attacked_metrics(scores, eval_scores)
        rows.append(
            {
                **{k: run[k] for k in ("run", "method", "strength", "seed")},
                "step": step,
                "tokens": step * cfg.tokens_per_step,
                "train_loss": losses.get(str(step)),
                **detection_fields(metrics),
                # TPR saturates at small scale; the mean score shows how much signal is left
                "mean_score": float(np.mean([s["score"] for s in scores if s["score"] is not None])),
            }
        )
    return rows


def durability_plot(summary: list[dict], cfg: FinetuneConfig, path: Path) -> Path:
    """TPR@1%FPR against fine-tuning steps, a line per method with its seeds' spread. The legend sits at the lower
    left, where detection starts high: matplotlib's default ("best") searches every point and warns when slow."""
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
    ax.legend(fontsize=8, loc="lower left")
    return save_figure(fig, path)


def _section(
    ev, cfg: FinetuneConfig, n: int, summary: list[dict], skipped: list[str], windows, rows: list[dict]
) -> list[str]:
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
        f"completions. {negatives_note(ev)} Cells: mean ± sd over seeds.{cost_note(ev, cfg.at_cost, rows)}",
        *titled_tables(
            lambda metric: step_table(summary, steps, metric),
            (
                *DETECTION_TABLES,
                ("AUROC:", "auroc"),
                (
                    "Mean detector score of the completions (each method's own statistic: mean LLR for OpenStamp, "
                    "z-score for Unremovable and GaussMark):",
                    "mean_score",
                ),
            ),
        ),
    ]
    if skipped:
        lines += [
            "",
            f"Skipped: {', '.join(skipped)} (decode-time watermarks live in the generation call, not in the weights).",
        ]
    return lines


def step_table(summary: list[dict], steps: list[int], key: str) -> list[str]:
    rows = []
    for method in dict.fromkeys(s["method"] for s in summary):
        cells = {s["step"]: fmt(s[key]) for s in summary if s["method"] == method}
        rows.append([method, *[cells.get(step, "-") for step in steps]])
    return md_table(["method", *[f"step {s}" for s in steps]], rows)
