"""How large a key's offset is against the unembedding it is added to, per model.

    python benchmarks/quality/offset_size.py --release runs/demo/model:runs/demo/key \\
        --release runs/demo-qwen/model:runs/demo-qwen/key

A re-tied release's input embeddings are U~ = U + dW too, so ||dW|| / ||U|| says how far the backbone's inputs
move. For each release (its key and its base, named in the key) it reports that ratio, the mean row norms of U and
dW, the norm of dW's mean row (the shift every input embedding shares, which ``green.centre`` removes) and of the
rows once centred. Writes benchmarks/results/offset_size.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import write_result  # noqa: E402

from openstamp.key import WatermarkKey  # noqa: E402
from openstamp.model.load import load_model  # noqa: E402
from openstamp.model.patch import head  # noqa: E402


def offset_size(key: WatermarkKey, base_head: torch.Tensor) -> dict:
    """The sizes of dW against U (V, d) for one key."""
    u, dw = base_head.float(), key.delta_w()
    mean_row = dw.mean(0, keepdim=True)
    return {
        "delta": key.delta,
        "offset_to_head": float(torch.linalg.vector_norm(dw) / torch.linalg.vector_norm(u)),
        "head_row_norm": float(u.norm(dim=1).mean()),
        "offset_row_norm": float(dw.norm(dim=1).mean()),
        "offset_mean_row_norm": float(mean_row.norm()),
        "centred_offset_row_norm": float((dw - mean_row).norm(dim=1).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", action="append", required=True, help="MODEL_DIR:KEY_DIR (repeat)")
    args = parser.parse_args()
    rows = {}
    for spec in args.release:
        _, key_dir = spec.split(":", 1)
        key = WatermarkKey.load(key_dir)
        source = key.meta["model"]["source"]
        base, _ = load_model(source)
        rows[source] = {"key_id": key.key_id, "tied_head": key.meta["model"].get("tied_head"),
                        **offset_size(key, head(base).weight.detach())}  # fmt: skip
        print(source, {k: round(v, 4) if isinstance(v, float) else v for k, v in rows[source].items()})
    write_result("offset_size", {"releases": rows})


if __name__ == "__main__":
    main()
