"""Key spread, part 3: on human code, is the mean above alpha or were ten keys drawn high? (a study)

    PYTHONPATH=src python benchmarks/fpr/key_spread/code.py

20 fresh default keys (product_path_fpr's secrets with seed 1: none of its run's) meet the same 1,000 windows of
gensim's Python source (``fpr_per_key.code_windows``, 64 tokens) on the original backbone. Writes their p-values to
runs/probe/p_codekeys_codetexts.json.
"""

import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/fpr")

import numpy as np  # noqa: E402
from common import saved_key  # noqa: E402
from fpr_per_key import code_windows  # noqa: E402

from openstamp.config import DetectConfig  # noqa: E402
from openstamp.detect import Detector  # noqa: E402
from openstamp.detect.multikey import MultiKeyDetector  # noqa: E402
from openstamp.model.load import load_model  # noqa: E402
from openstamp.storage import atomic_write_json  # noqa: E402

out = Path("runs/probe")
base, tok = load_model("smollm2-135m")
states, keys = None, []
for j in range(20):
    secret = hashlib.sha256(f"openstamp/fpr-product/1/{j}".encode()).digest()
    k, states = saved_key(
        out / "code_keys" / f"k{j:02d}", base, tok, model_spec="smollm2-135m", secret=secret, states=states
    )
    keys.append(k)
del states
texts = code_windows(tok, 1000, 64)
t = time.perf_counter()
each = MultiKeyDetector([Detector(base, tok, k, DetectConfig(), base=base) for k in keys]).detect_each(texts)
P = np.array([[1.0 if r.p_value is None else r.p_value for r in row] for row in each])
atomic_write_json(
    out / "p_codekeys_codetexts.json",
    {"p": P.tolist(), "key_ids": [k.key_id for k in keys], "seconds": time.perf_counter() - t},
)
print("code per-key fpr@.01", (P <= 0.01).mean(0).round(3).tolist(), "pooled", round(float((P <= 0.01).mean()), 4))
print("code per-key fpr@.001", (P <= 0.001).mean(0).round(4).tolist(), "pooled", round(float((P <= 0.001).mean()), 5))
