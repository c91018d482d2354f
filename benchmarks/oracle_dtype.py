"""What the perplexity oracle's dtype costs and changes: float32 against bfloat16, on the eval's kind of text.

    python benchmarks/oracle_dtype.py [--oracle gemma3-270m] [--model smollm2-135m] [--n 48] [--repeats 1]

Scores ``n`` held-out prompts' human continuations and ``n`` completions the packaged model samples after the same
prompts (200 tokens each, what the eval's oracle stage scores: ``openstamp.evaluation.oracle.perplexities``) under
the oracle loaded in float32 and in bfloat16, interleaved in one run after a warm-up on 4 texts. Reports the
seconds of each, their ratio, and how far each text's bfloat16 perplexity lies from its float32 one (relative).
The eval's ``oracle_dtype`` 'fast' picks bfloat16 where the processor computes it natively (``models.fast_dtype``).
Writes benchmarks/results/oracle_dtype.json.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from common import heldout_windows, write_result

from openstamp import load_model
from openstamp.evaluation.oracle import perplexities
from openstamp.generate import sample_completions
from openstamp.models import fast_dtype

DTYPES = ("float32", "bfloat16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--oracle", default="gemma3-270m")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=48)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, tokenizer = load_model(args.model)
    windows = heldout_windows(tokenizer, args.n, 50, args.new_tokens)
    prompts = tokenizer.batch_decode([p for p, _ in windows])
    sampled = sample_completions(
        model, tokenizer, [p for p, _ in windows], args.new_tokens, seed=args.seed, batch_size=args.n, progress=False
    )
    del model
    sets = {"human": tokenizer.batch_decode([h for _, h in windows]), "sampled": tokenizer.batch_decode(sampled)}
    oracles = {dtype: load_model(args.oracle, dtype=dtype) for dtype in DTYPES}
    for dtype in DTYPES:  # warm-up
        perplexities(*oracles[dtype], prompts[:4], sets["human"][:4])
    seconds = {dtype: [] for dtype in DTYPES}
    ppl = {}
    for _ in range(args.repeats):
        for dtype in DTYPES:
            start = time.perf_counter()
            ppl[dtype] = {name: perplexities(*oracles[dtype], prompts, texts) for name, texts in sets.items()}
            seconds[dtype].append(time.perf_counter() - start)
    median = {dtype: statistics.median(s) for dtype, s in seconds.items()}
    agreement = {}
    for name in sets:
        full, half = np.array(ppl["float32"][name]), np.array(ppl["bfloat16"][name])
        relative = half / full - 1
        agreement[name] = {
            "median_ppl_float32": float(np.median(full)),
            "median_ppl_bfloat16": float(np.median(half)),
            "mean_relative_difference": float(relative.mean()),
            "median_abs_relative_difference": float(np.median(abs(relative))),
            "max_abs_relative_difference": float(abs(relative).max()),
        }
    result = {
        "settings": vars(args),
        "fast_dtype_here": fast_dtype("cpu"),
        "texts": 2 * args.n,
        "seconds": median,
        "speedup_bfloat16": median["float32"] / median["bfloat16"],
        "agreement": agreement,
    }
    write_result("oracle_dtype", result)
    print(
        f"oracle {args.oracle} over {2 * args.n} texts of {args.new_tokens} tokens: float32 {median['float32']:.1f} s, "
        f"bfloat16 {median['bfloat16']:.1f} s ({result['speedup_bfloat16']:.2f}x; 'fast' here is "
        f"{result['fast_dtype_here']}); bfloat16 against float32, per text: "
        + "; ".join(
            f"{name} median ppl {a['median_ppl_float32']:.2f} -> {a['median_ppl_bfloat16']:.2f}, "
            f"mean {a['mean_relative_difference']:+.2%}, largest |difference| {a['max_abs_relative_difference']:.2%}"
            for name, a in agreement.items()
        )
    )


if __name__ == "__main__":
    main()
