"""What a strength costs and what it buys: the README's section on ``openstamp tune`` (tune.json)."""

from __future__ import annotations


def tune(r: dict) -> list[str]:
    s = r["settings"]
    verdict = "reaches" if r["reached"] else "does not reach"
    rows = [
        f"Choosing the strength (`bash benchmarks/reference_runs.sh tune`, i.e. `openstamp tune --model smollm2-135m "
        f"--corpus wikipedia --target-tpr {s['target_tpr']} --tokens {s['tokens']} --fpr {s['fpr']} --n {s['n']}`): "
        f"one key (default profile), each probed delta watermarks the model, samples {s['n']} held-out prompts "
        f"({s['prompt_tokens']} tokens, withheld from the detector) to {s['tokens']} new tokens, and counts the "
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
