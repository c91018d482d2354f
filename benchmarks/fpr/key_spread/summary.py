"""Key spread, the summary: every (keys, texts) pair's per-key FPR, and the mean-offset check, in one results file.

    PYTHONPATH=src python benchmarks/fpr/key_spread/summary.py     # after cross, offset, code and pooled

Reads their p-values under runs/probe and writes benchmarks/results/key_spread.json: ``fpr_scoring.fpr_summary``
per pair and alpha, pooled.py's pools as pairs too; rendered as detection.md's ``key_spread`` table.
"""

import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/fpr")

import numpy as np  # noqa: E402
from common import write_result  # noqa: E402
from fpr_scoring import ALPHAS, fpr_summary  # noqa: E402

from openstamp.storage import read_json  # noqa: E402

probe = Path("runs/probe")
PAIRS = {  # name -> (keys, texts, files whose p-values are joined key-wise)
    "mk_keys_mk_texts": ("multikey_fpr's 5 keys", "multikey_fpr's 1,000 prose windows", ["p_mkkeys_mktexts"]),
    "pp_keys_mk_texts": ("product_path_fpr's 10 keys", "multikey_fpr's 1,000 prose windows", ["p_ppkeys_mktexts"]),
    "all_keys_mk_texts": (
        "all 15 keys",
        "multikey_fpr's 1,000 prose windows",
        ["p_mkkeys_mktexts", "p_ppkeys_mktexts"],
    ),
    "mk_keys_pp_texts": ("multikey_fpr's 5 keys", "product_path_fpr's 1,000 human continuations", ["p_mkkeys_pptexts"]),
    "fresh_keys_code": ("20 fresh keys (seed 1)", "product_path_fpr's 1,000 windows of code", ["p_codekeys_codetexts"]),
}
pairs = {}
for name, (keys, texts, files) in PAIRS.items():
    kept = [read_json(probe / f"{f}.json", "p-values") for f in files]
    p = np.concatenate([np.array(k["p"]) for k in kept], axis=1)
    pairs[name] = {
        "keys": keys,
        "texts": texts,
        "key_ids": [i for k in kept for i in k["key_ids"]],
        "by_alpha": {f"{a:g}": fpr_summary(p, a) for a in ALPHAS},
        "mean_p_per_key": p.mean(0).round(4).tolist(),
    }
pooled = read_json(probe / "pooled.json", "pooled p-values")  # pooled.py: (keys, pools) per pool size
for size, p in sorted(pooled["p"].items(), key=lambda kv: int(kv[0])):
    p = np.array(p).T  # (pools, keys), as fpr_summary reads texts
    pairs[f"all_keys_pools_of_{size}"] = {
        "keys": "all 15 keys",
        "texts": f"{p.shape[0]} disjoint pools of {size} of the 2,000 prose texts",
        "key_ids": pooled["key_ids"],
        "by_alpha": {f"{a:g}": fpr_summary(p, a) for a in (0.05, 0.01)},
        "mean_p_per_key": p.mean(0).round(4).tolist(),
    }
offset = read_json(probe / "bias_probe.json", "offset check")
spread = {
    w: {a: float(np.std([r[f"fpr{a}_{w}"] for r in offset], ddof=1)) for a in ("01", "05")} for w in ("before", "after")
}
write_result(
    "key_spread",
    {
        "settings": {"profile": "default", "model": "smollm2-135m", "length": 64, "backbone": "original"},
        "question": "is multikey_fpr's excess in its keys or its texts; does a mean offset remove the key spread",
        "pairs": pairs,
        "offset": {"per_key": offset, "sd_across_keys": spread, "reference": "1,000 key-part windows of 64 tokens"},
    },
)
for name, r in pairs.items():
    s = r["by_alpha"]["0.01"]
    rates = f"per key {s['min_fpr']:.3f}-{s['max_fpr']:.3f}"
    print(f"{name:20s} pooled {s['pooled_fpr']:.4f} {rates} spread p {s['dispersion_p']:.3f}")
print("offset: sd of per-key FPR across 15 keys", spread)
