"""A fine-tune of the base model, for the merge attack's "merge with a fine-tune" setting.

    python benchmarks/quality/base_finetune.py [--model smollm2-135m --out runs/base-ft --steps 100]

People merge a watermarked release with some other fine-tune of the same base. This writes one:
the base (not the watermarked release) fully fine-tuned with the shared training loop on the
offline instruction set (`openstamp.lab.attacks.instruct.build_offline_set`, seed 1, so its
examples differ from those of `attack instruct`, which uses seed 0). The checkpoint goes to
``--out`` (git-ignored runs/) through a temporary directory, with ``finetune.json`` beside the
weights recording the settings, the loss before and after, and the versions.

Then: ``openstamp attack merge --eval runs/eval --with runs/base-ft ...``.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from transformers import set_seed

from openstamp.lab.attacks.instruct import build_offline_set, instruction_batches
from openstamp.lab.training import TrainConfig, train
from openstamp.model.load import load_model
from openstamp.runtime import versions
from openstamp.storage import atomic_directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--out", default="runs/base-ft")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()

    set_seed(args.seed)
    model, tokenizer = load_model(args.model)
    rows = build_offline_set("news,wikipedia", args.examples, seed=args.seed)
    ids, labels = instruction_batches(tokenizer, rows, 128)
    cfg = TrainConfig(mode="full", steps=args.steps, every=args.steps, lr=args.lr, seed=args.seed)
    model.requires_grad_(True)
    start = time.perf_counter()
    losses = train(model, ids, cfg, labels=labels)
    seconds = time.perf_counter() - start
    record = {
        "command": "python benchmarks/quality/base_finetune.py",
        "model": args.model,
        "mode": "full",
        "data": f"offline instruction set (news,wikipedia key halves), {len(ids)} examples, seed {args.seed}",
        "steps": args.steps,
        "lr": args.lr,
        "batch": f"{cfg.batch_size} x {cfg.seq_len}",
        "loss_first_10": float(np.mean(losses[:10])),
        "loss_last_10": float(np.mean(losses[-10:])),
        "seconds": round(seconds, 1),
        "versions": versions(),
    }
    with atomic_directory(args.out, overwrite=args.overwrite) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "finetune.json").write_text(json.dumps(record, indent=2))
    print(
        f"fine-tuned {args.model} for {args.steps} full steps in {seconds:.0f} s: response loss "
        f"{record['loss_first_10']:.3f} -> {record['loss_last_10']:.3f}; written to {args.out}"
    )


if __name__ == "__main__":
    main()
