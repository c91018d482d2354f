"""What the eval saves by running the decoder once for texts that several detectors score.

    python benchmarks/score_reuse.py [--model runs/demo/model --key runs/demo/key] [--n 64] [--length 114]

A sweep scores the same human continuations (and each seed's unwatermarked completions) once per
method and strength. Inside ``openstamp.hidden.reusing`` (the eval's score and length stages),
``final_hidden`` returns the hidden states it already computed for the same model and batch. This
script scores ``n`` held-out human texts of ``length`` tokens (the sweep's 50 + 64) with OpenStamp's
detector at each of ``--deltas`` (one detector per strength, as the sweep does), with and without
the reuse, interleaved; checks that both give identical scores; and reports seconds and their ratio.
Writes benchmarks/results/score_reuse.json.
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
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    model, tokenizer, key = load_release(args)
    texts = tokenizer.batch_decode(windows(tokenizer, args.n, args.length), skip_special_tokens=True)
    cfg = DetectConfig(batch_size=args.batch, check_key=False)  # the key at other deltas: not this release's
    detectors = [Detector(model, tokenizer, dataclasses.replace(key, delta=d), cfg) for d in args.deltas]
    caches: list[HiddenCache] = []

    def plain():
        return [[r.score for r in det.detect(texts)] for det in detectors]

    def reused():
        caches.append(HiddenCache())
        with reusing(caches[-1]):
            return plain()

    same = plain() == reused()
    seconds = interleaved({"without_reuse": plain, "with_reuse": reused}, repeats=args.repeats)
    result = {
        "settings": {**{k: v for k, v in vars(args).items() if k not in ("model", "key")}, "model": str(args.model)},
        "scored_texts": len(texts) * len(detectors),
        "identical_scores": same,
        "seconds": seconds,
        "speedup": seconds["without_reuse"] / seconds["with_reuse"],
        "hits_misses": [caches[-1].hits, caches[-1].misses],
    }
    write_result("score_reuse", result)
    print(
        f"{len(detectors)} detectors x {len(texts)} texts of {args.length} tokens: "
        f"{seconds['without_reuse']:.1f} s without reuse, {seconds['with_reuse']:.1f} s with it "
        f"({result['speedup']:.2f}x; decoder batches reused {caches[-1].hits} of "
        f"{caches[-1].hits + caches[-1].misses}); identical scores: {same}"
    )


if __name__ == "__main__":
    main()
