"""What the detectors' decoder dtype costs and changes: float32 against bfloat16 autocast, on the eval's texts.

    python benchmarks/score_dtype.py [--model runs/demo/model] [--key runs/demo/key] [--n 32] [--new-tokens 200]

The eval runs its detectors' decoders under bfloat16 autocast where the processor computes it natively
(``score_dtype`` 'fast': ``openstamp.hidden.autocast_decoder``; the head statistics stay float32). This scores ``n``
held-out human continuations, ``n`` completions of the release and ``n`` of the original model (the same prompts)
with OpenStamp's detector, its decoder in float32 and under bfloat16 autocast, one after the other after a
warm-up, and reports the seconds of each, their ratio, how far each text's score (mean LLR) moves against the
spread of scores in its set, and how many p <= 0.01 decisions differ. Writes benchmarks/results/score_dtype.json.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from common import add_release_arguments, heldout_windows, load_release, write_result

from openstamp import Detector, load_model
from openstamp.config import DetectConfig
from openstamp.generate import sample_completions
from openstamp.hidden import autocast_decoder
from openstamp.models import fast_dtype

DTYPES = ("float32", "bfloat16")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_release_arguments(parser)
    parser.add_argument("--original", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16, help="detection batch (the eval's score_batch_size)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    release, tokenizer, key = load_release(args)
    original, _ = load_model(args.original)
    windows = heldout_windows(tokenizer, args.n, 50, args.new_tokens)
    prompts = [p for p, _ in windows]
    sample = lambda model: sample_completions(  # noqa: E731
        model, tokenizer, prompts, args.new_tokens, seed=args.seed, batch_size=args.n, progress=False
    )
    sets = {
        "human": tokenizer.batch_decode([h for _, h in windows]),
        "watermarked": tokenizer.batch_decode(sample(release), skip_special_tokens=True),
        "original": tokenizer.batch_decode(sample(original), skip_special_tokens=True),
    }
    detector = Detector(release, tokenizer, key, DetectConfig(batch_size=args.batch))
    for dtype in DTYPES:  # warm-up
        with autocast_decoder(dtype):
            detector.detect(sets["human"][:4])
    seconds, results = {}, {}
    for dtype in DTYPES:
        start = time.perf_counter()
        with autocast_decoder(dtype):
            results[dtype] = {name: detector.detect(texts) for name, texts in sets.items()}
        seconds[dtype] = time.perf_counter() - start
    agreement = {}
    for name in sets:
        full, half = results["float32"][name], results["bfloat16"][name]
        score = np.array([[r.score for r in full], [r.score for r in half]])
        p = np.array([[r.p_value for r in full], [r.p_value for r in half]])
        moved = abs(score[1] - score[0])
        agreement[name] = {
            "score_sd_float32": float(score[0].std()),
            "median_abs_score_difference": float(np.median(moved)),
            "max_abs_score_difference": float(moved.max()),
            "flagged_float32": int((p[0] <= 0.01).sum()),
            "flagged_bfloat16": int((p[1] <= 0.01).sum()),
            "decisions_differ": int(((p[0] <= 0.01) != (p[1] <= 0.01)).sum()),
            "max_abs_log10_p_ratio": float(abs(np.log10(p[1]) - np.log10(p[0])).max()),
        }
    tokens = sum(r.n_tokens for rows in results["float32"].values() for r in rows)
    result = {
        "settings": {**vars(args), "model": str(args.model), "key": str(args.key)},
        "fast_dtype_here": fast_dtype("cpu"),
        "texts": 3 * args.n,
        "scored_tokens": tokens,
        "seconds": seconds,
        "speedup_bfloat16": seconds["float32"] / seconds["bfloat16"],
        "agreement": agreement,
    }
    write_result("score_dtype", result)
    print(
        f"OpenStamp's detector on {3 * args.n} texts ({tokens} scored tokens): decoder in float32 "
        f"{seconds['float32']:.1f} s, under bfloat16 autocast {seconds['bfloat16']:.1f} s "
        f"({result['speedup_bfloat16']:.2f}x; 'fast' here is {result['fast_dtype_here']}); per text, bfloat16 against "
        "float32: "
        + "; ".join(
            f"{name}: |score difference| median {a['median_abs_score_difference']:.1e}, largest "
            f"{a['max_abs_score_difference']:.1e} (scores' sd {a['score_sd_float32']:.3f}), flagged at p <= 0.01 "
            f"{a['flagged_float32']} -> {a['flagged_bfloat16']} of {args.n} ({a['decisions_differ']} differ)"
            for name, a in agreement.items()
        )
    )


if __name__ == "__main__":
    main()
