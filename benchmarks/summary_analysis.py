"""The paper's analyses (``openstamp analyze ...`` and low_strength.py) as the README's sections."""

from __future__ import annotations

import json
from pathlib import Path

STAGE = "`bash benchmarks/reference_runs.sh analyses`"
SHRINKAGE = (
    "python benchmarks/low_strength.py --key runs/tune/key --n 32 --variants 254:1,254:4,254:16 --deltas 0.35,0.5 "
    "--name low_strength_shrinkage"
)


def _load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def lists(r: dict) -> list[str]:
    gammas = list(dict.fromkeys(row["gamma"] for row in r["rows"]))
    by_l = list(dict.fromkeys(row["lists"] for row in r["rows"]))
    at = {(row["lists"], row["gamma"]): row for row in r["rows"]}
    rows = [
        f"Green lists against L (`openstamp analyze lists`, {STAGE}): S refitted per L on the key's own projected "
        f"states ({r['states']['train']} train, {r['states']['heldout']} held out), G redrawn per gamma from its "
        "secret. Overlap: the share of the g most favoured tokens that lie in the state's argmax list; Jaccard: "
        f"how alike two contexts' favoured sets are ({r['pairs']} random pairs; lower is more varied).",
        "",
        "| L | " + " | ".join(f"overlap, gamma {g:g} | Jaccard, gamma {g:g}" for g in gammas) + " | S held-out acc |",
        "|---:|" + "---:|---:|" * len(gammas) + "---:|",
    ]
    for n in by_l:
        cells = [f"{at[(n, g)]['overlap']:.3f} | {at[(n, g)]['jaccard']:.3f}" for g in gammas]
        rows.append(f"| {n} | " + " | ".join(cells) + f" | {at[(n, gammas[0])]['selector_heldout_accuracy']:.3f} |")
    return rows


