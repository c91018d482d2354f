"""Batch detection on Ray Data against in-process detection, on the same texts.

    python benchmarks/speed/ray_detect.py [--model runs/demo/model --key runs/demo/key --texts 96 --shards 4]

Writes held-out Wikipedia windows as JSONL shards, scores them in-process (one Detector, as
`openstamp detect` does) and with `--engine ray` at 1 and 2 workers on a local Ray, and reports
throughput, Ray's overhead, the largest score difference, the per-token cost and the head's share
of it (backbone-only forward on the same batches). Writes benchmarks/results/ray_detect.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import DEMO, ensure_key, write_result  # noqa: E402

from openstamp import DetectConfig, Detector, load_documents, split_documents  # noqa: E402
from openstamp.detect.ray_engine import detect_shards, read_records  # noqa: E402
from openstamp.model.hidden import final_hidden  # noqa: E402
from openstamp.model.text import encode  # noqa: E402


def texts_for(tokenizer, n: int, length: int) -> list[str]:
    docs = [d.text for d in split_documents(load_documents("wikipedia"), "heldout")]
    out = []
    for ids in encode(tokenizer, docs):
        out.extend(tokenizer.decode(ids[i : i + length]) for i in range(0, len(ids) - length + 1, length))
    return out[:n]


def backbone_seconds(detector: Detector, texts: list[str], batch: int) -> float:
    """The decoder alone on the same batches: what detection costs without the head."""
    start = time.perf_counter()
    for b in range(0, len(texts), batch):
        enc = detector.tokenizer(texts[b : b + batch], add_special_tokens=False, padding=True, return_tensors="pt")
        final_hidden(detector.model, enc.input_ids, enc.attention_mask)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=DEMO / "model")
    parser.add_argument("--key", type=Path, default=DEMO / "key")
    parser.add_argument("--texts", type=int, default=96)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    ensure_key(args.model, args.key)
    config = DetectConfig(batch_size=args.batch)
    torch.set_num_threads(os.cpu_count() or 1)
    t0 = time.perf_counter()
    detector = Detector.from_pretrained(str(args.model), str(args.key), config)
    load_s = time.perf_counter() - t0
    texts = texts_for(detector.tokenizer, args.texts, args.length)
    root = Path(tempfile.mkdtemp(prefix="ray-detect-"))
    (root / "in").mkdir()
    per = -(-len(texts) // args.shards)
    for s in range(args.shards):
        rows = [{"id": s * per + i, "text": t} for i, t in enumerate(texts[s * per : (s + 1) * per])]
        (root / "in" / f"part-{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    import ray

    start = time.perf_counter()
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - start
    # rounds interleave the engines, so load from other processes on the machine hits all of them
    walls: dict[str, list[float]] = {"in_process": [], "1": [], "2": []}
    max_diff = max_p_diff = 0.0
    load_avg = []  # the 1-minute load average as each round starts: other jobs show up here
    for r in range(args.rounds):
        load_avg.append(os.getloadavg()[0])
        start = time.perf_counter()
        local = [{"id": i, **res.to_dict()} for i, res in enumerate(detector.detect(texts))]
        walls["in_process"].append(time.perf_counter() - start)
        tokens = sum(x["n_tokens"] for x in local)
        for workers in (1, 2):
            out = root / f"out-{workers}-{r}"
            start = time.perf_counter()
            summary = detect_shards(root / "in", out, str(args.model), str(args.key), config, workers=workers)
            walls[str(workers)].append(time.perf_counter() - start)
            rows = {x["id"]: x for p in sorted(out.iterdir()) for x in read_records(p)}
            assert len(rows) == len(local) and summary.rows == len(local), "rows lost or duplicated"
            for ref in local:
                max_diff = max(max_diff, abs(rows[ref["id"]]["score"] - ref["score"]))
                max_p_diff = max(max_p_diff, abs(rows[ref["id"]]["p_value"] - ref["p_value"]))
            print(f"round {r}: ray, {workers} worker(s): {walls[str(workers)][-1]:.1f} s", flush=True)
        print(f"round {r}: in-process {walls['in_process'][-1]:.1f} s", flush=True)
    ray.shutdown()
    backbone_s = backbone_seconds(detector, texts, args.batch)
    shutil.rmtree(root, ignore_errors=True)
    local_s = statistics.median(walls["in_process"])
    runs = {}
    for workers in ("1", "2"):
        wall = statistics.median(walls[workers])
        runs[workers] = {"wall_s": wall, "tokens_per_s": tokens / wall, "texts_per_s": len(local) / wall}

    per_token_ms = 1e3 * local_s / tokens
    head_share = max(0.0, 1 - backbone_s / local_s)
    write_result(
        "ray_detect",
        {
            "model": str(args.model),
            "texts": len(local),
            "tokens": tokens,
            "shards": args.shards,
            "batch": args.batch,
            "cpus": os.cpu_count(),
            "in_process": {"load_s": load_s, "detect_s": local_s, "tokens_per_s": tokens / local_s},
            "ray": runs,
            "ray_init_s": init_s,
            "walls_s": walls,
            "load_avg_1min": load_avg,
            "rounds": args.rounds,
            "overhead_vs_in_process": {w: r["wall_s"] / local_s for w, r in runs.items()},
            "max_abs_score_diff": max_diff,
            "max_abs_p_value_diff": max_p_diff,
            "per_token_ms": per_token_ms,
            "backbone_per_token_ms": 1e3 * backbone_s / tokens,
            "head_share": head_share,
        },
    )
    print(
        f"in-process {tokens / local_s:.0f} tokens/s (+{load_s:.1f} s load); ray init {init_s:.1f} s; "
        f"max |score diff| {max_diff:.2e}; {per_token_ms:.2f} ms/token, head share {head_share:.0%}"
    )


if __name__ == "__main__":
    main()
