"""Does a trained key rebuild from its seed? OpenStamp's key built again, compared with one built before.

    python benchmarks/memory/key_rebuild.py [--key runs/sweep-s0/keys/openstamp/s0] [--seed 0] [--threads 2,1]
    python benchmarks/memory/key_rebuild.py --results benchmarks/results/sweep/seeds/s1/results.json --seed 1 \
        [--method sir]

An eval builds OpenStamp's key from ``key_corpus``'s key half and the seed (green lists from
SHAKE-256; the projection P and the selector S trained in floating point). This script builds the
same method's key with each thread count of ``--threads`` and compares it with one built before:

* ``--key``: a key directory of an eval (keys/<method>/s<seed>); per tensor, the largest absolute
  difference. Run on the machine that built it, it measures rebuilds in a new process. Writes
  benchmarks/results/key_rebuild.json.
* ``--results``: an eval's results.json, whose runs record the sha256 of their key's tensors
  (``key_sha256``); the key is built as that eval built it (its config) and its digest compared.
  A kept results.json needs no key files, so this checks a rebuild on another machine than the
  eval's. Writes benchmarks/results/key_rebuild_from_results.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import write_result  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from openstamp import load_documents, load_model, split_documents  # noqa: E402
from openstamp.lab.evaluation.config import EvalConfig  # noqa: E402
from openstamp.lab.evaluation.pipeline import key_directory, keyed_method  # noqa: E402
from openstamp.lab.methods import create  # noqa: E402
from openstamp.lab.methods.common import key_digest  # noqa: E402
from openstamp.runtime import machine, thread_count  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--key", type=Path, default=Path("runs/sweep-s0/keys/openstamp/s0"))
    parser.add_argument("--results", type=Path, help="an eval's results.json with key_sha256 per run (not --key)")
    parser.add_argument("--method", default="openstamp", help="with --results: whose key")
    parser.add_argument("--model", default="smollm2-135m", help="with --key (--results: the eval's)")
    parser.add_argument("--corpus", default="wikipedia", help="with --key (--results: the eval's key corpus)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", default="2,1")
    args = parser.parse_args()
    if args.results:
        from_results(args)
        return
    if not (args.key / "done").exists():
        raise SystemExit(f"{args.key} holds no finished key (an eval's keys/<method>/s<seed> folder)")
    settings = json.loads((args.key / "settings.json").read_text())
    method_name = args.key.parent.name
    saved = load_file(str(args.key / "key" / "key.safetensors"))
    model, tokenizer = load_model(args.model)
    docs = split_documents(load_documents(args.corpus), "key")
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        with thread_count(threads):
            start = time.perf_counter()
            method = create(method_name, **settings)
            method.build(model, tokenizer, docs, args.seed)
            seconds = time.perf_counter() - start
        with tempfile.TemporaryDirectory() as tmp:
            method.save(Path(tmp))
            rebuilt = load_file(str(Path(tmp) / "key" / "key.safetensors"))
        gaps = {name: float((rebuilt[name].double() - saved[name].double()).abs().max()) for name in saved}
        rows.append({"threads": threads, "seconds": seconds, "max_abs_difference": gaps})
        print(f"{threads} thread(s), {seconds:.0f} s: " + ", ".join(f"{k} {v:.2e}" for k, v in gaps.items()))
    write_result(
        "key_rebuild",
        {"settings": {**vars(args), "key": str(args.key)}, "method": method_name, **machine(), "rows": rows},
    )


def from_results(args) -> None:
    """Build ``args.method``'s seed key as the eval of ``args.results`` did; compare its digest with the runs'."""
    results = json.loads(args.results.read_text())
    recorded = {r.get("key_sha256") for r in results["runs"] if (r["method"], r["seed"]) == (args.method, args.seed)}
    recorded.discard(None)
    if len(recorded) != 1:
        raise SystemExit(
            f"{args.results} records no single key_sha256 for {args.method} seed {args.seed} "
            "(runs written before runs recorded their key's digest hold none)"
        )
    cfg = EvalConfig.from_dict(results["config"])
    model, tokenizer = load_model(cfg.model, dtype=cfg.dtype, device=cfg.device)
    docs = split_documents(load_documents(cfg.key_corpus), "key")
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        with tempfile.TemporaryDirectory() as tmp, thread_count(threads):
            start = time.perf_counter()
            keyed_method(Path(tmp), args.method, args.seed, cfg, model, tokenizer, docs)
            seconds = time.perf_counter() - start
            digest = key_digest(key_directory(Path(tmp), cfg, args.method, args.seed))
        rows.append({"threads": threads, "seconds": seconds, "key_sha256": digest, "identical": digest in recorded})
        print(f"{threads} thread(s), {seconds:.0f} s: {digest[:16]} (identical to the eval's: {digest in recorded})")
    made = results["versions"], results["created"], results["timings_s"].get("machines")
    write_result(
        "key_rebuild_from_results",
        {
            "settings": {**vars(args), "results": str(args.results), "key": None},
            "method": args.method,
            **machine(),
            "eval": {"created": made[1], "versions": made[0], "machines": made[2], "key_sha256": recorded.pop()},
            "rows": rows,
        },
    )


if __name__ == "__main__":
    main()
