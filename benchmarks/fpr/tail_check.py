"""The tail p-value against a Monte-Carlo run with 10^5 permutations, on real watermarked text.

    python benchmarks/fpr/tail_check.py [--model runs/fpr/model --key runs/fpr/key --n 32]

Watermarked completions of held-out prompts are cut to 16, 32, 64 and 100 scored tokens, so their
p-values span the range a 10^5-permutation run can resolve (>= 1e-4) and beyond it. For each
text it reports the permutation p-value with K = 999 (what ``detect`` computes), with K = 10^5,
the Chernoff tail bound (``openstamp.detect.tail``) and the p-value ``detect`` reports.
Writes benchmarks/results/tail_check.json (``--name``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import write_result  # noqa: E402

from openstamp import DetectConfig, Detector  # noqa: E402
from openstamp.detect.llr import permutation_pvalue  # noqa: E402
from openstamp.detect.tail import chernoff_pvalue, tail_terms  # noqa: E402
from openstamp.generate import sample_completions  # noqa: E402
from openstamp.key.prf import permutations  # noqa: E402
from openstamp.storage import read_json  # noqa: E402

LENGTHS = (16, 32, 64, 100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("runs/fpr/model"))
    parser.add_argument("--key", type=Path, default=Path("runs/fpr/key"))
    parser.add_argument("--prompts", type=Path, default=Path("runs/fpr/texts/prompts.json"))
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--mc", type=int, default=100_000)
    parser.add_argument("--name", default="tail_check", help="writes benchmarks/results/<name>.json")
    args = parser.parse_args()
    detector = Detector.from_pretrained(str(args.model), str(args.key), DetectConfig(min_tokens=8))
    tok, key = detector.tokenizer, detector.key
    prompts = [tok(p, add_special_tokens=False).input_ids for p in read_json(args.prompts, "prompts")[-args.n :]]
    ids = sample_completions(detector.model, tok, prompts, args.new_tokens, seed=7, batch_size=args.n, progress=False)
    perms = permutations(key.secret, key.n_lists, args.mc)
    rows = []
    for length in LENGTHS:
        texts = tok.batch_decode([x[:length] for x in ids], skip_special_tokens=True)
        results = detector.detect(texts)
        items = detector._prepare(texts, None, False)
        stats, spans, hidden, targets = detector._score_batch(items)
        for r, span in zip(results, spans, strict=True):
            _, p_mc, _ = permutation_pvalue(stats.selector[span], stats.residual[span], perms, key.delta)
            statistic = float(stats.centred[span].double().sum())
            terms = tail_terms(
                hidden[span], targets[span], detector.weight, key, stats.selector[span], stats.lse_orig[span], statistic
            )
            rows.append(
                {
                    "length": length,
                    "n_tokens": r.n_tokens,
                    "p_reported": r.p_value,
                    "p_mc_999": r.detectors["permutation_p"],
                    "p_mc_1e5": p_mc,
                    "p_tail": chernoff_pvalue(terms, key.delta, key.gamma),
                }
            )
    resolved = [r for r in rows if r["p_tail"] is not None and r["p_mc_1e5"] >= 10 / args.mc]
    below = [r for r in resolved if r["p_tail"] < r["p_mc_1e5"] - 3 * np.sqrt(r["p_mc_1e5"] / args.mc)]
    summary = {
        "n_texts": args.n,
        "mc_permutations": args.mc,
        "per_length": {
            str(n): {
                "median_p_reported": float(np.median([r["p_reported"] for r in rows if r["length"] == n])),
                "median_p_mc_1e5": float(np.median([r["p_mc_1e5"] for r in rows if r["length"] == n])),
                "flagged_at_0.01": float(np.mean([r["p_reported"] <= 0.01 for r in rows if r["length"] == n])),
                "below_1e-6": float(np.mean([r["p_reported"] < 1e-6 for r in rows if r["length"] == n])),
            }
            for n in LENGTHS
        },
        "tail_and_mc_both_resolved": len(resolved),
        "tail_below_mc_beyond_error": len(below),
        "median_ratio_tail_over_mc": float(np.median([r["p_tail"] / r["p_mc_1e5"] for r in resolved]))
        if resolved
        else None,
        "rows": rows,
    }
    for n, s in summary["per_length"].items():
        print(
            f"{n:>4} tokens: median p reported {s['median_p_reported']:.2e} (MC 1e5: {s['median_p_mc_1e5']:.2e}), "
            f"flagged {s['flagged_at_0.01']:.2f}, p < 1e-6 {s['below_1e-6']:.2f}"
        )
    print(
        f"texts where both resolve: {len(resolved)}; tail below the 1e5 Monte-Carlo beyond 3 se: {len(below)}; "
        f"median tail / MC ratio {summary['median_ratio_tail_over_mc']}"
    )
    write_result(args.name, {"key_id": key.key_id, "delta": key.delta, **summary})


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
