"""Peak memory of key building against the number of hidden states: in memory vs sharded on disk.

    python benchmarks/memory/key_memory.py [--model smollm2-135m --sizes 1024,4096,16384]

Each point runs in a fresh process: load the model and the corpus, note the RSS, then sample
N hidden states and fit the selector, either in memory (``collect_states`` + ``fit_selector``)
or sharded (``write_state_shards`` + ``fit_selector_streaming``), and record the peak RSS above
the loaded model (after one warm-up batch). P is left out (its training set has a fixed size, ``projection.n_states``).
A least-squares line per mode gives bytes per state; scaling the in-memory slope by the hidden
size extrapolates to a 7B model (hidden 4096). Writes benchmarks/results/key_memory.json.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import RESULTS, write_result  # noqa: E402

HIDDEN_7B = 4096
PAPER_STATES = 1_500_000


def point(model_spec: str, mode: str, n: int, lists: int, chunk: int) -> dict:
    import torch

    from openstamp import load_documents, load_model, load_profile, split_documents
    from openstamp.embed import shards as state_shards
    from openstamp.embed.build import split_by_document
    from openstamp.embed.selector import fit_selector_streaming
    from openstamp.embed.shards import write_state_shards
    from openstamp.embed.states import collect_states
    from openstamp.key.selector import fit_selector
    from openstamp.model.hidden import final_hidden
    from openstamp.runtime import StageMonitor, current_rss_mb

    torch.set_num_threads(2)
    state_shards.CHUNK = chunk  # states per streamed chunk (and per mini-batch of k-means)
    cfg = load_profile("default").with_overrides(
        {
            "states.n_states": n,
            "states.window_tokens": 256,
            "states.positions_per_window": 128,
            "selector.n_lists": lists,
            "projection.enabled": False,
            "projection.n_states": min(n, 512),
        }
    )
    model, tokenizer = load_model(model_spec)
    docs = split_documents(load_documents("wikipedia"), "key")
    with torch.inference_mode():  # page the weights in and size one batch's activations before the baseline
        ids = torch.randint(0, 1000, (cfg.states.batch_size, cfg.states.window_tokens))
        final_hidden(model, ids, torch.ones_like(ids))
    base = current_rss_mb()
    monitor = StageMonitor()
    with monitor.stage("key"), tempfile.TemporaryDirectory() as tmp:
        if mode == "memory":
            states = collect_states(model, tokenizer, docs, cfg.states, progress=False)
            train, held = split_by_document(states, 0.1, 0)
            _, stats = fit_selector(states.hidden[train], states.hidden[held], cfg.selector)
        else:
            states = write_state_shards(model, tokenizer, docs, cfg.states, Path(tmp), progress=False)
            train, held = split_by_document(states, 0.1, 0)
            _, stats = fit_selector_streaming(states, train, held, None, cfg.selector)
    return {
        "mode": mode,
        "chunk": chunk if mode == "sharded" else None,
        "n_states": len(states),
        "hidden_size": model.config.hidden_size,
        "base_rss_mb": base,
        "peak_rss_mb": monitor.peak_rss_mb["key"],
        "above_model_mb": monitor.peak_rss_mb["key"] - base,
        "seconds": monitor.seconds["key"],
        "train_accuracy": stats["train_accuracy"],
        "heldout_accuracy": stats["heldout_accuracy"],
    }


def slope(points: list[dict]) -> tuple[float, float]:
    """Least-squares MB per state and intercept of memory above the model."""
    xs, ys = [p["n_states"] for p in points], [p["above_model_mb"] for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return b, my - b * mx


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--sizes", default="1024,4096,16384")
    parser.add_argument("--lists", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=8192, help="states per streamed chunk (sharded)")
    parser.add_argument("--modes", default="memory,sharded")
    parser.add_argument("--keep-other-modes", action="store_true", help="keep the saved points of other modes")
    parser.add_argument("--point", nargs=2, metavar=("MODE", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point:
        print(json.dumps(point(args.model, args.point[0], int(args.point[1]), args.lists, args.chunk)))
        return
    points = []
    for n in [int(s) for s in args.sizes.split(",")]:
        for mode in args.modes.split(","):
            cmd = [
                sys.executable,
                __file__,
                "--model",
                args.model,
                "--lists",
                str(args.lists),
                "--chunk",
                str(args.chunk),
            ]
            cmd += ["--point", mode, str(n)]
            line = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            points.append(json.loads(line))
            p = points[-1]
            mb, seconds = p["above_model_mb"], p["seconds"]
            print(f"{mode:8s} {p['n_states']:6d} states: +{mb:.0f} MB ({seconds:.0f} s)", flush=True)
    previous = RESULTS / "key_memory.json"
    if args.keep_other_modes and previous.exists():  # re-ran some modes: keep the saved points of the others
        modes = args.modes.split(",")
        points += [p for p in json.loads(previous.read_text())["points"] if p["mode"] not in modes]
    fits = {}
    for mode in ("memory", "sharded"):
        b, a = slope([p for p in points if p["mode"] == mode])
        fits[mode] = {"mb_per_1k_states": 1000 * b, "intercept_mb": a}
    d = points[0]["hidden_size"]
    per_state_7b = fits["memory"]["mb_per_1k_states"] / 1000 * HIDDEN_7B / d
    gram_mb = HIDDEN_7B**2 * 8 * 2 / 2**20  # the (d, d) Gram matrix and its solve, fp64
    chunk_mb = 8192 * HIDDEN_7B * 4 * 3 / 2**20  # a streamed chunk, its projection and a float32 copy
    extrapolation = {
        "hidden_size": HIDDEN_7B,
        "states": PAPER_STATES,
        "in_memory_gb": per_state_7b * PAPER_STATES / 1024,
        "sharded_gb": (gram_mb + chunk_mb) / 1024,
        "note": "states and fitting only, above the model; in-memory slope scaled by hidden size; "
        "sharded: Gram matrix plus one chunk, independent of the number of states",
    }
    write_result(
        "key_memory",
        {
            "model": args.model,
            "lists": args.lists,
            "chunk": args.chunk,
            "points": points,
            "fits": fits,
            "extrapolation_7b": extrapolation,
        },
    )
    print(
        f"in memory {fits['memory']['mb_per_1k_states']:.2f} MB per 1k states, sharded "
        f"{fits['sharded']['mb_per_1k_states']:.2f}; 7B, {PAPER_STATES:,} states: "
        f"{extrapolation['in_memory_gb']:.1f} GB in memory vs {extrapolation['sharded_gb']:.2f} GB sharded"
    )


if __name__ == "__main__":
    main()
