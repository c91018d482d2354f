"""The README's Pareto sweep (the paper's Figure 2): benchmarks/results/sweep/results.json."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from summary_cost import cell

from openstamp.evaluation.pareto import compare, points
from openstamp.evaluation.report import fmt, pareto_table


def sweep(r: dict, folder: Path) -> list[str]:
    """Per method and strength: TPR at each length, its own-perplexity cost; then the point-by-point verdicts."""
    c = r["config"]
    seeds = ", ".join(map(str, c["seeds"]))
    curve = r.get("length_curve", [])
    tokens = sorted({row["tokens"] for row in curve})
    full = max(tokens, default=c["new_tokens"])
    scored = max((row["scored_tokens"] for row in curve if row["tokens"] == full), default=full)
    original = r["references"]["human"].get("own_ppl_original")
    several = len(c["seeds"]) > 1
    seed_text = f"seeds {seeds} (a key and a sample per seed)." if several else f"one seed ({seeds}) so far."
    partial = (
        f" The stage grows this run to 3 seeds; it holds {len(c['seeds'])} so far (running the stage again resumes)."
        if len(c["seeds"]) < 3
        else ""
    )
    spread = (
        "mean over seeds, ± sd at full length and for the cost" if several else "one key and sample per point"
    ) + "; [95% bootstrap interval] at full length, over seeds and texts where results hold one"
    rows = [
        f"The Pareto sweep (`bash benchmarks/reference_runs.sh sweep`; the paper's Figure 2): {len(c['methods'])} "
        f"methods at the strengths below, chosen so that the weakest falls below TPR 1; {c['n']} held-out prompts of "
        f"{c['prompt_tokens']} tokens per point and seed, {c['new_tokens']} new tokens, {seed_text} "
        f"TPR@1%FPR against human text cut to the same length ({spread}; the full-length column scores "
        f"{scored:g} tokens), and the cost: the model's own perplexity on the "
        f"human continuations ({original:.2f} unwatermarked; decode-time methods under their logits processor) "
        f"and the oracle's (`{c['oracle']}`) perplexity of the completions (a mean of heavy-tailed per-text "
        "perplexities, not monotone in strength here: the own-perplexity axis is the primary one). KGW-distilled is "
        "not in the sweep "
        "(one 28-minute distillation per strength and seed on this CPU)." + partial,
        "",
        "| method | strength | "
        + " | ".join(f"TPR {t} tok" for t in tokens[:-1])
        + f" | TPR full ({scored:g} tok) | own PPL change | oracle PPL |",
        "|---|---:|" + "---:|" * (len(tokens) + 2),
    ]
    for s in r["summary"]:
        at = {row["tokens"]: row for row in curve if (row["method"], row["strength"]) == (s["method"], s["strength"])}
        cells = [cell(at.get(t, {}).get("tpr_at_1pct_fpr")) for t in tokens[:-1]]
        cells += [fmt(s.get("tpr_at_1pct_fpr")), fmt(s.get("own_ppl_change"), "own_ppl_change")]
        cells.append(fmt(s.get("ppl_mean"), "ppl_mean"))
        rows.append(f"| {s['method']} | {s['strength']:g} | " + " | ".join(cells) + " |")
    for part in (_verdicts(r), pareto_table(r)):
        rows += ["", *part] if part else []
    plots = [name for name in ("pareto.png", "length_curve.png") if (folder / name).exists()]
    if plots:
        rows += ["", " ".join(f"![{name}](benchmarks/results/sweep/{name})" for name in plots)]
    return rows


def _verdicts(r: dict, method: str = "openstamp", cost: str = "own_ppl_change") -> list[str]:
    """How many of OpenStamp's strengths lie above, on or below each baseline's curve of TPR against own PPL."""
    summary, n = r["summary"], r["config"]["n"] * len(r["config"]["seeds"])
    baselines = [
        m for m in dict.fromkeys(s["method"] for s in summary) if m != method and len(points(summary, m, cost)) > 1
    ]
    if not baselines:
        return []
    parts = []
    for b in baselines:
        counts = Counter(row["verdict"] for row in compare(summary, method, b, cost, n))
        inside = ", ".join(f"{counts[v]} {v}" for v in ("above", "on", "below") if counts[v])
        outside = sum(v for k, v in counts.items() if k not in ("above", "on", "below"))
        parts.append(f"{b}: {inside or 'none inside its cost range'}" + (f" ({outside} outside it)" if outside else ""))
    return [
        f"Where {method} stands at full length, on own PPL change, against each baseline's curve (its "
        f"strengths inside the baseline's cost range; 'on' within 1.96 standard errors of the bootstrap intervals): "
        + "; ".join(parts)
        + "."
    ]
