"""What the own-perplexity stage's decoder dtype costs and changes: float32 against bfloat16 autocast.

    python benchmarks/own_ppl_dtype.py [--model smollm2-135m] [--n 200] [--repeats 1]

The eval measures the watermarked model's own perplexity on the human continuations with its decoder under
bfloat16 autocast where the processor computes it natively (``own_ppl_dtype`` 'fast': ``openstamp.hidden
.autocast_decoder``; the head, the softmax and the NLL stay float32). This scores ``n`` held-out windows of 50 + 64
tokens (the sweep's) with the original model and with the weight-level watermarks whose own perplexity runs the
decoder (OpenStamp w/o sem-align re-tied into the input embeddings, GaussMark's MLP noise) at the weak and the
strong end of the sweep's grids, in float32 and under bfloat16 autocast, the two interleaved, and reports the
seconds of each, their ratio, each variant's own-PPL change against the original (with its paired 95% bootstrap
interval) in both dtypes, and how far each window's NLL moves. The change is the quality axis of the sweep, so
what matters is how far it moves against its own interval. Writes benchmarks/results/own_ppl_dtype.json.
"""

from __future__ import annotations

import argparse

import numpy as np
from common import heldout_windows, interleaved, write_result

from openstamp import load_documents, load_model, split_documents
from openstamp.evaluation.own_ppl import change, window_nll
from openstamp.hidden import autocast_decoder
from openstamp.methods import create
from openstamp.models import fast_dtype
from openstamp.text import bos_prefix

STRENGTHS = {"openstamp-nosem": (0.25, 1.0), "gaussmark": (0.1, 0.4)}  # each end of the sweep's grids
DTYPES = ("float32", "bfloat16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16, help="the eval's score_batch_size")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, tokenizer = load_model(args.model)
    key_docs = split_documents(load_documents("wikipedia"), "key")
    exclude = {d.sha256 for d in key_docs}
    pairs = [(bos_prefix(tokenizer) + p, h) for p, h in heldout_windows(tokenizer, args.n, 50, 64, exclude)]
    variants = {"original": None}
    for name, grid in STRENGTHS.items():
        method = create(name)
        method.build(model, tokenizer, key_docs, args.seed)
        variants |= {f"{name}@{s:g}": method.with_strength(s) for s in grid}
    nll: dict[str, dict[str, list[float]]] = {dtype: {} for dtype in DTYPES}

    def passes(dtype: str) -> None:
        with autocast_decoder(dtype):
            for label, variant in variants.items():
                if variant is not None:
                    variant.apply(model)
                try:
                    nll[dtype][label] = window_nll(model, pairs, None, args.batch)
                finally:
                    if variant is not None:
                        variant.revert(model)

    seconds = interleaved({dtype: lambda d=dtype: passes(d) for dtype in DTYPES}, repeats=args.repeats)
    rows = {}
    for label in variants:
        full, half = (np.array(nll[d][label]) for d in DTYPES)
        row = {"nll_difference_mean": float((half - full).mean()), "nll_difference_max": float(abs(half - full).max())}
        if label != "original":
            for dtype in DTYPES:
                c = change(nll[dtype][label], nll[dtype]["original"])
                row[f"change_{dtype}"], row[f"change_ci_{dtype}"] = c["change"], c["ci"]
            row["change_moved_over_ci_width"] = abs(row["change_bfloat16"] - row["change_float32"]) / (
                row["change_ci_float32"][1] - row["change_ci_float32"][0]
            )
        rows[label] = row
    result = {
        "settings": vars(args),
        "fast_dtype_here": fast_dtype("cpu"),
        "passes": len(variants),
        "seconds": seconds,
        "speedup_bfloat16": seconds["float32"] / seconds["bfloat16"],
        "variants": rows,
    }
    write_result("own_ppl_dtype", result)
    moved = max(r["change_moved_over_ci_width"] for r in rows.values() if "change_moved_over_ci_width" in r)
    print(
        f"own perplexity of the original and {len(variants) - 1} variants on {args.n} windows of 50 + 64 tokens: "
        f"float32 {seconds['float32']:.1f} s, bfloat16 autocast {seconds['bfloat16']:.1f} s "
        f"({result['speedup_bfloat16']:.2f}x); "
        + "; ".join(
            f"{label} {r['change_float32']:+.2%} -> {r['change_bfloat16']:+.2%}"
            for label, r in rows.items()
            if label != "original"
        )
        + f"; the change moved by at most {moved:.1%} of its 95% interval's width"
    )


if __name__ == "__main__":
    main()
