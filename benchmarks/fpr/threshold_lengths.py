"""What a threshold calibrated on whole completions does on shorter text, per method, from an eval's length curve.

    python benchmarks/fpr/threshold_lengths.py [--eval runs/eval-timed]

TPR@1%FPR chooses its threshold on human continuations as long as the completions (200 tokens in the default
comparison). An attack that shortens text (a paraphrase runs about half as long) is then scored against that
threshold, but a detector's score on human text may spread wider on shorter text: the threshold's false-positive
rate at that length is not 1%. This script reads an eval folder's cached scores (the full texts and the length
curve's cut texts; nothing is scored again) and gives, per run and length, the human texts above the full-length
threshold (``human_over_full_threshold``, the length curve's field) and at p <= 0.01, with exact 95% intervals.

Why a threshold passes more short text: ``human_sd_ratio`` is the spread (standard deviation) of the human texts'
scores at a length over their spread at full length. A score that is a mean of per-token terms (a length-normalised
LLR) spreads as 1/sqrt(tokens), so its ratio at L of N tokens is near sqrt(N / L) and its full-length threshold sits
ever nearer the middle of shorter text's scores; a score standardised for length (a z-score) keeps a ratio near 1
and a threshold that holds. Each run's ``score_scale`` names the nearer of the two at the shortest length:
"per-token mean" or "standardised".

Why a standardised score's threshold can still pass more than 1%: the threshold at 1% FPR of N human texts rests on
the few highest of them, so it is itself noisy. ``full_threshold_p_value`` is the p-value the detector gives the human
text the threshold sits on (None for a detector without p-values): where that is well above 0.01 the threshold is
loose by chance, and text of any length whose p-value is exact passes it at about that rate.

A method whose threshold flags more human text at a length is flattered by any TPR read at that threshold there.
Writes benchmarks/results/threshold_lengths.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import write_result  # noqa: E402

from openstamp.detect.rates import clopper_pearson, threshold_at_fpr  # noqa: E402
from openstamp.lab.evaluation.lengths import lengths_path, run_curve  # noqa: E402
from openstamp.storage import read_json  # noqa: E402


def run_rows(folder: Path, results: dict) -> list[dict]:
    """Per run of the eval at ``folder`` with a length curve: each length's human false positives."""
    rows = []
    for run in results["runs"]:
        scores = read_json(folder / "scores" / f"{run['run'].replace('/', '_')}.json", "scores")
        curve = run_curve(folder, run["run"], scores, results["config"]["new_tokens"])
        if not curve:
            continue
        cut = read_json(lengths_path(folder, run["run"]), "length scores")
        spread = np.std(_human(scores))
        lengths = []
        for row in curve:
            human = _human(cut.get(str(row["tokens"]), scores))  # the full length is the eval's own scores
            n = len(human)
            entry = {"tokens": row["tokens"], "human": n, "human_sd_ratio": float(np.std(human) / spread)}
            for field in ("human_over_full_threshold", "human_flagged_at_p_0.01"):
                value = row[field]
                entry[field] = value
                entry[f"{field}_ci"] = None if value is None else clopper_pearson(round(value * n), n)
            lengths.append(entry)
        full, short = curve[-1]["tokens"], lengths[0]
        rows.append(
            {
                "run": run["run"],
                "method": run["method"],
                "strength": run["strength"],
                "score_scale": score_scale(short["human_sd_ratio"], full / short["tokens"]),
                "full_threshold_p_value": threshold_p_value(scores),
                "lengths": lengths,
            }
        )
    return rows


def _human(scores: dict) -> np.ndarray:
    return np.array([r["score"] for r in scores["human"] if r["score"] is not None], dtype=np.float64)


def threshold_p_value(scores: dict) -> float | None:
    """The p-value of the full-length human text that the 1% FPR threshold sits on (the curve's threshold): the
    false-positive rate that threshold has under the detector's own null. None without p-values."""
    human = [r for r in scores["human"] if r["score"] is not None]
    threshold = threshold_at_fpr([r["score"] for r in human], 0.01)
    at = [r["p_value"] for r in human if r["score"] == threshold and r["p_value"] is not None]
    return float(max(at)) if at else None


def score_scale(sd_ratio: float, shrink: float) -> str:
    """How a score's spread on human text scales with length: "per-token mean" where ``sd_ratio``, its spread at a
    length ``shrink`` times shorter than full over its spread at full length, is nearer (in log terms) sqrt(shrink),
    a mean's, than 1, a standardised score's; "standardised" otherwise."""
    return "per-token mean" if abs(np.log(sd_ratio) - np.log(shrink) / 2) < abs(np.log(sd_ratio)) else "standardised"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--eval", type=Path, default=Path("runs/eval-timed"), help="a finished eval folder")
    args = parser.parse_args()
    path = args.eval / "results.json"
    if not path.exists():
        raise SystemExit(f"{args.eval} holds no finished eval (no results.json)")
    results = read_json(path, "eval results")
    rows = run_rows(args.eval, results)
    if not rows:
        raise SystemExit(f"{args.eval} has no length curve (its eval ran with --set lengths=)")
    cfg = results["config"]
    settings = {"eval": str(args.eval), "n": cfg["n"], "new_tokens": cfg["new_tokens"], "seeds": cfg["seeds"]}
    out = write_result("threshold_lengths", {"settings": settings, "runs": rows})
    for row in rows:
        cells = [
            f"{r['tokens']}: {r['human_over_full_threshold']:.3f}"
            + ("" if r["human_flagged_at_p_0.01"] is None else f" ({r['human_flagged_at_p_0.01']:.3f})")
            for r in row["lengths"]
        ]
        p = row["full_threshold_p_value"]
        at = "" if p is None else f", threshold at p {p:.3f}"
        print(f"{row['run']:<24} " + "  ".join(cells) + f"  [{row['score_scale']}{at}]")
    print(
        "human text over the full-length 1% FPR threshold (at p <= 0.01) per scored length, [how the score's spread "
        f"on human text scales with length, the p-value the threshold sits at]; wrote {out}"
    )


if __name__ == "__main__":
    main()
