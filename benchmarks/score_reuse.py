"""What the eval saves by running the decoder once for texts that several detectors score.

    python benchmarks/score_reuse.py [--model runs/demo/model --key runs/demo/key] [--n 64] [--cuts 16,32]

A sweep scores the same human continuations (and each seed's unwatermarked completions) once per
method and strength, and then each text cut to the length curve's lengths. Inside
``openstamp.hidden.reusing`` (the eval's score and length stages), ``final_hidden`` returns the
hidden states it already computed for the same model and batch, and a text cut from a scored one
takes the first states of that text's. This script scores ``n`` held-out human texts of ``length``
tokens (the sweep's 50 + 64) with OpenStamp's detector at each of ``--deltas`` (one detector per
strength, as the sweep does), then each text cut to ``--cuts`` tokens (decoded and scored again,
as the length stage does), with and without the reuse, interleaved; compares the scores (the full
texts' must be identical; a cut text's states come from a longer pass, so they may differ in float
rounding); and reports seconds and their ratio. Writes benchmarks/results/score_reuse.json.
"""

from __future__ import annotations

import argparse
import dataclasses

from common import add_release_arguments, deltas, interleaved, load_release, write_result
from detect_speed import windows

from openstamp import DetectConfig, Detector
from openstamp.hidden import HiddenCache, reusing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_release_arguments(parser)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--length", type=int, default=114)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--deltas", type=deltas, default=(0.25, 0.5, 0.75, 1.0))
    parser.add_argument("--cuts", type=lambda v: [int(n) for n in v.split(",") if n], default=[16, 32])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model, tokenizer, key = load_release(args)
    ids = windows(tokenizer, args.n, args.length)
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    cut = [tokenizer.batch_decode([x[: n + 1] for x in ids], skip_special_tokens=True) for n in args.cuts]
    cfg = DetectConfig(batch_size=args.batch, check_key=False)  # the key at other deltas: not this release's
    detectors = [Detector(model, tokenizer, dataclasses.replace(key, delta=d), cfg) for d in args.deltas]
    caches: list[HiddenCache] = []

    def plain():
        full = [[r.score for r in det.detect(texts)] for det in detectors]
        return full, [[r.score for r in det.detect(part)] for det in detectors for part in cut]

    def reused():
        caches.append(HiddenCache())
        with reusing(caches[-1]):
            return plain()

    (full, parts), (full_reused, parts_reused) = plain(), reused()
    same = full == full_reused
    gap = max(
        (
            abs(a - b)
            for x, y in zip(parts, parts_reused, strict=True)
            for a, b in zip(x, y, strict=True)
            if a is not None
        ),
        default=0.0,
    )
    seconds = interleaved({"without_reuse": plain, "with_reuse": reused}, repeats=args.repeats)
    result = {
        "settings": {**{k: v for k, v in vars(args).items() if k not in ("model", "key")}, "model": str(args.model)},
        "scored_texts": len(texts) * len(detectors) * (1 + len(cut)),
        "identical_scores": same,
        "cut_max_score_difference": gap,
        "seconds": seconds,
        "speedup": seconds["without_reuse"] / seconds["with_reuse"],
        "hits_misses": [caches[-1].hits, caches[-1].misses],
        "prefix_hits": caches[-1].prefix_hits,
    }
    write_result("score_reuse", result)
    print(
        f"{len(detectors)} detectors x {len(texts)} texts of {args.length} tokens, then cut to {args.cuts}: "
        f"{seconds['without_reuse']:.1f} s without reuse, {seconds['with_reuse']:.1f} s with it "
        f"({result['speedup']:.2f}x; decoder batches reused {caches[-1].hits}, served from longer texts' "
        f"{caches[-1].prefix_hits}, run {caches[-1].misses}); full-length scores identical: {same}; "
        f"cut texts' largest score difference {gap:.1e}"
    )


if __name__ == "__main__":
    main()
