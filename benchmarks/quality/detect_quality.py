"""Detection quality on the packaged model: watermarked completions against human continuations.

    python benchmarks/quality/detect_quality.py [--model runs/demo/model --key runs/demo/key --n 200]

Prompts are 50-token windows of held-out news and Wikipedia documents (never those that built
the key); completions are 200 new tokens sampled from the watermarked checkpoint (temperature 1,
top-p 1); negatives are the real next 200 tokens. Every figure is measured on decoded text, as
users submit it, and once more on the generated token ids to show what re-tokenisation costs.
Writes benchmarks/results/detect_quality.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import DEMO, ensure_key, heldout_windows, write_result  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from openstamp import DetectConfig, Detector, WatermarkKey  # noqa: E402
from openstamp.lab.evaluation.metrics import auroc, tpr_at_fpr  # noqa: E402
from openstamp.model.generate import sample_completions  # noqa: E402
from openstamp.model.load import load_tokenizer  # noqa: E402

DETECTORS = {  # name -> how to read a score from a result (higher = more watermarked)
    "llr": lambda r: r.detectors["llr"],
    "centred_llr": lambda r: r.detectors["centred_llr"],
    "permutation_p": lambda r: -r.p_value,
    "discrete_llr": lambda r: r.detectors["discrete_llr"],
    "binomial_z": lambda r: r.detectors["binomial_z"],
}


def evaluate(positives, negatives) -> dict:
    out = {}
    for name, read in DETECTORS.items():
        pos, neg = [read(r) for r in positives], [read(r) for r in negatives]
        out[name] = {
            "auroc": auroc(pos, neg),
            "tpr_at_1pct_fpr": tpr_at_fpr(pos, neg, 0.01),
            "mean_positive": float(np.mean(pos)),
            "mean_negative": float(np.mean(neg)),
        }
    flagged = {
        "positives": float(np.mean([r.decision for r in positives])),
        "negatives": float(np.mean([r.decision for r in negatives])),
    }
    return {"detectors": out, "flagged_at_p_0.01": flagged}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEMO / "model")
    parser.add_argument("--key", type=Path, default=DEMO / "key")
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--prompt-tokens", type=int, default=50)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    ensure_key(args.model, args.key)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    tokenizer = load_tokenizer(str(args.model))
    key = WatermarkKey.load(args.key)
    exclude = {d["sha256"] for d in key.meta.get("corpus", {}).get("documents", [])}
    windows = heldout_windows(tokenizer, args.n, args.prompt_tokens, args.new_tokens, exclude)
    start = time.perf_counter()
    generated = sample_completions(
        model, tokenizer, [p for p, _ in windows], args.new_tokens, seed=args.seed, batch_size=args.batch
    )
    generation_s = time.perf_counter() - start
    detector = Detector(model, tokenizer, key, DetectConfig(batch_size=16))
    decoded = tokenizer.batch_decode(generated, skip_special_tokens=True)
    human = tokenizer.batch_decode([c for _, c in windows], skip_special_tokens=True)
    start = time.perf_counter()
    on_text, on_human = detector.detect(decoded, progress=True), detector.detect(human, progress=True)
    detection_s = time.perf_counter() - start
    on_ids = detector.detect(generated, progress=True)
    same_ids = np.mean(
        [tokenizer(t, add_special_tokens=False).input_ids == g for t, g in zip(decoded, generated, strict=True)]
    )
    text_eval, ids_eval = evaluate(on_text, on_human), evaluate(on_ids, on_human)
    write_result(
        "detect_quality",
        {
            "model": str(args.model),
            "key_id": key.key_id,
            "gamma": key.gamma,
            "delta": key.delta,
            "n_lists": key.n_lists,
            "n": args.n,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "seed": args.seed},
            "on_decoded_text": text_eval,
            "on_generated_ids": ids_eval,
            "retokenisation": {
                "fraction_identical_ids": float(same_ids),
                "mean_llr_text": float(np.mean([r.score for r in on_text])),
                "mean_llr_ids": float(np.mean([r.score for r in on_ids])),
            },
            "seconds": {"generation": generation_s, "detection_text_and_human": detection_s},
        },
    )
    print(
        f"\n{args.n} watermarked completions vs {args.n} human continuations ({args.new_tokens} tokens, "
        f"delta {key.delta}, gamma {key.gamma}, L {key.n_lists})"
    )
    print(f"{'detector':16s}{'AUROC':>8s}{'TPR@1%':>8s}{'AUROC ids':>11s}{'TPR@1% ids':>12s}")
    for name in DETECTORS:
        t, i = text_eval["detectors"][name], ids_eval["detectors"][name]
        print(
            f"{name:16s}{t['auroc']:8.3f}{t['tpr_at_1pct_fpr']['tpr']:8.3f}{i['auroc']:11.3f}"
            f"{i['tpr_at_1pct_fpr']['tpr']:12.3f}"
        )
    print(
        f"decode-then-encode gives back the same ids for {same_ids:.0%} of completions; "
        f"flagged at p <= 0.01: {text_eval['flagged_at_p_0.01']}"
    )


if __name__ == "__main__":
    main()
