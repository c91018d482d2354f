"""How often each interval of the at-cost TPR verdicts calls two equal methods different.

    python benchmarks/verdict_coverage.py [--trials 300] [--keys 2] [--positives 64] [--negatives 200]

The at-cost summaries say where OpenStamp is above or below a baseline by TPR@1%FPR, each method's texts pooled over
its keys and each text judged against its own key's threshold, chosen on that key's human continuations. Newcombe's
interval for two rates counts the texts alone; ``pooled_tpr_difference_ci`` also redraws the human texts, and so the
threshold. Each trial draws two methods' scores (positives N(mu, 1), negatives N(0, 1), as many as the weight attacks
have: 64 attacked texts and 200 human ones a key), mu set so that the true TPR@1%FPR is 0.3, 0.6 or 0.9. With equal
methods the true difference is 0, and a 95% interval should leave it out in about 5% of trials; with the second
method's true TPR 0.2 lower, how often an interval resolves the difference is its power.
"""

from __future__ import annotations

import argparse

import numpy as np
from common import write_result
from scipy.stats import norm

from openstamp.evaluation.metrics import pooled_tpr_difference_ci, rate_difference_ci, tpr_at_fpr

TPRS = (0.3, 0.6, 0.9)


def trial(rng, mus: tuple[float, float], keys: int, positives: int, negatives: int) -> tuple[bool, bool]:
    """One pair of methods (``mus``): whether Newcombe's interval and the bootstrap each resolve their difference."""
    runs = [
        [(rng.normal(mu, 1, positives), rng.normal(0, 1, negatives)) for _ in range(keys)] for mu in mus
    ]  # two methods, each its keys' (positives, negatives)
    hits = [sum(round(tpr_at_fpr(pos, neg, 0.01)["tpr"] * len(pos)) for pos, neg in method) for method in runs]
    low, high = rate_difference_ci(hits[0], keys * positives, hits[1], keys * positives)
    _, b_low, b_high = pooled_tpr_difference_ci(*runs, 0.01, seed=int(rng.integers(2**31)))
    return low > 0 or high < 0, b_low > 0 or b_high < 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=300)
    parser.add_argument("--keys", type=int, default=2)
    parser.add_argument("--positives", type=int, default=64, help="attacked texts a key")
    parser.add_argument("--negatives", type=int, default=200, help="human texts a key")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    rows = []
    for tpr in TPRS:
        for gap in (0.0, 0.2):
            mus = tuple(norm.ppf(0.99) + norm.ppf(t) for t in (tpr, tpr - gap))  # TPRs at N(0, 1)'s 1% threshold
            calls = np.array([trial(rng, mus, args.keys, args.positives, args.negatives) for _ in range(args.trials)])
            row = {
                "tpr": tpr,
                "gap": gap,
                "newcombe": float(calls[:, 0].mean()),
                "bootstrap": float(calls[:, 1].mean()),
            }
            rows.append(row)
            what = "equal methods called different" if gap == 0 else f"a true gap of {gap} resolved"
            print(
                f"TPR {tpr} against {tpr - gap:.1f}: {what} by Newcombe's interval in {row['newcombe']:.1%} of "
                f"{args.trials} trials, by the bootstrap that redraws the threshold in {row['bootstrap']:.1%}",
                flush=True,
            )
    write_result("verdict_coverage", {"settings": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
