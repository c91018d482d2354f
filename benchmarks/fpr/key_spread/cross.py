"""Key spread, part 1: is multikey_fpr's excess in its keys or in its texts? (a study; see docs/notebook)

    python benchmarks/fpr/multikey_fpr.py --n 1000 --keys 5 --length 64    # its keys and windows, in runs/multikey
    PYTHONPATH=src python benchmarks/fpr/key_spread/cross.py

Scores, on the original backbone (``base=``: the exact path), three pairs of (keys, texts) at alpha 0.01:
multikey_fpr's 5 keys and 1,000 windows; product_path_fpr's 10 keys (seed 0, rebuilt here) on those windows; and
multikey's keys on product_path_fpr's 1,000 human continuations. Writes each pair's p-values to runs/probe.
"""

import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, "benchmarks")
sys.path.insert(0, "benchmarks/fpr")

import numpy as np  # noqa: E402
from common import heldout_windows, saved_key  # noqa: E402

from openstamp.config import DetectConfig  # noqa: E402
from openstamp.detect import Detector  # noqa: E402
from openstamp.detect.multikey import MultiKeyDetector  # noqa: E402
from openstamp.key.key import WatermarkKey  # noqa: E402
from openstamp.model.load import load_model  # noqa: E402
from openstamp.storage import atomic_write_json, read_json  # noqa: E402

out = Path("runs/probe")
base, tok = load_model("smollm2-135m")
mk_keys = [WatermarkKey.load(f"runs/multikey/keys/k{i}") for i in range(5)]
states, pp_keys = None, []
for j in range(10):
    secret = hashlib.sha256(f"openstamp/fpr-product/0/{j}".encode()).digest()  # product_path_fpr's owner_secret
    k, states = saved_key(
        out / "pp_keys" / f"k{j:02d}", base, tok, model_spec="smollm2-135m", secret=secret, states=states
    )
    pp_keys.append(k)
texts = {"mk": read_json(Path("runs/multikey/texts_n1000_L64.json"), "texts")}
windows = heldout_windows(tok, 1000, 50, 64)  # product_path_fpr's human continuations
texts["pp"] = tok.batch_decode([h for _, h in windows], skip_special_tokens=True)
for tname, kname in (("mk", "mk"), ("mk", "pp"), ("pp", "mk")):  # (pp, pp) is fpr_product_path_1000.json's
    keys = mk_keys if kname == "mk" else pp_keys
    f = out / f"p_{kname}keys_{tname}texts.json"
    if f.exists():
        continue
    det = MultiKeyDetector([Detector(base, tok, k, DetectConfig(), base=base) for k in keys])
    t = time.perf_counter()
    each = det.detect_each(texts[tname])
    p = [[1.0 if r.p_value is None else r.p_value for r in row] for row in each]
    atomic_write_json(f, {"p": p, "key_ids": det.key_ids, "seconds": time.perf_counter() - t})
    rates = (np.array(p) <= 0.01).mean(0)
    print(f"{tname} texts, {kname} keys: per-key FPR at 0.01 {rates.round(3).tolist()}", flush=True)
