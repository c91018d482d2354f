"""The tail p-value against Monte-Carlo runs over permutations and over fresh keys, on real watermarked text.

    python benchmarks/fpr/tail_check.py [--model runs/fpr/model --key runs/fpr/key --n 32]

Watermarked completions of held-out prompts are cut to 16, 32, 64 and 100 scored tokens, so their
p-values span the range a 10^5-permutation run can resolve (>= 1e-4) and beyond it. For each
text it reports the permutation p-value with K = 999 (what ``detect`` computes), with K = 10^5,
the Chernoff tail bound (``openstamp.detect.tail``), the p-value ``detect`` reports, and the tail
over ``--mc-keys`` fresh keys: G drawn anew, every entry Bernoulli(gamma), the null the bound is
proved under. The two Monte-Carlo nulls differ: a permutation re-maps which list each cluster
selects, so it keeps the key's lists, while a fresh key redraws them. The fresh-key tail takes the
text's own tokens exactly and every other token (c = -B there: L x |V| terms, none large) as one
Gaussian with their exact variance. Writes benchmarks/results/tail_check.json (``--name``).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import write_result  # noqa: E402

from openstamp import DetectConfig, Detector  # noqa: E402
from openstamp.detect.llr import permutation_pvalue  # noqa: E402
from openstamp.detect.tail import TailTerms, chernoff_pvalue, tail_terms  # noqa: E402
from openstamp.key.prf import permutations  # noqa: E402
from openstamp.model.generate import sample_completions  # noqa: E402
from openstamp.storage import read_json  # noqa: E402

LENGTHS = (16, 32, 64, 100)


def fresh_key_pvalue(terms: TailTerms, delta: float, gamma: float, draws: int, generator, chunk: int = 2000) -> float:
    """(1 + #{X >= T - E T}) / (draws + 1), X = delta * sum (G' - gamma) c over fresh keys G' (tail.py's null)."""
    c = terms.coefficients.float().flatten() * delta
    rest = delta * math.sqrt(gamma * (1 - gamma) * terms.rest_sumsq)
    u, hits = terms.deviation, 0
    for start in range(0, draws, chunk):
        k = min(chunk, draws - start)
        g = (torch.rand(k, c.numel(), generator=generator) < gamma).float() - gamma
        x = (g @ c).double() + rest * torch.randn(k, generator=generator, dtype=torch.float64)
        hits += int((x >= u - 1e-9 * max(1.0, abs(u))).sum())
    return (1 + hits) / (draws + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("runs/fpr/model"))
    parser.add_argument("--key", type=Path, default=Path("runs/fpr/key"))
    parser.add_argument("--prompts", type=Path, default=Path("runs/fpr/texts/prompts.json"))
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--mc", type=int, default=100_000)
    parser.add_argument("--mc-keys", type=int, default=20_000, help="fresh keys per text (the bound's own null)")
    parser.add_argument("--name", default="tail_check", help="writes benchmarks/results/<name>.json")
    args = parser.parse_args()
    detector = Detector.from_pretrained(str(args.model), str(args.key), DetectConfig(min_tokens=8))
    tok, key = detector.tokenizer, detector.key
    prompts = [tok(p, add_special_tokens=False).input_ids for p in read_json(args.prompts, "prompts")[-args.n :]]
    ids = sample_completions(detector.model, tok, prompts, args.new_tokens, seed=7, batch_size=args.n, progress=False)
    perms = permutations(key.secret, key.n_lists, args.mc)
    generator = torch.Generator().manual_seed(0)
    rows = []
    for length in LENGTHS:
        texts = tok.batch_decode([x[:length] for x in ids], skip_special_tokens=True)
        results = detector.detect(texts)
        items = detector.prepare(texts)
        fwd = detector.forward(items)
        stats, spans, hidden, targets = detector.statistics(items, fwd), fwd.spans, fwd.hidden, fwd.targets
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
                    "p_mc_keys": fresh_key_pvalue(terms, key.delta, key.gamma, args.mc_keys, generator),
                }
            )
    resolved = [r for r in rows if r["p_tail"] is not None and r["p_mc_1e5"] >= 10 / args.mc]
    below = [r for r in resolved if r["p_tail"] < r["p_mc_1e5"] - 3 * np.sqrt(r["p_mc_1e5"] / args.mc)]
    # against fresh keys (old results have no p_mc_keys)
    resolved_keys = [r for r in rows if r["p_tail"] is not None and r["p_mc_keys"] >= 10 / args.mc_keys]
    below_keys = [r for r in resolved_keys if r["p_tail"] < r["p_mc_keys"] - 3 * np.sqrt(r["p_mc_keys"] / args.mc_keys)]
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
        "mc_keys": args.mc_keys,
        "tail_and_keys_mc_both_resolved": len(resolved_keys),
        "tail_below_keys_mc_beyond_error": len(below_keys),
        "median_ratio_tail_over_keys_mc": float(np.median([r["p_tail"] / r["p_mc_keys"] for r in resolved_keys]))
        if resolved_keys
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
    print(
        f"against {args.mc_keys} fresh keys: both resolve {len(resolved_keys)}; tail below beyond 3 se: "
        f"{len(below_keys)}; median tail / MC ratio {summary['median_ratio_tail_over_keys_mc']}"
    )
    write_result(args.name, {"key_id": key.key_id, "delta": key.delta, **summary})


if __name__ == "__main__":
    torch.manual_seed(0)
    main()
