"""The detection budget's section (benchmarks/detection_budget.py, used by summary.py): each method's efficiency
against the second-order ceiling, what the issue's target needs, and where a mean-LLR score's separation goes."""

from __future__ import annotations

import json
import math
from pathlib import Path


def _retie_seen(retie: dict | None) -> list[str]:
    """What the re-tie benchmark says of the cost an LLR sees: an untied and a re-tied release of one key, each
    with its own perplexity change on held-out text and its mean LLR on human text."""
    if retie is None:
        return []
    res, seen = retie["results"], {}
    for mode in ("untie", "retie"):
        cost = math.log(res[mode]["perplexity"]["ppl"] / res["original"]["perplexity"]["ppl"])
        seen[mode] = (-res[mode]["mean_llr_human"] / cost, cost)
    return [
        f" The re-tie benchmark (`python benchmarks/retie.py`; one key at delta {retie['delta']:g}) points at where "
        f"the rest of OpenStamp's cost goes: its untied release costs {seen['untie'][1]:.3f} nats per token and its "
        f"LLR sees {seen['untie'][0]:.2f} of that on human text; its re-tied release, whose input embeddings are `U~` "
        f"too, costs {seen['retie'][1]:.3f} and its LLR, read on the released backbone, sees {seen['retie'][0]:.2f} "
        "(perplexity on held-out windows, LLR on human continuations: other texts, so a ratio near 1 is as close "
        "as they agree)."
    ]


def _kept_as(created: str, reruns: Path | None) -> str:
    """Where among ``reruns``' folders (benchmarks/results/sweep/rerun/) the eval made at ``created`` is kept."""
    for path in sorted(reruns.glob("*/results.json")) if reruns else []:
        if json.loads(path.read_text())["created"] == created:
            return f" (kept as `{path.parent.relative_to(reruns.parents[3])}`)"
    return ""


def _full_llr(full: dict | None, reruns: Path | None = None) -> list[str]:
    """What scoring the whole release's LLR (benchmarks/full_llr.py) does to the budget and to TPR; ``reruns`` holds
    the kept evals (benchmarks/results/sweep/rerun/), one of which may be the eval it read."""
    if full is None or not full["runs"]:
        return []
    rows = full["runs"]
    where = ", ".join(f"`{e['eval']}`" + _kept_as(e["created"], reruns) for e in full["evals"])
    span = lambda part, key: _span([r[part] for r in rows], key)  # noqa: E731
    text = (
        f" Scored instead with the LLR of the whole release against the original model, each on its own backbone (two "
        f"forward passes; `bash benchmarks/reference_runs.sh full_llr`, i.e. `python benchmarks/full_llr.py`, on "
        f"{where}: {len(rows)} OpenStamp runs, the same texts), "
        f"the LLR sees {span('full_llr', 'seen')} of the cost (the head's: {span('head_llr', 'seen')}), with "
        f"signal {span('full_llr', 'signal')} (the head's: {span('head_llr', 'signal')}) and spread "
        f"{span('full_llr', 'spread')} (the head's: {span('head_llr', 'spread')})."
    )
    pooled = full.get("pooled", [])
    if pooled:
        up = [_gap(p) for p in pooled if p["gap_ci"][0] > 0]
        down = [_gap(p) for p in pooled if p["gap_ci"][1] < 0]
        text += (
            " Pooled over the keys, its TPR@1%FPR minus the head's (a paired bootstrap over the texts, which both "
            "score) is "
        )
        if up or down:
            text += (
                f"resolved above 0 at {'; '.join(up) or 'no point'}, below 0 at {'; '.join(down) or 'no point'}, and "
                f"unresolved at the other {len(pooled) - len(up) - len(down)} of {len(pooled)} method and strength "
                "points."
            )
        else:
            largest = max(pooled, key=lambda p: abs(p["gap"]))
            text += f"resolved at none of the {len(pooled)} method and strength points (largest: {_gap(largest)})."
    return [text]


def _gap(p: dict) -> str:
    return f"{p['method']}@{p['strength']:g} {p['gap']:+.3f} [{p['gap_ci'][0]:+.3f}, {p['gap_ci'][1]:+.3f}]"


