"""How fast the packaged model samples on this machine, and what that sets as the floor of the default eval.

    python benchmarks/generate_speed.py [--model smollm2-135m] [--n 200] [--new-tokens 64]

Samples ``new_tokens`` after ``n`` held-out prompts of 50 tokens with ``openstamp.generate.sample_completions``
(what the eval calls), in float32 at batch 32 (the eval's batch before 2026-11-26) and at the eval's batch now
(``EvalConfig.batch_size``), and in bfloat16 at the eval's batch, interleaved; as the eval sampled before its
inverse-transform sampler, ``generate(do_sample=True)`` (``torch.multinomial``) at the eval's batch; and times a
plain forward pass over the same prompt + completion tokens as the in-run reference. The default eval samples
one completion set per generation family and default strength of the registry, and the unwatermarked one, 200
prompts x 200 new tokens each; at the measured float32 rate of its batch that stage alone takes
``default_eval_generation_min`` minutes.
Writes benchmarks/results/generate_speed.json.
"""

from __future__ import annotations

import argparse

import torch
from common import heldout_windows, interleaved, write_result

from openstamp import load_model
from openstamp.config import EvalConfig
from openstamp.evaluation.pipeline import configured
from openstamp.generate import sample_completions
from openstamp.methods import REGISTRY

BATCH = EvalConfig().batch_size
SETTINGS = {"float32_b32": ("float32", 32), "float32_eval": ("float32", BATCH), "bfloat16_eval": ("bfloat16", BATCH)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    models = {dtype: load_model(args.model, dtype=dtype) for dtype in ("float32", "bfloat16")}
    tokenizer = models["float32"][1]
    prompts = [p for p, _ in heldout_windows(tokenizer, args.n, 50, args.new_tokens)]
    done: dict[str, list[list[int]]] = {}

    def sampler(name: str):
        dtype, batch = SETTINGS[name]

        def run() -> None:
            model = models[dtype][0]
            done[name] = sample_completions(
                model, tokenizer, prompts, args.new_tokens, batch_size=batch, progress=False
            )

        return run

    def multinomial() -> None:  # sample_completions before InverseCDFSampler: generate's own sampling
        model = models["float32"][0]
        torch.manual_seed(0)
        with torch.inference_mode():
            for start in range(0, len(prompts), BATCH):
                rows = torch.tensor(prompts[start : start + BATCH])
                model.generate(
                    input_ids=rows,
                    attention_mask=torch.ones_like(rows),
                    max_new_tokens=args.new_tokens,
                    min_new_tokens=args.new_tokens,
                    do_sample=True,
                    top_k=0,
                    pad_token_id=tokenizer.eos_token_id,
                )

    def plain_forward() -> None:
        model = models["float32"][0]
        with torch.inference_mode():
            for start in range(0, len(prompts), 32):
                rows = [p + c for p, c in zip(prompts[start : start + 32], done["float32_b32"][start:], strict=False)]
                model(input_ids=torch.tensor(rows))

    # interleaved's warm-up runs each in order, so float32_b32 has sampled what plain_forward scores
    runs = {**{name: sampler(name) for name in SETTINGS}, "float32_eval_multinomial": multinomial}
    seconds = interleaved({**runs, "plain_forward": plain_forward}, args.repeats)
    sampled = args.n * args.new_tokens
    rates = {name: sampled / seconds[name] for name in runs}
    cfg = EvalConfig()
    methods = [configured(name, cfg) for name in REGISTRY]  # a set per generation family and default strength
    sets = 1 + len({(m.generation_family, m.strength_value) for m in methods})
    floor = sets * cfg.n * cfg.new_tokens / rates["float32_eval"] / 60
    result = {
        "settings": {**vars(args), "eval_batch": BATCH},
        "seconds": seconds,
        "sampled_tokens_per_s": rates,
        "plain_forward_tokens_per_s": args.n * (50 + args.new_tokens) / seconds["plain_forward"],
        "default_eval_sets": sets,
        "default_eval_generation_min": floor,
    }
    write_result("generate_speed", result)
    print(
        "sampled tokens/s on this machine: "
        + ", ".join(f"{name} {rate:.0f}" for name, rate in rates.items())
        + f" (a plain forward pass over prompt + completion: {result['plain_forward_tokens_per_s']:.0f} tokens/s). "
        f"The default eval samples {sets} sets of {cfg.n} x {cfg.new_tokens} tokens: {floor:.0f} min at float32 "
        f"batch {BATCH}, before any key, score or oracle"
    )


if __name__ == "__main__":
    main()
