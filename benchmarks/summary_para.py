"""The README's paraphrase detail: each method with and without the near-copies, per prompt."""

from __future__ import annotations

PROMPTS = {
    "paper": "the paper's prompt",
    "strong": "the strong prompt (the paper's, which also forbids copying more than three consecutive words)",
}


def paraphrase_detail(attack: dict) -> list[str]:
    """Every paraphrase run that recorded detection without its near-copies (``real``), one row per prompt and method.

    The projection's effect is OpenStamp against openstamp-nosem on the same paraphraser and prompt:
    with near-copies left out, neither is credited for text the paraphraser did not rewrite.
    """
    runs = {name: a for name, a in attack.items() if a.get("attack") == "paraphrase" and _has_real(a)}
    if not runs:
        return []
    first = next(iter(runs.values()))["settings"]
    prompts = sorted({a["settings"].get("prompt", "paper") for a in runs.values()})
    rows = [
        "",
        f"Paraphrase at larger n (`bash benchmarks/reference_runs.sh paraphrase64`): `{first['paraphraser']}`, "
        f"{' and '.join(PROMPTS[p] for p in prompts)}. "
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
    figures = [
        f"![{name} similarity](benchmarks/results/eval/attacks/{name}_paraphrase_similarity.png)" for name in runs
    ]
    strength = "Paraphrase strength (MiniLM cosine of each paraphrase with its original): " + " ".join(figures)
    return rows + _projection(runs) + ["", strength]


def _projection(runs: dict) -> list[str]:
    """OpenStamp against no projection, near-copies excluded, per prompt: the difference and whether it is resolved."""
    lines = []
    for a in runs.values():
        real = {r["method"]: r["real"] for r in a["runs"] if r["real"]["n"]}
        if not {"openstamp", "openstamp-nosem"} <= set(real):
            continue
        ours, ablated = real["openstamp"], real["openstamp-nosem"]
        gap = ours["tpr_at_1pct_fpr_after"] - ablated["tpr_at_1pct_fpr_after"]
        (lo1, hi1), (lo2, hi2) = ours["tpr_at_1pct_fpr_after_ci"], ablated["tpr_at_1pct_fpr_after_ci"]
        resolved = "the intervals do not overlap" if hi1 < lo2 or hi2 < lo1 else "the intervals overlap: not resolved"
        lines.append(f"{a['settings'].get('prompt', 'paper')} prompt: {gap:+.3f} ({resolved})")
    if not lines:
        return []
    lead = "The projection's effect (OpenStamp minus no projection, near-copies excluded): "
    return ["", lead + "; ".join(lines) + "."]


def _has_real(a: dict) -> bool:
    return bool(a.get("runs")) and all("real" in r and "generations" in r for r in a["runs"])
