"""What a second eval saves by taking keys and completions from the eval store.

    python benchmarks/eval_store.py [--model smollm2-135m] [--methods openstamp,kgw] [--n 32] [--new-tokens 64]

Two evals with the same settings in two run folders share one store (a fresh one in a temporary
folder, :mod:`openstamp.evaluation.store`), as the reference runs' main eval and the paraphrase
stage's eval do. The first builds the keys and samples the completions; the second takes them
from the store and only scores. Checks that both report the same keys (``key_sha256``) and the
same metrics, and reports each eval's seconds per stage and their ratio. The two run one after
the other, so machine noise can touch one more than the other: read the ratio, not the seconds.
Writes benchmarks/results/eval_store.json.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import write_result

from openstamp.config import EvalConfig
from openstamp.evaluation.pipeline import run_eval
from openstamp.evaluation.store import EvalStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--methods", default="openstamp,kgw")
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    cfg = EvalConfig.from_dict(
        {
            "model": args.model,
            "methods": args.methods.split(","),
            "n": args.n,
            "new_tokens": args.new_tokens,
            "oracle": "none",
            "lengths": [],
        }
    )
    with tempfile.TemporaryDirectory() as tmp:
        store = EvalStore(Path(tmp) / "store")
        evals = {}
        for name in ("first", "second"):
            start = time.perf_counter()
            results = run_eval(cfg, Path(tmp) / name, progress=False, store=store)
            evals[name] = {"seconds": time.perf_counter() - start, "stages": results["timings_s"]["stages"]}
            evals[name]["runs"] = results["runs"]
            if name == "first":
                made = store.hits
        taken = store.hits - made
    first, second = evals["first"]["runs"], evals["second"]["runs"]
    same_keys = [a["key_sha256"] == b["key_sha256"] for a, b in zip(first, second, strict=True)]
    same_metrics = [a["metrics"] == b["metrics"] for a, b in zip(first, second, strict=True)]
    result = {
        "settings": vars(args),
        "seconds": {name: round(e["seconds"], 1) for name, e in evals.items()},
        "stages": {name: e["stages"] for name, e in evals.items()},
        "speedup": evals["first"]["seconds"] / evals["second"]["seconds"],
        "taken_from_store": taken,
        "same_keys": all(same_keys),
        "same_metrics": all(same_metrics),
    }
    write_result("eval_store", result)
    print(
        f"eval of {args.methods} on {args.n} prompts, {args.new_tokens} new tokens: "
        f"first {result['seconds']['first']} s"
        f" (keys {evals['first']['stages']['keys']:.0f} s, generate {evals['first']['stages']['generate']:.0f} s), "
        f"second {result['seconds']['second']} s with {taken} keys and batches from the store "
        f"({result['speedup']:.2f}x); same keys: {result['same_keys']}, same metrics: {result['same_metrics']}"
    )


if __name__ == "__main__":
    main()
