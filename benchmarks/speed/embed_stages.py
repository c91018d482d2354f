"""Embedding cost per stage, and generation speed of the watermarked checkpoint vs the original.

    python benchmarks/speed/embed_stages.py [--profile default] [--skip-embed --out runs/demo]

1. Runs ``openstamp.embed`` on the packaged model at the given profile and reports each stage's
   wall time and peak resident memory (recorded in the key's metadata).
2. Samples the same prompts from the original model and from the exported checkpoint (loaded
   with plain transformers), interleaved A B A B, and reports tokens/s and their ratio. The
   watermark lives in the weights, so the ratio should be 1 (>= 0.98).
Writes benchmarks/results/embed_stages.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import interleaved, write_result  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from openstamp import WatermarkKey, embed, load_documents, load_profile, split_documents  # noqa: E402
from openstamp.model.generate import sample_completions  # noqa: E402
from openstamp.model.load import load_model  # noqa: E402
from openstamp.model.text import prompt_windows  # noqa: E402

STAGES = ("hidden_states", "sentence_embeddings", "projection", "selector", "green_lists")  # pipeline order


def stage_order(name: str) -> int:
    return STAGES.index(name) if name in STAGES else len(STAGES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="wikipedia")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-embed"))
    parser.add_argument("--skip-embed", action="store_true", help="reuse OUT/model and OUT/key")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    start = time.perf_counter()
    original, tokenizer = load_model(args.model)  # converts a packaged GGUF on the very first call
    first_load_s = time.perf_counter() - start
    start = time.perf_counter()
    original, tokenizer = load_model(args.model)  # from the cache, with the model code already imported
    load_s = time.perf_counter() - start
    if not args.skip_embed:
        start = time.perf_counter()
        embed(
            args.model,
            args.corpus,
            args.out / "model",
            args.out / "key",
            load_profile(args.profile),
            overwrite=True,
            progress=False,
        )
        embed_s = time.perf_counter() - start
    key = WatermarkKey.load(args.out / "key")
    stats = key.meta["stats"]
    released = AutoModelForCausalLM.from_pretrained(args.out / "model", dtype=torch.float32).eval()
    texts = [d.text for d in split_documents(load_documents("news"), "heldout")]
    prompts = [p for p, _ in prompt_windows(tokenizer, texts, 32, args.new_tokens, limit=args.prompts)]

    def run(model):
        return lambda: sample_completions(
            model, tokenizer, prompts, args.new_tokens, seed=0, batch_size=len(prompts), progress=False
        )

    seconds = interleaved({"original": run(original), "watermarked": run(released)}, args.repeats)
    tokens = len(prompts) * args.new_tokens
    speed = {k: tokens / v for k, v in seconds.items()}
    result = {
        "model": args.model,
        "corpus": args.corpus,
        "profile": key.meta["config"]["profile"],
        "first_model_load_in_process_s": round(first_load_s, 2),
        "cached_model_load_s": round(load_s, 2),
        "embed_total_s": None if args.skip_embed else round(embed_s, 1),
        "stage_seconds": {k: stats["timings_s"][k] for k in sorted(stats["timings_s"], key=stage_order)},
        "stage_peak_rss_mb": stats.get("peak_rss_mb"),
        "n_states": stats["n_states"],
        "selector": {k: v for k, v in stats["selector"].items() if k != "cluster_sizes"},
        "generation": {
            "batch": len(prompts),
            "new_tokens": args.new_tokens,
            "tokens_per_second": speed,
            "ratio_watermarked_to_original": speed["watermarked"] / speed["original"],
        },
    }
    write_result("embed_stages", result)
    print(f"\nembedding at profile {result['profile']} ({stats['n_states']} states):")
    print(f"  model load from the cache {load_s:.2f} s (first load in a fresh process {first_load_s:.2f} s)")
    for stage, s in result["stage_seconds"].items():
        print(f"  {stage:22s}{s:8.1f} s   peak {stats.get('peak_rss_mb', {}).get(stage, float('nan')):7.0f} MB")
    if not args.skip_embed:
        print(f"  total (incl. loading, saving){embed_s:8.1f} s")
    ratio = result["generation"]["ratio_watermarked_to_original"]
    print(
        f"generation, batch {len(prompts)} x {args.new_tokens} tokens: "
        f"original {speed['original']:.1f} tok/s, watermarked {speed['watermarked']:.1f} tok/s, "
        f"ratio {ratio:.3f}"
    )


if __name__ == "__main__":
    main()
