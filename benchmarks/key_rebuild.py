"""Does a trained key rebuild from its seed? OpenStamp's key built again, compared with one built before.

    python benchmarks/key_rebuild.py [--key runs/sweep-s0/keys/openstamp/s0] [--seed 0] [--threads 2,1]

An eval builds OpenStamp's key from ``key_corpus``'s key half and the seed (green lists from
SHAKE-256; the projection P and the selector S trained in floating point). This script builds the
same method's key with each thread count of ``--threads`` and reports, per tensor, the largest
absolute difference from the key in ``--key`` (a key directory of an eval: keys/<method>/s<seed>).
Run on the machine that built ``--key``, it measures rebuilds in a new process; elsewhere, across
machines. Writes benchmarks/results/key_rebuild.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import tempfile
import time
from pathlib import Path

import torch
from common import write_result
from safetensors.torch import load_file

from openstamp import load_documents, load_model, split_documents
from openstamp.methods import create


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--key", type=Path, default=Path("runs/sweep-s0/keys/openstamp/s0"))
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="wikipedia")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", default="2,1")
    args = parser.parse_args()
    if not (args.key / "done").exists():
        raise SystemExit(f"{args.key} holds no finished key (an eval's keys/<method>/s<seed> folder)")
    settings = json.loads((args.key / "settings.json").read_text())
    method_name = args.key.parent.name
    saved = load_file(str(args.key / "key" / "key.safetensors"))
    model, tokenizer = load_model(args.model)
    docs = split_documents(load_documents(args.corpus), "key")
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            start = time.perf_counter()
            method = create(method_name, **settings)
            method.build(model, tokenizer, docs, args.seed)
            seconds = time.perf_counter() - start
        finally:
            torch.set_num_threads(before)
        with tempfile.TemporaryDirectory() as tmp:
            method.save(Path(tmp))
            rebuilt = load_file(str(Path(tmp) / "key" / "key.safetensors"))
        gaps = {name: float((rebuilt[name].double() - saved[name].double()).abs().max()) for name in saved}
        rows.append({"threads": threads, "seconds": seconds, "max_abs_difference": gaps})
        print(f"{threads} thread(s), {seconds:.0f} s: " + ", ".join(f"{k} {v:.2e}" for k, v in gaps.items()))
    write_result(
        "key_rebuild",
        {"settings": {**vars(args), "key": str(args.key)}, "method": method_name, "cpu": cpu(), "rows": rows},
    )


def cpu() -> str:
    """The processor's model name (what decides the float kernels), or the architecture where it is unknown."""
    info = Path("/proc/cpuinfo")
    found = re.search(r"^model name\s*:\s*(.+)$", info.read_text(), re.M) if info.exists() else None
    return found.group(1).strip() if found else platform.machine()


if __name__ == "__main__":
    main()
