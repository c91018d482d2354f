"""How fast the packaged model samples on this machine, and what that sets as the floor of the default eval.

    python benchmarks/speed/generate_speed.py [--model smollm2-135m] [--n 200] [--new-tokens 64]

Samples ``new_tokens`` after ``n`` held-out prompts of 50 tokens with ``openstamp.model.generate.sample_completions``
(what the eval calls) at the eval's batch (``EvalConfig.batch_size``): with the float32 model, with the model
loaded in bfloat16 (PyTorch's scaled-dot-product attention), and with what the eval samples from
(``models.sampling_copy``: a copy cast to its ``sample_dtype``, 'fast' here, with eager attention), interleaved;
and times a plain forward pass over the same prompt + completion tokens as the in-run reference. So that a
faster sampler is seen not to sample another distribution, the float32 model scores each set's completions
(mean negative log-likelihood per token, with its bootstrap interval). The default eval samples one completion
set per generation family and default strength of the registry, and the unwatermarked one, 200 prompts x 200 new
tokens each; at the measured rate of its sampler that stage alone takes ``default_eval_generation_min`` minutes.
Writes benchmarks/results/generate_speed.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import heldout_windows, interleaved, write_result  # noqa: E402

from openstamp import load_model  # noqa: E402
from openstamp.lab.evaluation.config import EvalConfig  # noqa: E402
from openstamp.lab.evaluation.metrics import bootstrap_ci  # noqa: E402
from openstamp.lab.evaluation.pipeline import configured  # noqa: E402
from openstamp.lab.methods import REGISTRY  # noqa: E402
from openstamp.model.generate import sample_completions  # noqa: E402
from openstamp.model.load import fast_dtype, sampling_copy  # noqa: E402
from openstamp.model.perplexity import window_nll  # noqa: E402

BATCH = EvalConfig().batch_size
SAMPLE_DTYPE = fast_dtype("cpu") if EvalConfig().sample_dtype == "fast" else EvalConfig().sample_dtype
SETTINGS = ("float32", "bfloat16_sdpa", "eval_sampler")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    full, tokenizer = load_model(args.model)
    models = {
        "float32": full,
        "bfloat16_sdpa": load_model(args.model, dtype="bfloat16")[0],
        "eval_sampler": sampling_copy(full, SAMPLE_DTYPE),
    }
    prompts = [p for p, _ in heldout_windows(tokenizer, args.n, 50, args.new_tokens)]
    done: dict[str, list[list[int]]] = {}

    def sampler(name: str):
        def run() -> None:
            done[name] = sample_completions(
                models[name], tokenizer, prompts, args.new_tokens, batch_size=BATCH, progress=False
            )

        return run

    def plain_forward() -> None:
        with torch.inference_mode():
            for start in range(0, len(prompts), 32):
                rows = [p + c for p, c in zip(prompts[start : start + 32], done["float32"][start:], strict=False)]
                full(input_ids=torch.tensor(rows))

    # interleaved's warm-up runs each in order, so float32 has sampled what plain_forward scores
    seconds = interleaved({**{name: sampler(name) for name in SETTINGS}, "plain_forward": plain_forward}, args.repeats)
    sampled = args.n * args.new_tokens
    rates = {name: sampled / seconds[name] for name in SETTINGS}
    cfg = EvalConfig()
    methods = [configured(name, cfg) for name in REGISTRY]  # a set per generation family and default strength
    sets = 1 + len({(m.generation_family, m.strength_value) for m in methods})
    floor = sets * cfg.n * cfg.new_tokens / rates["eval_sampler"] / 60
    result = {
        "settings": {**vars(args), "eval_batch": BATCH, "eval_sample_dtype": SAMPLE_DTYPE},
        "seconds": seconds,
        "sampled_tokens_per_s": rates,
        "plain_forward_tokens_per_s": args.n * (50 + args.new_tokens) / seconds["plain_forward"],
        "completion_nll_float32_model": {name: nll(full, prompts, done[name]) for name in SETTINGS},
        "default_eval_sets": sets,
        "default_eval_generation_min": floor,
    }
    nlls = result["completion_nll_float32_model"]
    write_result("generate_speed", result)
    print(
        "sampled tokens/s on this machine: "
        + ", ".join(f"{name} {rate:.0f}" for name, rate in rates.items())
        + f" (a plain forward pass over prompt + completion: {result['plain_forward_tokens_per_s']:.0f} tokens/s); "
        "the completions' NLL per token under the float32 model: "
        + ", ".join(f"{k} {v['mean']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]" for k, v in nlls.items())
        + f". The default eval samples {sets} sets of {cfg.n} x {cfg.new_tokens} tokens: {floor:.0f} min with its "
        f"sampler ({SAMPLE_DTYPE}, batch {BATCH}), before any key, score or oracle"
    )


def nll(model, prompts: list[list[int]], completions: list[list[int]]) -> dict:
    """Mean negative log-likelihood per completion token under ``model`` (prompt as context), with a 95% bootstrap
    interval over texts."""
    with torch.inference_mode():
        per_text = window_nll(model, list(zip(prompts, completions, strict=True)), batch_size=32)
    return {"mean": float(np.mean(per_text)), "ci": list(bootstrap_ci(per_text))}


if __name__ == "__main__":
    main()
