"""What the eval saves by starting a watermark's own perplexity from the original model's hidden states.

    python benchmarks/own_ppl_reuse.py [--model smollm2-135m] [--n 64] [--repeats 1]

A sweep measures the model's own perplexity on the same human continuations once per method and
strength. A watermark that leaves the decoder alone (``WatermarkMethod.keeps_hidden``: the
decode-time methods, and Unremovable's lm_head bias) changes only the logits, so inside
``openstamp.hidden.reusing`` the eval's own-perplexity stage takes the original model's hidden
states from the pass it made for the original's own perplexity. This script does what the sweep
does for KGW (a logits processor) and Unremovable (a weight patch) at each of their sweep
strengths on ``n`` held-out windows of 50 + 64 tokens: the original's pass and one pass per
strength, with and without the reuse, interleaved; checks that both give the same NLLs; and
reports seconds and their ratio. As a reference measured in the same run, ``plain_forward`` is the Hugging Face
loss of the original model on the same windows (``model(input_ids, labels=...)``, the prompt's labels -100): one
pass of own perplexity against it says what the stage costs beyond a forward pass. Writes
benchmarks/results/own_ppl_reuse.json.
"""

from __future__ import annotations

import argparse

import torch
from common import heldout_windows, interleaved, write_result

from openstamp import load_documents, load_model, split_documents
from openstamp.evaluation.own_ppl import window_nll
from openstamp.hidden import HiddenCache, reusing
from openstamp.methods import create
from openstamp.text import bos_prefix

STRENGTHS = {"kgw": (0.5, 1.0, 1.5, 2.0), "unremovable": (0.2, 0.4, 0.6, 0.8)}  # the sweep's grids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    model, tokenizer = load_model(args.model)
    key_docs = split_documents(load_documents("wikipedia"), "key")
    pairs = [(bos_prefix(tokenizer) + p, h) for p, h in heldout_windows(tokenizer, args.n, 50, 64)]
    variants = []
    for name, grid in STRENGTHS.items():
        method = create(name)
        method.build(model, tokenizer, key_docs, args.seed)
        variants += [method.with_strength(s) for s in grid]
    assert all(v.keeps_hidden for v in variants)
    caches: list[HiddenCache] = []

    def passes() -> list[list[float]]:
        nll = [window_nll(model, pairs, None, args.batch)]
        for variant in variants:
            variant.apply(model)
            try:
                nll.append(window_nll(model, pairs, variant.logits_processor(), args.batch))
            finally:
                variant.revert(model)
        return nll

    def reused() -> list[list[float]]:
        caches.append(HiddenCache())
        with reusing(caches[-1]):
            return passes()

    def plain_forward() -> None:
        with torch.inference_mode():
            for start in range(0, len(pairs), args.batch):
                ids = torch.tensor([p + h for p, h in pairs[start : start + args.batch]])
                labels = ids.clone()
                labels[:, : len(pairs[start][0])] = -100
                model(input_ids=ids, labels=labels)

    fresh, again = passes(), reused()
    gap = max(abs(a - b) for x, y in zip(fresh, again, strict=True) for a, b in zip(x, y, strict=True))
    seconds = interleaved(
        {"without_reuse": passes, "with_reuse": reused, "plain_forward": plain_forward}, repeats=args.repeats
    )
    result = {
        "settings": vars(args),
        "passes": 1 + len(variants),
        "methods": {name: list(grid) for name, grid in STRENGTHS.items()},
        "max_nll_difference": gap,
        "seconds": seconds,
        "speedup": seconds["without_reuse"] / seconds["with_reuse"],
        # one pass without reuse (the original's own perplexity) against Hugging Face's loss on the same windows
        "pass_over_plain_forward": seconds["without_reuse"] / (1 + len(variants)) / seconds["plain_forward"],
        "hits_misses": [caches[-1].hits, caches[-1].misses],
    }
    write_result("own_ppl_reuse", result)
    print(
        f"own perplexity of the original and of {len(variants)} keeps-hidden variants on {args.n} windows: "
        f"{seconds['without_reuse']:.1f} s without reuse, {seconds['with_reuse']:.1f} s with it "
        f"({result['speedup']:.2f}x; decoder batches reused {caches[-1].hits} of "
        f"{caches[-1].hits + caches[-1].misses}); largest NLL difference {gap:.2e}; one pass without reuse "
        f"{result['pass_over_plain_forward']:.2f}x the time of Hugging Face's loss ({seconds['plain_forward']:.1f} s)"
    )


if __name__ == "__main__":
    main()
