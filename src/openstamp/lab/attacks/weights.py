"""What the weight-edit attacks (merging, pruning) share: held-out quality, detection, tables, plots.

Each attack turns a run's watermarked model into an attacked one at several settings (a merge
weight t, a sparsity). For each setting the attacked model completes the first ``n`` eval
prompts (the eval's sampling seeds) and the method's unchanged detector scores them with the
original model; quality is the attacked model's own perplexity on held-out windows of the
eval's prompt corpus, exp(mean next-token NLL), the measure the re-initialised-head attack
reports. Every setting's scores and perplexity are cached, so a killed run resumes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.corpus import load_corpora, split_documents
from openstamp.lab.attacks.common import (
    EvalRun,
    attacked_metrics,
    cached_json,
    detection_fields,
    file_name,
    mean_score,
    score_texts,
    select_runs,
)
from openstamp.lab.attacks.report import fmt, md_table, new_figure, save_figure
from openstamp.lab.evaluation.pipeline import generate_set
from openstamp.lab.methods import REGISTRY, Carrier, WatermarkMethod
from openstamp.lab.training import perplexity, training_windows
from openstamp.storage import read_json

log = logging.getLogger(__name__)


def weight_runs(
    ev: EvalRun, methods: tuple[str, ...] | None, at_cost: float | None = None
) -> tuple[list[dict], list[str]]:
    """The weight-level runs to attack (at equal cost with ``at_cost``: see ``select_runs``), and the decode-time
    methods skipped (their mark is not in the weights)."""
    runs = select_runs(ev, methods, at_cost)
    skipped = sorted({r["method"] for r in runs if REGISTRY[r["method"]].carrier is not Carrier.WEIGHTS})
    return [r for r in runs if r["method"] not in skipped], skipped


def quality_windows(
    corpus: str, tokenizer: PreTrainedTokenizerBase, count: int, seq_len: int, seed: int = 0
) -> torch.Tensor:
    """``count`` held-out windows (count, seq_len) of ``corpus`` (comma-separated specs; an eval's prompt corpora),
    chosen with ``seed``."""
    docs = load_corpora(corpus)
    windows = training_windows(tokenizer, split_documents(docs, "heldout"), seq_len)
    generator = torch.Generator().manual_seed(seed)
    return windows[torch.randperm(len(windows), generator=generator)[:count]]


def cached_perplexity(path: Path, model: PreTrainedModel, windows: torch.Tensor) -> float:
    return float(cached_json(path, lambda: perplexity(model, windows)))


def detect_attacked(
    out: Path,
    tag: str,
    ev: EvalRun,
    run: dict,
    method: WatermarkMethod,
    base: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    model: PreTrainedModel,
    n: int,
) -> list[dict]:
    """Complete the first ``n`` eval prompts with the attacked ``model``; score with the original ``base``."""
    path = scores_path(out, tag, run)
    if path.exists():
        return read_json(path, "scores")
    ids = generate_set(
        out, f"{tag}/{run['generations']}", model, tokenizer, ev.prompts(n), ev.cfg, run["seed"], None, False
    )
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    return cached_json(path, score_texts, method, base, tokenizer, texts, ev.cfg)


def scores_path(out: Path, tag: str, run: dict) -> Path:
    return out / "scores" / tag / f"{file_name(run['run'])}.json"


def attacked_row(run: dict, scores: list[dict], eval_scores: dict, ppl: float, **setting) -> dict:
    """One result row: the run, the setting, detection against the eval's negatives, mean score, perplexity."""
    metrics = attacked_metrics(scores, eval_scores)
    return {
        **{k: run[k] for k in ("run", "method", "strength", "seed")},
        **setting,
        **detection_fields(metrics),
        "mean_score": mean_score(scores),
        "ppl": ppl,
    }


def setting_table(summary: list[dict], column: str, key: str, digits: int = 3) -> list[str]:
    """Methods as rows, the values of ``column`` (a setting) as columns, ``key``'s mean ± sd as cells."""
    columns = list(dict.fromkeys(s[column] for s in summary))
    rows = []
    for method in dict.fromkeys(s["method"] for s in summary):
        cells = {s[column]: fmt(s[key], digits) for s in summary if s["method"] == method}
        rows.append([method, *[cells.get(c, "-") for c in columns]])
    return md_table(["method", *[str(c) for c in columns]], rows)


def tpr_and_ppl_plot(summary: list[dict], x: str, group: str, path: Path, xlabel: str, title: str) -> Path:
    """Two panels against the setting ``x``: TPR@1%FPR and held-out perplexity, a line per (method, group)."""
    fig, axes = new_figure(10.0, 4.0, ncols=2)
    lines = dict.fromkeys((s["method"], s[group]) for s in summary)
    for method, setting in lines:
        points = sorted((s for s in summary if (s["method"], s[group]) == (method, setting)), key=lambda s: s[x])
        xs = [s[x] for s in points]
        label = f"{method} {setting}"
        axes[0].plot(xs, [s["tpr_at_1pct_fpr"]["mean"] or 0.0 for s in points], "o-", label=label)
        axes[1].plot(xs, [s["ppl"]["mean"] or np.nan for s in points], "o-", label=label)
    axes[0].set(ylim=(-0.02, 1.02), xlabel=xlabel, ylabel="TPR @ 1% FPR (human negatives)", title=title)
    axes[1].set(xlabel=xlabel, ylabel="held-out perplexity", yscale="log", title="quality")
    axes[0].legend(fontsize=7)
    return save_figure(fig, path)
