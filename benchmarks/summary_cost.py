"""What a strength costs and what it buys: the README's section on ``openstamp tune`` (tune.json)."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def tune(r: dict) -> list[str]:
    s, f = r["settings"], r.get("selector_shrinkage", 0.0)
    verdict = "reaches" if r["reached"] else "does not reach"
    stage, option, profile = (
        ("tune_shrinkage", f" --set selector.shrinkage={f:g}", f", selector shrinkage {f:g}") if f else ("tune", "", "")
    )
    rows = [
        f"Choosing the strength (`bash benchmarks/reference_runs.sh {stage}`, i.e. `openstamp tune --model "
        f"smollm2-135m --corpus wikipedia --target-tpr {s['target_tpr']} --tokens {s['tokens']} --fpr {s['fpr']} "
        f"--n {s['n']}{option}`): one key (default profile{profile}), each probed delta watermarks the model, "
        f"samples {s['n']} held-out prompts ({s['prompt_tokens']} tokens, withheld from the detector) to {s['tokens']} "
        "new tokens, and counts the "
        f"texts flagged at p <= {s['fpr']}. The cost is the model's own perplexity on the same prompts' human "
        f"continuations ({r['own_ppl_original']:.2f} unwatermarked).",
        "",
        "| delta | TPR [95% CI] | own perplexity | change |",
        "|---:|---:|---:|---:|",
    ]
    for p in r["probes"]:
        mark = " (chosen)" if p["delta"] == r["delta"] else ""
        rows.append(
            f"| {p['delta']:.3g}{mark} | {p['tpr']:.3f} [{p['tpr_ci'][0]:.3f}, {p['tpr_ci'][1]:.3f}] | "
            f"{p['own_ppl']:.2f} | {p['own_ppl_change']:+.1%} |"
        )
    rows += [
        "",
        f"delta {r['delta']:.3g} {verdict} TPR {s['target_tpr']} at {s['tokens']} tokens, at a cost of "
        f"{r['own_ppl_change']:+.1%} in the model's own perplexity. The issue's target (TPR >= 0.95 at 64 tokens "
        "for at most +10%) is "
        + ("met." if r["reached"] and r["own_ppl_change"] <= 0.10 else "**not met** by this release."),
    ]
    return rows


def strength_sweep(r: dict) -> list[str]:
    """One row per strength: TPR at each length, the share flagged at p <= 0.01, own perplexity, downstream."""
    c = r["config"]
    curve = r.get("length_curve", [])
    tokens = sorted({row["tokens"] for row in curve})
    tasks = list(r.get("downstream_original", {}))
    original = r["references"]["human"].get("own_ppl_original")
    grid = ", ".join(f"{g:g}" for g in c["grids"].get("openstamp", []))
    rows = [
        f"What a strength costs and buys (`bash benchmarks/reference_runs.sh cost`, i.e. `openstamp eval --methods "
        f"{','.join(c['methods'])} --sweep` over delta {grid}): "
        f"{c['n']} held-out prompts of {c['prompt_tokens']} tokens, {c['new_tokens']} new tokens, each completion "
        "also cut to fewer tokens and scored against human text cut alike (TPR@1%FPR; with fewer than 100 human "
        "texts the threshold is the largest human score). The share flagged at p <= 0.01 needs no human text. "
        f"Costs: the model's own perplexity on the human continuations ({original:.2f} unwatermarked) and lm-eval "
        f"accuracy on the local tasks ({c['downstream_limit']} items each; the original model: "
        + ", ".join(f"{t} {a:.3f}" for t, a in r.get("downstream_original", {}).items())
        + "), as the paired change [95% CI]. Lengths count scored tokens: each text is cut to one token more, "
        "since the first token of a text without BOS is context, not scored. A '-' marks a length the detector "
        "refuses (fewer scored tokens than its `min_tokens`, 16).",
        "",
        "| delta | "
        + " | ".join(f"TPR {t} tok" for t in tokens)
        + f" | flagged p<=0.01 at {tokens[-1] if tokens else '-'} tok | own PPL change | "
        + " | ".join(f"{t} change" for t in tasks)
        + " |",
        "|---:|" + "---:|" * (len(tokens) + 2 + len(tasks)),
    ]
    for run in r["runs"]:
        at = {row["tokens"]: row for row in run.get("length_curve", [])}
        m = run["metrics"]
        cells = [cell(at.get(t, {}).get("tpr_at_1pct_fpr")) for t in tokens]
        last = at.get(tokens[-1]) if tokens else None
        cells.append(cell((last or {}).get("flagged_at_p_0.01")))
        lo, hi = m["own_ppl_change_ci"]
        cells.append(f"{m['own_ppl_change']:+.1%} [{lo:+.1%}, {hi:+.1%}]")
        for t in tasks:
            d = m.get("downstream", {}).get(t)
            cells.append("-" if d is None else f"{d['change']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]")
        rows.append(f"| {run['strength']:g} | " + " | ".join(cells) + " |")
    plots = [name for name in ("pareto.png", "length_curve.png") if (RESULTS / "cost" / name).exists()]
    return rows + (["", " ".join(f"![{name}](benchmarks/results/cost/{name})" for name in plots)] if plots else [])


def cell(value: float | None) -> str:
    """A figure, or "-" where none was measured (the detector refuses texts below its min_tokens)."""
    return "-" if value is None else f"{value:.3f}"
