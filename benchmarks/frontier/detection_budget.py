"""How much detection each method of the Pareto sweep buys with what it costs, against the second-order ceiling.

    python benchmarks/frontier/detection_budget.py [--sweep benchmarks/results/sweep]

At a cost of c nats per token (c = log(1 + own PPL change)), no detector of a watermark's change separates text the
watermarked model writes from human text that the model fits by more than d* = sqrt(2 n c) standard deviations over n
tokens, to second order in the change; at 1% FPR that is TPR* = Phi(d* - 2.326) (``openstamp.lab.evaluation.budget``
has the derivation and its caveats). This script reads the sweep's kept results (every run's TPR@1%FPR at 16, 32
and 64 tokens, its own perplexity change and its per-text scores; nothing is run again) and, per method and
strength, pooled over the seeds, sets each TPR beside the ceiling's: its efficiency d' / d*, with d' = Phi^-1(TPR) +
2.326 read from the TPR. For a detector whose score is a mean LLR (``score_is_llr``: OpenStamp, KGW+LLR) it also
splits the full-length separation into the budget's factors: the part of the cost its LLR sees on human text, the
LLR of generated text against it, and the human scores' spread.

It also answers what the strength a model owner can afford buys at best: the ceiling at the issue's target (+10% own
PPL, 64 tokens), and the cost at 64 tokens, or the tokens at +10%, at which the ceiling, and each method at its
measured efficiency, reaches TPR 0.95.

Writes benchmarks/results/detection_budget.json and detection_budget.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from statistics import fmean, median

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import RESULTS, kept_variants, write_result  # noqa: E402

from openstamp.lab.evaluation.budget import (  # noqa: E402
    ceiling_separation,
    ceiling_tpr,
    cost_nats,
    cost_to_reach,
    llr_budget,
    separation,
    tokens_to_reach,
)
from openstamp.lab.methods import REGISTRY  # noqa: E402

FPR = 0.01
TARGET = {"tpr": 0.95, "tokens": 64, "own_ppl_change": 0.10}  # issue 15's target for OpenStamp


def sweeps(folder: Path) -> list[tuple[str | None, dict]]:
    """(name, results) of the sweep (name None: each run's method) and of each kept shrinkage variant that matches it,
    named as the summary shows it ('<method> (shrinkage f)', ``common.kept_variants``)."""
    sweep = json.loads((folder / "results.json").read_text())
    return [(None, sweep)] + [(name, v) for _, v, _, name, why in kept_variants(sweep, folder) if not why]


def points(folder: Path) -> list[dict]:
    """Per method and strength: the seeds' mean cost and TPR per length, the ceiling, the efficiency and, for a
    mean-LLR score, the budget's factors (each the mean over seeds)."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for name, r in sweeps(folder):
        for run in r["runs"]:
            groups.setdefault((name or run["method"], run["strength"]), []).append({**run, "_n": r["config"]["n"]})
    out = []
    for (label, strength), runs in groups.items():
        method = runs[0]["method"]
        cost = fmean(cost_nats(run["metrics"]["own_ppl_change"]) for run in runs)
        texts = sum(run["_n"] for run in runs)
        lengths = []
        for tokens in sorted({row["tokens"] for row in runs[0]["length_curve"]}):
            tpr = fmean(
                next(r["tpr_at_1pct_fpr"] for r in run["length_curve"] if r["tokens"] == tokens) for run in runs
            )
            ceiling = ceiling_tpr(max(cost, 0.0), tokens, FPR)  # a strength that lowers own PPL costs nothing
            d_star = ceiling_separation(max(cost, 0.0), tokens)
            lengths.append(
                {
                    "tokens": tokens,
                    "tpr": tpr,
                    "ceiling_tpr": ceiling,
                    "saturated": tpr in (0.0, 1.0),
                    "efficiency": separation(tpr, FPR, texts) / d_star if d_star > 0 else None,
                }
            )
        point = {
            "method": label,
            "strength": strength,
            "seeds": len(runs),
            "own_ppl_change": fmean(run["metrics"]["own_ppl_change"] for run in runs),
            "cost_nats": cost,
            "lengths": lengths,
        }
        llr_score = method in REGISTRY and REGISTRY[method].score_is_llr
        if llr_score and all("scores" in run for run in runs):  # results kept before runs held their scores: none
            tokens = lengths[-1]["tokens"]
            parts = [llr_budget(run["scores"]["human"], run["scores"]["watermarked"], cost, tokens) for run in runs]
            point["llr_budget"] = {
                k: (fmean(p[k] for p in parts) if all(p[k] is not None for p in parts) else None) for k in parts[0]
            }
        out.append(point)
    return out


def method_efficiency(pts: list[dict]) -> dict[str, dict]:
    """Per method: the median efficiency over its unsaturated points at each length, and what the one at full length
    needs to reach the target's TPR (the token figure assumes it holds at that length: ``by_length`` shows how far it
    moves from 16 to 64 tokens)."""
    out = {}
    for label in dict.fromkeys(p["method"] for p in pts):
        mine = [p for p in pts if p["method"] == label]
        by_length = {}
        for i, row in enumerate(mine[0]["lengths"]):
            effs = [p["lengths"][i]["efficiency"] for p in mine if not p["lengths"][i]["saturated"]]
            by_length[str(row["tokens"])] = median(effs) if effs else None
        effs = [p["lengths"][-1]["efficiency"] for p in mine if not p["lengths"][-1]["saturated"]]
        if not effs or not all(effs):
            continue
        eff = median(effs)
        out[label] = {
            "efficiency": eff,
            "points": len(effs),
            "by_length": by_length,
            "own_ppl_change_for_target": cost_to_reach(TARGET["tpr"], TARGET["tokens"], FPR, eff),
            "tokens_for_target": tokens_to_reach(TARGET["tpr"], TARGET["own_ppl_change"], FPR, eff),
        }
    return out


def plot(pts: list[dict], path: Path) -> None:
    import numpy as np

    from openstamp.detect.plots import new_figure, save_figure

    fig, (left, right) = new_figure(11, 4.2, ncols=2)
    tokens = pts[0]["lengths"][-1]["tokens"]
    grid = np.linspace(0, max(p["own_ppl_change"] for p in pts), 200)
    left.plot(grid * 100, [ceiling_tpr(cost_nats(g), tokens, FPR) for g in grid], "k--", label="second-order ceiling")
    for label in dict.fromkeys(p["method"] for p in pts):
        mine = sorted((p for p in pts if p["method"] == label), key=lambda p: p["own_ppl_change"])
        x = [p["own_ppl_change"] * 100 for p in mine]
        (line,) = left.plot(x, [p["lengths"][-1]["tpr"] for p in mine], "o-", ms=3, label=label)
        kept = [p for p in mine if not p["lengths"][-1]["saturated"]]
        right.plot(
            [p["own_ppl_change"] * 100 for p in kept],
            [p["lengths"][-1]["efficiency"] for p in kept],
            "o-",
            ms=3,
            color=line.get_color(),
        )
    left.axvline(TARGET["own_ppl_change"] * 100, color="grey", lw=0.8)
    left.axhline(TARGET["tpr"], color="grey", lw=0.8)
    left.set(xlabel="own perplexity change (%)", ylabel=f"TPR@1%FPR at {tokens} tokens", ylim=(0, 1.02))
    right.axhline(1.0, color="k", ls="--", lw=0.8)
    right.set(xlabel="own perplexity change (%)", ylabel=f"efficiency d' / d* at {tokens} tokens (TPR below 1)")
    left.legend(fontsize=7)
    save_figure(fig, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep", type=Path, default=RESULTS / "sweep", help="a kept sweep folder (results.json)")
    args = parser.parse_args()
    if not (args.sweep / "results.json").exists():
        raise SystemExit(f"{args.sweep / 'results.json'} is missing: run `bash benchmarks/reference_runs.sh sweep`")
    pts = points(args.sweep)
    methods = method_efficiency(pts)
    target = {
        **TARGET,
        "ceiling_tpr": ceiling_tpr(cost_nats(TARGET["own_ppl_change"]), TARGET["tokens"], FPR),
        "ceiling_own_ppl_change": cost_to_reach(TARGET["tpr"], TARGET["tokens"], FPR),
        "ceiling_tokens": tokens_to_reach(TARGET["tpr"], TARGET["own_ppl_change"], FPR),
    }
    sweep = json.loads((args.sweep / "results.json").read_text())
    write_result(
        "detection_budget",
        {
            "sweep": str(args.sweep),
            "sweep_created": sweep["created"],
            "fpr": FPR,
            "target": target,
            "methods": methods,
            "points": pts,
        },
    )
    plot(pts, RESULTS / "detection_budget.png")
    print(
        f"ceiling at +{TARGET['own_ppl_change']:.0%} own PPL, {TARGET['tokens']} tokens: "
        f"TPR {target['ceiling_tpr']:.3f}; TPR {TARGET['tpr']} needs "
        f"+{target['ceiling_own_ppl_change']:.1%} at the ceiling, or {target['ceiling_tokens']:.0f} tokens at "
        f"+{TARGET['own_ppl_change']:.0%}"
    )
    for label, m in methods.items():
        print(
            f"{label:32s} efficiency {m['efficiency']:.2f} ({m['points']} points): TPR {TARGET['tpr']} at "
            f"{TARGET['tokens']} tokens needs +{m['own_ppl_change_for_target']:.1%}, at "
            f"+{TARGET['own_ppl_change']:.0%} {m['tokens_for_target']:.0f} tokens"
        )
    for p in pts:
        if "llr_budget" in p and p["llr_budget"]["seen"] is not None:
            b = p["llr_budget"]
            print(
                f"{p['method']}@{p['strength']:g} (+{p['own_ppl_change']:.1%}): seen {b['seen']:.2f} signal "
                f"{b['signal']:.2f} spread {b['spread']:.2f} -> efficiency {b['efficiency']:.2f}"
            )


if __name__ == "__main__":
    main()