def prompt(r: dict) -> list[str]:
    rows = [
        f"Prompt independence (`openstamp analyze prompt`, {STAGE}): each completion of the eval "
        f"(`{r['eval']}`, {r['n']} per set) scored with its prompt and without it, with the same key. Gap: the "
        "mean |per-token LLR with - without| at the first token scored both ways and over the last 10.",
        "",
        "| run | text | mean LLR with prompt | without | correlation | flagged p<=0.01 with / without | "
        "gap, first token | gap, last 10 |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        gap = row["gap_by_position"]
        rows.append(
            f"| {row['run']} | {row['text']} | {row['mean_score_with_prompt']:.3f} | {row['mean_score_without']:.3f} "
            f"| {row['correlation']:.3f} | {row['flagged_with_prompt']:.2f} / {row['flagged_without']:.2f} | "
            f"{gap[0]:.3f} | {sum(gap[-10:]) / len(gap[-10:]):.3f} |"
        )
    return rows


def llr(r: dict) -> list[str]:
    rows = [
        f"The LLR detector on the weight-level baselines (`openstamp analyze llr`, {STAGE}): each baseline's "
        f"texts of the eval (`{r['eval']}`, {r['n']} per set) rescored with NLL_original - NLL_watermarked, "
        "the same texts as its native detector. TPR at 1% FPR against human text (and against unwatermarked "
        "completions); with fewer than 100 negatives the threshold is the largest negative score.",
        "",
        "| run | AUROC native | AUROC LLR | TPR@1%FPR native | TPR@1%FPR LLR | vs unwatermarked native | "
        "vs unwatermarked LLR |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        n, m = row["native"], row["llr"]
        rows.append(
            f"| {row['run']} | {n['auroc']:.3f} | {m['auroc']:.3f} | {n['tpr_at_1pct_fpr']:.3f} | "
            f"{m['tpr_at_1pct_fpr']:.3f} | {n['tpr_at_1pct_fpr_vs_unwatermarked']:.3f} | "
            f"{m['tpr_at_1pct_fpr_vs_unwatermarked']:.3f} |"
        )
    return rows


def gamma_delta(r: dict) -> list[str]:
    s = r["settings"]
    deltas = list(dict.fromkeys(row["delta"] for row in r["rows"]))
    at = {(row["gamma"], row["delta"]): row for row in r["rows"]}
    rows = [
        f"The effect of gamma and delta (`openstamp analyze gamma-delta`, {STAGE}): one key, G redrawn per gamma; "
        f"{s['n']} held-out prompts, {s['tokens']} new tokens, flagged at p <= {s['fpr']}; cost: the model's own "
        f"perplexity on the human continuations ({r['own_ppl_original']:.2f} unwatermarked). Cells: TPR / own "
        "perplexity change.",
        "",
        "| gamma | " + " | ".join(f"delta {d:g}" for d in deltas) + " |",
        "|---:|" + "---:|" * len(deltas),
    ]
    for gamma in dict.fromkeys(row["gamma"] for row in r["rows"]):
        cells = [f"{at[(gamma, d)]['tpr']:.2f} / {at[(gamma, d)]['own_ppl_change']:+.0%}" for d in deltas]
        rows.append(f"| {gamma:g} | " + " | ".join(cells) + " |")
    return rows


def low_strength(r: dict, command: str = "python benchmarks/low_strength.py") -> list[str]:
    s = r["settings"]
    # results that name no delta: their rows' deltas, in order
    deltas = r.get("deltas") or ([r["delta"]] if "delta" in r else list(dict.fromkeys(x["delta"] for x in r["rows"])))
    rows = [
        f"What helps at low strength (`{command}`, " + STAGE + f"): delta {', '.join(f'{d:g}' for d in deltas)}, "
        f"{s['n']} held-out prompts, {s['tokens']} new tokens, flagged at p <= {s['fpr']}; S refitted per variant "
        "on the same states (shrinkage f: ridge lambda = f * tr(Z^T Z) / d).",
        "",
        "| variant | delta | L | S held-out accuracy | TPR [95% CI] | own perplexity change |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        acc = row["selector_heldout_accuracy"]
        low, high = row["tpr_ci"]
        rows.append(
            f"| {row['variant']} | {row['delta']:g} | {row['lists']} | {'-' if acc is None else f'{acc:.3f}'} | "
            f"{row['tpr']:.3f} [{low:.2f}, {high:.2f}] | {row['own_ppl_change']:+.1%} |"
        )
    return rows


def weighting(r: dict) -> list[str]:
    s = r["settings"]
    rows = [
        "Per-token weighting (`python benchmarks/weighting.py --key runs/tune/key`, " + STAGE + f"): {s['n']} "
        f"held-out prompts, {s['tokens']} new tokens, the tuned key at low delta. Flagged at p <= {s['fpr']}: "
        "watermarked completions [95% CI] / human continuations / the original model's completions. The z-tests "
        "take the null 'each token drawn from the original model'; unit weights sum the centred terms c_t, optimal "
        "weights u_t = E1[c_t] / Var0[c_t] (the most expected z under the watermarked model). AUROC against the "
        "human continuations.",
        "",
        "| delta | detector (p-value) | z, unit weights | z, optimal weights | AUROC: mean LLR / unit / optimal |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in r["rows"]:
        cells = []
        for name in ("detector", "z_unit", "z_optimal"):
            c = row[name]
            low, high = c["tpr_ci"]
            flagged = f"{c['human_flagged']:.3f} / {c['original_flagged']:.3f}"
            cells.append(f"{c['tpr']:.3f} [{low:.2f}, {high:.2f}] / {flagged}")
        auroc = " / ".join(f"{row[name]['auroc']:.3f}" for name in ("mean_llr", "z_unit", "z_optimal"))
        rows.append(f"| {row['delta']:g} | " + " | ".join(cells) + f" | {auroc} |")
    return rows


def analyses(results: Path) -> list[str]:
    """Every analysis whose results exist, each followed by a blank line."""
    out: list[str] = []
    for name, render in (("lists", lists), ("prompt", prompt), ("llr", llr), ("gamma-delta", gamma_delta)):
        folder = results / "analysis" / name
        r = _load(folder / "results.json")
        if r is not None:
            out += render(r) + [""]
            plots = [f"![{p.name}](benchmarks/results/{p.relative_to(results)})" for p in sorted(folder.glob("*.png"))]
            out += [" ".join(plots), ""] if plots else []
    r = _load(results / "low_strength.json")
    if r is not None:
        out += low_strength(r) + [""]
    r = _load(results / "low_strength_shrinkage.json")
    if r is not None:
        out += low_strength(r, SHRINKAGE) + [""]
    r = _load(results / "weighting.json")
    if r is not None:
        out += weighting(r) + [""]
    return out
