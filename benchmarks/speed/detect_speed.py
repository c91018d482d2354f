"""Detection throughput against a plain forward pass on the same texts and batch, in one run.

    python benchmarks/speed/detect_speed.py [--model runs/demo/model --key runs/demo/key --name detect_speed]

Reports tokens/s of: a plain forward pass computing logits, the backbone alone, OpenStamp
detection (exact m; the older top-32 estimate of m; no permutation p-values), and the naive
detector that runs two full log-softmaxes over materialised U~ and U. Also a per-stage breakdown of the head and
the peak memory of detection at batch 32 x 256. Writes benchmarks/results/detect_speed.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import add_release_arguments, interleaved, load_release, write_result  # noqa: E402

from openstamp import DetectConfig, Detector, load_documents, split_documents  # noqa: E402
from openstamp.detect.llr import token_stats  # noqa: E402
from openstamp.model.hidden import final_hidden  # noqa: E402
from openstamp.model.text import encode  # noqa: E402
from openstamp.runtime import StageMonitor, current_rss_mb  # noqa: E402


def windows(tokenizer, n: int, length: int) -> list[list[int]]:
    texts = [d.text for d in split_documents(load_documents("wikipedia"), "heldout")]
    out = []
    for ids in encode(tokenizer, texts):
        out.extend(ids[i : i + length] for i in range(0, len(ids) - length + 1, length))
    if len(out) < n:
        raise SystemExit(f"only {len(out)} windows of {length} tokens available")
    return out[:n]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_release_arguments(parser)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--memory-batch", type=int, default=32)
    parser.add_argument("--memory-length", type=int, default=256)
    parser.add_argument("--name", default="detect_speed", help="results file benchmarks/results/<name>.json")
    args = parser.parse_args()
    model, tokenizer, key = load_release(args)
    seqs = windows(tokenizer, args.batch, args.length)
    ids = torch.tensor(seqs)
    mask = torch.ones_like(ids)
    cfg = dict(batch_size=args.batch, min_tokens=8)
    det = Detector(model, tokenizer, key, DetectConfig(**cfg))
    det_fast = Detector(model, tokenizer, key, DetectConfig(**cfg, p_values=False))
    det_top = Detector(model, tokenizer, key, DetectConfig(**cfg, centring_top_k=32))  # the older estimate of m
    u_wm = model.get_output_embeddings().weight.detach()
    u_orig = (u_wm.float() - key.delta_w()).to(u_wm.dtype)  # materialised once, as the reference code does

    @torch.inference_mode()
    def naive():
        h = final_hidden(model, ids, mask)[:, :-1]
        target = ids[:, 1:, None]
        lp_wm = torch.log_softmax(F.linear(h, u_wm).float(), -1).gather(-1, target)
        lp_orig = torch.log_softmax(F.linear(h, u_orig).float(), -1).gather(-1, target)
        return (lp_wm - lp_orig).mean()

    @torch.inference_mode()
    def forward():
        return model(input_ids=ids, attention_mask=mask).logits

    fns = {
        "plain_forward": forward,
        "backbone_only": lambda: final_hidden(model, ids, mask),
        "openstamp_detect": lambda: det.detect(seqs),
        "openstamp_detect_top32_m": lambda: det_top.detect(seqs),
        "openstamp_detect_no_pvalues": lambda: det_fast.detect(seqs),
        "naive_two_heads": naive,
    }
    seconds = interleaved(fns, args.repeats)
    tokens = ids.numel()
    throughput = {k: tokens / v for k, v in seconds.items()}
    ratios = {k: v / throughput["plain_forward"] for k, v in throughput.items()}

    with torch.inference_mode():  # where the head's time goes, per scored token
        h = final_hidden(model, ids, mask)[:, :-1].reshape(-1, u_wm.shape[1]).contiguous()
        x = ids[:, 1:].reshape(-1)
        parts = interleaved(
            {
                "head_matmul_only": lambda: [F.linear(h[i : i + 512], u_wm) for i in range(0, len(h), 512)],
                "llr_and_discrete": lambda: token_stats(h, x, u_wm, key, with_null=False),
                "llr_discrete_and_null": lambda: token_stats(h, x, u_wm, key, with_null=True),
            },
            args.repeats,
        )
    per_token_ms = {k: 1e3 * v / len(h) for k, v in parts.items()}
    per_token_ms["backbone"] = 1e3 * seconds["backbone_only"] / tokens

    mem_seqs = windows(tokenizer, args.memory_batch, args.memory_length)
    mem_det = Detector(model, tokenizer, key, DetectConfig(batch_size=args.memory_batch, min_tokens=8))
    monitor, before = StageMonitor(interval=0.01), current_rss_mb()
    with monitor.stage("detect"):
        mem_det.detect(mem_seqs)
    memory = {
        "rss_before_mb": round(before, 1),
        "peak_rss_mb": monitor.peak_rss_mb["detect"],
        "peak_increase_mb": round(monitor.peak_rss_mb["detect"] - before, 1),
        "batch": args.memory_batch,
        "length": args.memory_length,
    }

    write_result(
        args.name,
        {
            "model": str(args.model),
            "batch": args.batch,
            "length": args.length,
            "tokens": tokens,
            "threads": torch.get_num_threads(),
            "median_seconds": seconds,
            "tokens_per_second": throughput,
            "ratio_to_plain_forward": ratios,
            "head_breakdown_ms_per_token": per_token_ms,
            "memory": memory,
        },
    )
    print(f"\n{'':30s}{'tok/s':>9s}{'x forward':>11s}")
    for name in fns:
        print(f"{name:30s}{throughput[name]:9.0f}{ratios[name]:11.2f}")
    print("\nper scored token (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in per_token_ms.items()))
    print(
        f"peak memory of detection at {args.memory_batch}x{args.memory_length}: "
        f"{memory['peak_rss_mb']:.0f} MB (+{memory['peak_increase_mb']:.0f} MB over the loaded model)"
    )


if __name__ == "__main__":
    main()
