"""Prompt independence: the same text's per-token LLR scored with its prompt and without it.

Detection takes no prompt. The paper argues this works because the hidden states, and so the
green-list selection, depend mainly on the local context. For every OpenStamp run of an eval
(its watermarked completions, and the unwatermarked ones of the same prompts), each completion's
token ids are scored twice with the run's key: after BOS alone, and after BOS and its prompt.
Per token position t (aligned at the text's end: without a prompt, a tokenizer without BOS uses the
first token as context) the report gives the mean |llr_with(t) - llr_without(t)|; per text, the mean
scores both ways, their correlation, and the share flagged at p <= 0.01 both ways.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from openstamp.detect.detector import DetectConfig, Detector
from openstamp.detect.plots import new_figure, save_figure
from openstamp.lab.analysis import write_results
from openstamp.lab.attacks.common import load_method, open_eval
from openstamp.model.load import load_model

KEYED = ("openstamp", "openstamp-nosem")  # the methods whose key is a WatermarkKey


def position_gap(with_prompt: list[list[float]], without: list[list[float]]) -> tuple[int, np.ndarray]:
    """(first position, mean over texts of |difference| of the per-token scores at each position from it).

    Both lists score a text's last tokens: without a prompt, a text's first token(s) may serve as
    its context (a tokenizer without BOS), so the two are aligned at the end. Positions count the
    completion's tokens from 0; the first is the earliest position scored both ways.
    """
    length = max(len(a) for a in with_prompt)
    gaps = np.full((len(with_prompt), length), np.nan)
    for i, (a, b) in enumerate(zip(with_prompt, without, strict=True)):
        n = min(len(a), len(b))
        if n:
            gaps[i, len(a) - n : len(a)] = np.abs(np.asarray(a[len(a) - n :]) - np.asarray(b[len(b) - n :]))
    scored = np.nonzero(~np.isnan(gaps).all(axis=0))[0]
    first = int(scored[0]) if len(scored) else 0
    return first, np.nanmean(gaps[:, first:], axis=0) if len(scored) else np.array([])


def compare(with_prompt: list, without: list) -> dict:
    """Per-text agreement of two lists of DetectionResults (the same texts, with and without prompts)."""
    pairs = [(a, b) for a, b in zip(with_prompt, without, strict=True) if a.score is not None and b.score is not None]
    a = np.array([p[0].score for p in pairs])
    b = np.array([p[1].score for p in pairs])
    first, gap = position_gap([p[0].token_scores for p in pairs], [p[1].token_scores for p in pairs])
    return {
        "texts": len(pairs),
        "mean_score_with_prompt": float(a.mean()),
        "mean_score_without": float(b.mean()),
        "correlation": float(np.corrcoef(a, b)[0, 1]) if len(pairs) > 2 else None,
        "mean_abs_difference": float(np.abs(a - b).mean()),
        "flagged_with_prompt": float(np.mean([p[0].p_value <= 0.01 for p in pairs])),
        "flagged_without": float(np.mean([p[1].p_value <= 0.01 for p in pairs])),
        "gap_first_position": first,
        "gap_by_position": gap.tolist(),
    }


def run_prompt(eval_dir, out, n: int | None = None, batch_size: int = 16) -> dict:
    """Score every OpenStamp run's completions (and the unwatermarked ones) with and without their prompts."""
    ev, out = open_eval(eval_dir), Path(out)
    runs = [r for r in ev.runs if r["method"] in KEYED]
    if not runs:
        raise ValueError(f"{eval_dir} has no run of {' or '.join(KEYED)}; prompt independence needs one")
    base, tokenizer = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    count = min(n or len(ev.windows), len(ev.windows))
    prompts = ev.prompts(count)
    rows = []
    for run in runs:
        key = load_method(ev, run, base).key
        detector = Detector(base, tokenizer, key, DetectConfig(batch_size=batch_size))
        sets = {
            "watermarked": ev.generations(run)[:count],
            "unwatermarked": ev.unwatermarked(run["seed"])[:count],
        }
        for name, ids in sets.items():
            with_prompt = detector.detect(ids, prompts, token_scores=True)
            without = detector.detect(ids, token_scores=True)
            rows.append({"run": run["run"], "text": name, **compare(with_prompt, without)})
    results = {"command": "openstamp analyze prompt", "eval": str(ev.path), "n": count, "rows": rows}
    return write_results(out, results, "prompt.png", lambda path: plot(rows, path))


def plot(rows: list[dict], path: Path) -> None:
    """Mean |per-token LLR with prompt - without| against the token's position, per run and text set."""
    fig, ax = new_figure(6, 4)
    for row in rows:
        gap = np.asarray(row["gap_by_position"], dtype=float)
        positions = np.arange(len(gap)) + row["gap_first_position"] + 1  # 1-based, for the log axis
        ax.plot(positions, gap, label=f"{row['run'].split('/')[0]}, {row['text']}")
    ax.set(
        xscale="log", xlabel="token position in the completion (1 = first)", ylabel="mean |LLR with prompt - without|"
    )
    ax.set_title("prompt independence of per-token scores")
    ax.legend(fontsize=7)
    save_figure(fig, path)
