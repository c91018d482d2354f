"""Key spread, part 4: does a key's spread grow when human texts are pooled? (a study)

    PYTHONPATH=src python benchmarks/fpr/key_spread/pooled.py     # after cross.py (its keys and texts)

The 15 keys of cross.py (original backbone) meet 2,000 human texts of 64 tokens: multikey_fpr's 1,000 prose windows,
then product_path_fpr's 1,000 continuations. The texts are cut, in that order, into disjoint pools of 10, 50 and
100 texts, and each pool gets the pooled permutation p-value (``Detector.detect_pool``'s: C summed over its texts).
Writes every pool's p-value per key to runs/probe/pooled.json.
"""

import sys
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from common import heldout_windows  # noqa: E402

from openstamp.config import DetectConfig  # noqa: E402
from openstamp.detect import Detector  # noqa: E402
from openstamp.detect.llr import cross_pvalue  # noqa: E402
from openstamp.key.key import WatermarkKey  # noqa: E402
from openstamp.model.load import load_model  # noqa: E402
from openstamp.storage import atomic_write_json, read_json  # noqa: E402

out = Path("runs/probe")
base, tok = load_model("smollm2-135m")
keys = [WatermarkKey.load(f"runs/multikey/keys/k{i}") for i in range(5)]
keys += [WatermarkKey.load(out / "pp_keys" / f"k{j:02d}") for j in range(10)]
dets = [Detector(base, tok, k, DetectConfig(), base=base) for k in keys]
texts = read_json(Path("runs/multikey/texts_n1000_L64.json"), "texts")
texts += tok.batch_decode([h for _, h in heldout_windows(tok, 1000, 50, 64)], skip_special_tokens=True)
SMALL = 10  # pools of 50 and 100 are sums of consecutive pools of 10
items = dets[0].prepare(texts)
assert all(len(it.text) >= 16 for it in items), "a text too short to score would shift the pools"
sums = np.zeros((len(dets), len(items) // SMALL, keys[0].n_lists, keys[0].n_lists))
t = time.perf_counter()
for b in range(0, len(items), 20):  # batches of 20: whole pools of 10, in order
    batch = items[b : b + 20]
    fwd = dets[0].forward(batch)
    for k, d in enumerate(dets):
        st = d.statistics(batch, fwd)
        for i, span in enumerate(fwd.spans):
            sums[k, (b + i) // SMALL] += (st.selector[span].double().T @ st.residual[span].double()).numpy()
    print(f"{b + len(batch)}/{len(items)} texts, {time.perf_counter() - t:.0f}s", flush=True)
result = {"key_ids": [k.key_id for k in keys], "n_texts": len(items), "p": {}}
for size in (SMALL, 50, 100):
    g = size // SMALL
    pooled = sums.reshape(len(dets), -1, g, *sums.shape[2:]).sum(2)
    result["p"][str(size)] = [
        [cross_pvalue(torch.from_numpy(pooled[k, j]), d.perms, d.key.delta)[1] for j in range(pooled.shape[1])]
        for k, d in enumerate(dets)
    ]
    P = np.array(result["p"][str(size)])
    print(size, "texts a pool: per-key share at p <= 0.05", (P <= 0.05).mean(1).round(2).tolist(), flush=True)
atomic_write_json(out / "pooled.json", result)
