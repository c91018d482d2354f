"""Key spread, part 2: does subtracting each key's mean cross matrix on reference human text remove the spread?

    PYTHONPATH=src python benchmarks/fpr/key_spread/offset.py 1000      # after cross.py (its keys), a study

The permutation test's statistic of a text is delta * tr(C), C = S^T (G[x] - m) summed over its tokens (L x L). On
human text C has a mean per token, A = E[s (G[x] - m)^T], that depends on the key; a key whose diagonal of A sits
high among its permutations flags more human text. Here A is estimated per key on 1,000 windows of 64 tokens from
the key part of wikipedia and news (documents disjoint from the held-out test windows), and every test text's
p-value is computed from C and from C - n A (the same function of every list assignment, so the p-value stays exact
over keys). Also pools random sets of 10, 50 and 200 test texts (20 draws each) per key. Writes
runs/probe/bias_probe.json.
"""

import sys
import time
from pathlib import Path

import numpy as np

from openstamp import load_documents, split_documents
from openstamp.config import DetectConfig
from openstamp.detect import Detector
from openstamp.detect.llr import cross_pvalue
from openstamp.key.key import WatermarkKey
from openstamp.model.load import load_model
from openstamp.model.text import encode
from openstamp.storage import atomic_write_json, read_json

out = Path("runs/probe")
base, tok = load_model("smollm2-135m")
keys = [WatermarkKey.load(f"runs/multikey/keys/k{i}") for i in range(5)]
keys += [WatermarkKey.load(out / "pp_keys" / f"k{j:02d}") for j in range(10)]
dets = [Detector(base, tok, k, DetectConfig(), base=base) for k in keys]
test = read_json(Path("runs/multikey/texts_n1000_L64.json"), "texts")
per = []  # reference: 64-token windows of the key part (disjoint documents from the held-out test windows)
for spec in ("wikipedia", "news"):
    docs = split_documents(load_documents(spec), "key")
    w = []
    for ids in encode(tok, [d.text for d in docs]):
        w.extend(ids[i : i + 64] for i in range(0, len(ids) - 63, 64))
    per.append(w)
ref_ids = [x for pair in zip(*per, strict=False) for x in pair][: int(sys.argv[1]) if len(sys.argv) > 1 else 1000]
ref = tok.batch_decode(ref_ids, skip_special_tokens=True)
print("reference windows", len(ref), flush=True)


def cross(texts):
    """Per key: one (C (L, L), n tokens) per text."""
    items = dets[0].prepare(texts)
    outs = [[] for _ in dets]
    t = time.perf_counter()
    for b in range(0, len(items), 16):
        batch = items[b : b + 16]
        fwd = dets[0].forward(batch)
        for k, d in enumerate(dets):
            st = d.statistics(batch, fwd)
            for span in fwd.spans:
                C = (st.selector[span].double().T @ st.residual[span].double()).float()
                outs[k].append((C, span.stop - span.start))
    print(f"{len(texts)} texts in {time.perf_counter() - t:.0f}s", flush=True)
    return outs


R = cross(ref)
abars = [sum(C.double() for C, _ in R[k]) / sum(n for _, n in R[k]) for k in range(len(dets))]
del R
T = cross(test)
summary = []
for k, d in enumerate(dets):
    abar = abars[k]
    p0 = np.array([cross_pvalue(C.double(), d.perms, d.key.delta)[1] for C, _ in T[k]])
    p1 = np.array([cross_pvalue(C.double() - n * abar, d.perms, d.key.delta)[1] for C, n in T[k]])
    pooled = {}
    rng = np.random.default_rng(k)
    for g in (10, 50, 200):
        q0, q1 = [], []
        for _ in range(20):
            idx = rng.choice(len(T[k]), g, replace=False)
            Cs = sum(T[k][i][0].double() for i in idx)
            ns = sum(T[k][i][1] for i in idx)
            q0.append(cross_pvalue(Cs, d.perms, d.key.delta)[1])
            q1.append(cross_pvalue(Cs - ns * abar, d.perms, d.key.delta)[1])
        q0, q1 = np.array(q0), np.array(q1)
        pooled[g] = {
            "before_median_p": float(np.median(q0)),
            "after_median_p": float(np.median(q1)),
            "before_frac_p01": float(np.mean(q0 <= 0.01)),
            "after_frac_p01": float(np.mean(q1 <= 0.01)),
        }
    row = {
        "key": d.key.key_id,
        "fpr01_before": float((p0 <= 0.01).mean()),
        "fpr01_after": float((p1 <= 0.01).mean()),
        "fpr05_before": float((p0 <= 0.05).mean()),
        "fpr05_after": float((p1 <= 0.05).mean()),
        "mean_p_before": float(p0.mean()),
        "mean_p_after": float(p1.mean()),
        "pooled": pooled,
    }
    summary.append(row)
    print(row, flush=True)
atomic_write_json(out / "bias_probe.json", summary)
for w in ("before", "after"):
    a = np.array([r[f"fpr01_{w}"] for r in summary])
    b = np.array([r[f"fpr05_{w}"] for r in summary])
    print(w, "fpr@.01", a.mean().round(4), "sd", a.std(ddof=1).round(4), end=" ")
    print("fpr@.05", b.mean().round(4), "sd", b.std(ddof=1).round(4))
