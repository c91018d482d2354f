"""KGW-distilled's distillation in float32 against bfloat16 autocast: seconds per step and what the student learns.

    python benchmarks/distill_precision.py [--model smollm2-135m] [--steps 60] [--heldout 32]

Distils the packaged model towards the KGW teacher (delta 2, the baseline's default) twice from the same seed, on
the eval's key-building windows, once per ``autocast`` setting, in turn (float32 first). Each run reports its
seconds per step, its loss over the first and last tenth of the steps, and the student's KL to the teacher on
``--heldout`` windows of held-out documents, measured in float32 for both (``mean_teacher_kl``). The baseline's
default ``autocast`` is chosen by this comparison. Writes benchmarks/results/distill_precision.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from common import write_result

from openstamp import load_documents, load_model, split_documents
from openstamp.config import EvalConfig
from openstamp.methods.common import method_secret
from openstamp.methods.kgw import GreenLists
from openstamp.methods.kgw_distilled import KGWDistilledConfig, distill, mean_teacher_kl
from openstamp.training import training_windows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--heldout", type=int, default=32)
    args = parser.parse_args()
    model, tokenizer = load_model(args.model)
    documents = load_documents(EvalConfig().key_corpus)
    base = KGWDistilledConfig(steps=args.steps)
    windows = training_windows(tokenizer, split_documents(documents, "key"), base.seq_len)
    heldout = training_windows(tokenizer, split_documents(documents, "heldout"), base.seq_len)[: args.heldout]
    greens = GreenLists.for_model(method_secret("kgw-distilled", 0), model, tokenizer, base.gamma)
    runs = {}
    for autocast in ("float32", "bfloat16"):
        cfg = dataclasses.replace(base, autocast=autocast)
        start = time.perf_counter()
        student, losses = distill(model, windows, greens, cfg, seed=0)
        seconds = time.perf_counter() - start
        tenth = max(1, len(losses) // 10)
        runs[autocast] = {
            "seconds_per_step": seconds / len(losses),
            "loss_first_tenth": sum(losses[:tenth]) / tenth,
            "loss_last_tenth": sum(losses[-tenth:]) / tenth,
            "heldout_kl": mean_teacher_kl(student, model, greens, cfg.delta, heldout),
        }
        print(autocast, runs[autocast], flush=True)
        del student
    runs["heldout_kl_original"] = mean_teacher_kl(model, model, greens, base.delta, heldout)
    fp, bf = runs["float32"], runs["bfloat16"]
    runs["speedup"] = fp["seconds_per_step"] / bf["seconds_per_step"]
    write_result("distill_precision", {"settings": vars(args), **runs})
    kl0 = runs["heldout_kl_original"]
    print(
        f"held-out KL to the teacher: original {kl0:.4f}, float32 student {fp['heldout_kl']:.4f}, "
        f"bfloat16 student {bf['heldout_kl']:.4f}; step {fp['seconds_per_step']:.2f} s -> "
        f"{bf['seconds_per_step']:.2f} s ({runs['speedup']:.2f}x)"
    )


if __name__ == "__main__":
    main()