def _full_llr_table(full: dict | None) -> list[str]:
    """RESULTS.md's table of the full LLR against the head's, per method and strength pooled over the keys."""
    if full is None or not full.get("pooled"):
        return []
    out = [
        "| method | strength | keys | own PPL change | TPR@1%FPR, head LLR | full LLR | full minus head [95%] |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for p in full["pooled"]:
        out.append(
            f"| {p['method']} | {p['strength']:g} | {p['keys']} | +{p['own_ppl_change']:.1%} | {p['head_llr']:.3f} | "
            f"{p['full_llr']:.3f} | {p['gap']:+.3f} [{p['gap_ci'][0]:+.3f}, {p['gap_ci'][1]:+.3f}] |"
        )
    return out + [""]


def detection_budget(
    r: dict, whole: bool = True, retie: dict | None = None, full: dict | None = None, reruns: Path | None = None
) -> list[str]:
    """``whole`` (RESULTS.md) adds every mean-LLR point's factors; the README has the method table and the ranges.
    ``retie`` and ``full`` (the re-tie and full-LLR benchmarks' results) add what they say of the unseen cost."""
    t, fpr = r["target"], r["fpr"]
    llr = [p for p in r["points"] if p.get("llr_budget", {}).get("seen") is not None]
    out = [
        "What a cost can buy (`bash benchmarks/reference_runs.sh budget`, i.e. `python "
        "benchmarks/detection_budget.py`; `benchmarks/results/detection_budget.json`): at a cost of c = log(1 + own "
        "PPL change) nats per token, no detector of a watermark's change separates the text it makes from human text "
        "the model fits by more than d* = sqrt(2 n c) standard deviations over n tokens, to second order in the change "
        f"(`openstamp.evaluation.budget`); at {fpr:.0%} FPR, TPR* = Phi(d* - 2.326). It is not a bound: third-order "
        "terms, human text unlike the model's and dependent tokens move it either way. Each point of the Pareto "
        "sweep and its shrinkage variants (mean over the seeds) reads as d' = Phi^-1(TPR) + 2.326, and its "
        f"efficiency is d' / d*. **At the issue's target, +{t['own_ppl_change']:.0%} own PPL and {t['tokens']} "
        f"tokens, the ceiling is TPR {t['ceiling_tpr']:.3f}; TPR {t['tpr']:g} at {t['tokens']} tokens needs "
        f"+{t['ceiling_own_ppl_change']:.1%} at the ceiling, and at +{t['own_ppl_change']:.0%} it needs "
        f"{t['ceiling_tokens']:.0f} tokens**; at each method's median efficiency (over its points whose TPR is below "
        "1):",
        "",
        f"| method | efficiency d' / d* at {t['tokens']} tokens | points | own PPL change for TPR {t['tpr']:g} at "
        f"{t['tokens']} tokens | tokens for TPR {t['tpr']:g} at +{t['own_ppl_change']:.0%} (if the efficiency holds) "
        f"| efficiency at {' / '.join(next(iter(r['methods'].values()))['by_length'])} tokens |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label, m in sorted(r["methods"].items(), key=lambda kv: -kv[1]["efficiency"]):
        lengths = " / ".join("-" if e is None else f"{e:.2f}" for e in m["by_length"].values())
        out.append(
            f"| {label} | {m['efficiency']:.2f} | {m['points']} | +{m['own_ppl_change_for_target']:.1%} | "
            f"{m['tokens_for_target']:.0f} | {lengths} |"
        )
    out += ["", "![detection budget](benchmarks/results/detection_budget.png)", ""]
    if not llr:
        return out
    by: dict[str, list[dict]] = {}
    for p in llr:
        by.setdefault(p["method"], []).append(p["llr_budget"])
    ranges = "; ".join(
        f"{label}: seen {_span(b, 'seen')}, signal {_span(b, 'signal')}, spread {_span(b, 'spread')}"
        for label, b in by.items()
    )
    out.append(
        "Where a mean-LLR score's separation goes, at full length ((m_w + s) / sd_h over d* = sqrt(seen) (1 + "
        "signal) / 2 / spread, each factor 1 at the ceiling): `seen` is the part of the cost its LLR sees on human "
        "text (s / c, with s minus the human texts' mean score), `signal` the watermarked texts' mean score over s, "
        f"`spread` the human scores' spread over independent tokens'. Over each method's strengths: {ranges}."
        + "".join(_retie_seen(retie) + _full_llr(full, reruns))
    )
    out.append("")
    if whole:
        out += [
            "| method | strength | own PPL change | seen | signal | spread | efficiency |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for p in llr:
            b = p["llr_budget"]
            out.append(
                f"| {p['method']} | {p['strength']:g} | +{p['own_ppl_change']:.1%} | {b['seen']:.2f} | "
                f"{b['signal']:.2f} | {b['spread']:.2f} | {b['efficiency']:.2f} |"
            )
        out.append("")
        out += _full_llr_table(full)
    return out


def _span(parts: list[dict], key: str) -> str:
    lo, hi = min(p[key] for p in parts), max(p[key] for p in parts)
    return f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}"
