"""What the eval's length curve costs OpenStamp on a re-tied key, scored from the original model.

    python benchmarks/retied_lengths.py [--base smollm2-135m --key runs/demo/key] [--n 48] [--cuts 16,32,64,128]

The eval scores every method from the original model. For a re-tied key (a tied model's default
release) OpenStamp's detector scores on a watermarked copy of it, since the release's input
embeddings are U~ too. The eval's hidden-state cache keeps states per model object, so it serves
the length curve's cut texts only if the same copy scores them that scored the full texts. This
script scores ``n`` held-out texts of ``length`` tokens, then each cut to ``--cuts`` scored tokens
(decoded and scored again, as the length stage does), inside one cache, two ways, interleaved:

* ``one_method``: one method instance for every call (the eval now: its detector and copy are kept);
* ``method_per_call``: a new instance per call (as before: a new copy, and its decoder, per call).

Since dec7977 the kept detector also keeps each text's per-token statistics, so ``one_method`` takes a cut
text's statistics from its full text too (``statistics_memo_hits``), besides its decoder states.

It checks that both give the same scores and reports seconds, their ratio and the cache's counts.
Writes benchmarks/results/retied_lengths.json.
"""

from __future__ import annotations

import argparse

from common import interleaved, write_result
from detect_speed import windows

from openstamp import WatermarkKey, load_model
from openstamp.hidden import HiddenCache, reusing
from openstamp.methods import create
from openstamp.patch import check_key, tied_head_mode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="smollm2-135m", help="the original model the key was made for")
    parser.add_argument("--key", default="runs/demo/key", help="a re-tied key of --base (`openstamp demo` makes one)")
    parser.add_argument("--n", type=int, default=48)
    parser.add_argument("--length", type=int, default=201, help="token ids per full text (the eval's 200 + 1)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--cuts", type=lambda v: [int(n) for n in v.split(",") if n], default=[16, 32, 64, 128])
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    key = WatermarkKey.load(args.key)
    base, tokenizer = load_model(args.base)
    if tied_head_mode(key) != "retie" or check_key(base, key) != "original":
        raise SystemExit(f"{args.key} is not a re-tied key of {args.base}'s original head")
    ids = windows(tokenizer, args.n, args.length)
    sets = [tokenizer.batch_decode(ids, skip_special_tokens=True)]
    sets += [tokenizer.batch_decode([x[: n + 1] for x in ids], skip_special_tokens=True) for n in args.cuts]
    caches: dict[str, HiddenCache] = {}
    scores: dict[str, list] = {}

    def method():
        made = create("openstamp")
        made.key = key
        return made

    memo_hits: dict[str, int] = {}

    def score(mode: str) -> None:
        caches[mode], one = HiddenCache(), method()
        with reusing(caches[mode]):
            scorer = (lambda: one) if mode == "one_method" else method
            scores[mode] = [[r.score for r in scorer().score(base, tokenizer, t, args.batch)] for t in sets]
            memo_hits[mode] = one._detector(base, tokenizer, args.batch).memo.hits if mode == "one_method" else 0

    seconds = interleaved(
        {mode: lambda mode=mode: score(mode) for mode in ("one_method", "method_per_call")}, args.repeats
    )
    kept, fresh, counts = scores["one_method"], scores["method_per_call"], caches  # counts: of the last repeat
    gap = max(
        (abs(a - b) for x, y in zip(kept, fresh, strict=True) for a, b in zip(x, y, strict=True) if a is not None),
        default=0.0,
    )
    result = {
        "settings": {**vars(args), "scored_sets": len(sets)},
        "seconds": seconds,
        "speedup": seconds["method_per_call"] / seconds["one_method"],
        "max_score_difference": gap,
        "cache": {k: {"hits": c.hits, "prefix_hits": c.prefix_hits, "misses": c.misses} for k, c in counts.items()},
        "statistics_memo_hits": memo_hits,  # cut texts whose per-token statistics came from their full text's
    }
    write_result("retied_lengths", result)
    print(
        f"{args.n} texts of {args.length - 1} scored tokens, then cut to {args.cuts}, OpenStamp on a re-tied key from "
        f"the original model: {seconds['method_per_call']:.1f} s with a new method per call, "
        f"{seconds['one_method']:.1f} s with one ({result['speedup']:.2f}x); decoder batches served from longer "
        f"texts' states {counts['one_method'].prefix_hits} (against {counts['method_per_call'].prefix_hits}), "
        f"run {counts['one_method'].misses} (against {counts['method_per_call'].misses}); "
        f"largest score difference {gap:.1e}"
    )


if __name__ == "__main__":
    main()
