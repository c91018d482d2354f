"""Key spread, a check: does saved_key (build_key on shared states) rebuild multikey_fpr's first key (built by embed)?

    PYTHONPATH=src python benchmarks/fpr/key_spread/same_builder.py     # after multikey_fpr.py, a study

Builds the key of runs/multikey/keys/k0's secret with ``common.saved_key`` and compares key ids and tensors.
"""

import sys
from pathlib import Path

sys.path.insert(0, "benchmarks")

import torch  # noqa: E402
from common import saved_key  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

from openstamp.key.key import WatermarkKey  # noqa: E402
from openstamp.model.load import load_model  # noqa: E402

base, tok = load_model("smollm2-135m")
mk = WatermarkKey.load("runs/multikey/keys/k0")
k, _ = saved_key(Path("runs/probe/same_k0"), base, tok, model_spec="smollm2-135m", secret=mk.secret)
print("key ids", mk.key_id, k.key_id)
a, b = load_file("runs/multikey/keys/k0/key.safetensors"), load_file("runs/probe/same_k0/key.safetensors")
print("tensors", sorted(a) == sorted(b), sorted(a))
for n in a:
    same = a[n].shape == b[n].shape and torch.equal(a[n], b[n])
    print(n, tuple(a[n].shape), "identical" if same else "differ")
