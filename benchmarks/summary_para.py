"""The README's paraphrase detail: each method with and without the near-copies, per prompt."""

from __future__ import annotations

import json
from pathlib import Path

PROMPTS = {
    "paper": "the paper's prompt",
    "strong": "the strong prompt (the paper's, which also forbids copying more than three consecutive words)",
}


def paraphrase64(folder: Path, shown: str) -> list[str]:
    """The paraphrase64 stage's runs on its own eval (``folder``), then the earlier runs on the main eval's releases.

    ``shown`` is ``folder`` as the README links it.
    """
    out = []
    own, attack = folder / "results.json", _load(folder / "attacks")
    if own.exists() and attack:
        cfg = json.loads(own.read_text())["config"]
        lead = (
            "Paraphrase at larger n (`bash benchmarks/reference_runs.sh paraphrase64`), on its own eval "
            f"({cfg['n']} prompts of {cfg['prompt_tokens']} tokens, {cfg['new_tokens']} new tokens, each method at "
            f"its default strength; `{shown}/`; its KGW-distilled key was distilled in float32, before the "
            "distillation's bfloat16 autocast, though its recorded settings say bfloat16: the eval took a field "
            "added since at its new default, which it now refuses)"
        )
        out += paraphrase_detail(attack, f"{shown}/attacks", lead) + [""]
    if earlier := _load(folder / "main-eval"):
        lead = (
            "Earlier, on the main eval's releases (OpenStamp and no projection only, with keys an earlier session "
            f"built; `{shown}/main-eval/`)"
        )
        out += paraphrase_detail(earlier, f"{shown}/main-eval", lead) + [""]
    return out


def _load(folder: Path) -> dict:
    return {f.stem: json.loads(f.read_text()) for f in sorted(folder.glob("*.json"))}


def paraphrase_detail(attack: dict, figures: str, lead: str) -> list[str]:
    """Every paraphrase run that recorded detection without its near-copies (``real``), one row per prompt and method.

    ``lead`` says which eval's releases were paraphrased; ``figures`` is the folder of the runs' plots.

    The projection's effect is OpenStamp against openstamp-nosem on the same paraphraser and prompt:
    with near-copies left out, neither is credited for text the paraphraser did not rewrite.
    """
    runs = {name: a for name, a in attack.items() if a.get("attack") == "paraphrase" and _has_real(a)}
    if not runs:
        return []
    first = next(iter(runs.values()))["settings"]
    prompts = sorted({a["settings"].get("prompt", "paper") for a in runs.values()})
    rows = [
        f"{lead}: `{first['paraphraser']}`, {' and '.join(PROMPTS[p] for p in prompts)}. "
        f"TPR@1%FPR against the eval's human continuations (AUROC), first on every paraphrase, "
        f"then on those that are not near-copies (keeping less than {first['near_copy']:g} of the original's "
        "token 3-grams), with an exact 95% interval, and the mean detector score of those texts before and after; "
        "MiniLM cosine of original and paraphrase:",
        "",
        "| prompt | method | n | near-copies | cosine | length ratio | TPR after paraphrase (AUROC) "
        "| TPR, near-copies excluded [95% CI] | kept | mean score before / after (kept) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for a in sorted(runs.values(), key=lambda a: a["settings"].get("prompt", "paper")):
        prompt = a["settings"].get("prompt", "paper")
        for run in a["runs"]:
            q = a["quality"][run["generations"]]
            real = run["real"]
            after = f"{run['tpr_at_1pct_fpr_after']:.3f} ({run['auroc_after']:.3f})"
            if real["n"]:
                low, high = real["tpr_at_1pct_fpr_after_ci"]
                kept = f"{real['tpr_at_1pct_fpr_after']:.3f} [{low:.2f}, {high:.2f}]"
                scores = f"{real['mean_score_before']:.3f} / {real['mean_score_after']:.3f}"
            else:
                kept = scores = "-"
            rows.append(
                f"| {prompt} | {run['method']} | {q['n']} | {q['near_copy_fraction']:.0%} | {q['cosine_mean']:.2f} "
                f"| {q['length_ratio_mean']:.2f} "
                f"| {after} | {kept} | {real['n']} | {scores} |"
            )
    plots = [f"![{name} similarity]({figures}/{name}_paraphrase_similarity.png)" for name in runs]
    strength = "Paraphrase strength (MiniLM cosine of each paraphrase with its original): " + " ".join(plots)
    return rows + _projection(runs) + ["", strength]


def _projection(runs: dict) -> list[str]:
    """OpenStamp against no projection, then against each baseline, near-copies excluded, per prompt: the
    difference and whether it is resolved (the exact 95% intervals do not overlap)."""
    projection, baselines = [], []
    for a in runs.values():
        real = {r["method"]: r["real"] for r in a["runs"] if r["real"]["n"]}
        if "openstamp" not in real:
            continue
        prompt = a["settings"].get("prompt", "paper")
        gaps = {m: _gap(real["openstamp"], r) for m, r in real.items() if m != "openstamp"}
        if "openstamp-nosem" in gaps:
            gap, apart = gaps.pop("openstamp-nosem")
            resolved = "the intervals do not overlap" if apart else "the intervals overlap: not resolved"
            projection.append(f"{prompt} prompt: {gap:+.3f} ({resolved})")
        if gaps:
            cells = [f"{m} {gap:+.3f}{' (intervals apart)' if apart else ''}" for m, (gap, apart) in gaps.items()]
            baselines.append(f"{prompt} prompt: " + ", ".join(cells))
    lines = []
    if projection:
        lead = "The projection's effect (OpenStamp minus no projection, near-copies excluded): "
        lines += ["", lead + "; ".join(projection) + "."]
    if baselines:
        lead = (
            "OpenStamp minus each baseline, near-copies excluded, each at its default strength (their costs differ: "
            "see the sweep); '(intervals apart)' where the 95% intervals do not overlap, otherwise not resolved: "
        )
        lines += ["", lead + "; ".join(baselines) + "."]
    return lines


def _gap(ours: dict, other: dict) -> tuple[float, bool]:
    """TPR difference after paraphrase (near-copies excluded) and whether the two intervals are apart."""
    (lo1, hi1), (lo2, hi2) = ours["tpr_at_1pct_fpr_after_ci"], other["tpr_at_1pct_fpr_after_ci"]
    return ours["tpr_at_1pct_fpr_after"] - other["tpr_at_1pct_fpr_after"], hi1 < lo2 or hi2 < lo1


def _has_real(a: dict) -> bool:
    return bool(a.get("runs")) and all("real" in r and "generations" in r for r in a["runs"])
