"""Does a reference of the same domain hold one key's pooled false-positive rate at alpha? (issue #79)

    python benchmarks/provenance/pool_reference.py [--keys 8 --n-ref 1000 --n-test 800 --n-news 400]

A pooled p-value is exact over keys, but one key has a mean of its own on a domain's human text, and a pool adds it
once per token: as pools grow, one key's rate drifts from alpha (docs/detection.md, "Pooled detection"). The owner
can measure that mean on human text of the domain, pooled the same way, and subtract it. With C the pool's
(L, L) cross matrix (``PoolSums.cross``) over n scored tokens and C_ref a reference set's over n_ref tokens, the
corrected pool is

    C' = C - (n / n_ref) C_ref,       T'_pi = delta * sum_l C'[l, pi(l)],

one linear function of every list assignment, so the permutation p-value stays exact over keys when the reference
was written without the key; per key, the mean cancels when the reference and the pool share a domain.

Held-out Wikipedia articles are split by document (even positions: the reference; odd: the test pools), so no
article is in both; the Lee news articles give pools of another domain against the Wikipedia reference (what a
wrong reference does). Each text is a 64-token window, scored on the original backbone (``detect --base``, one
forward pass for every key). Per key and pool size (10, 50, 100 texts, disjoint), the share of pools at p <= alpha,
raw and corrected. Power: ``--power-keys`` keys at ``--power-delta`` sample ``--power-texts`` completions of the
test half's prompts from their re-tied release, pooled 10 at a time. Writes benchmarks/results/<name>.json.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fpr"))  # fpr_per_key, fpr_scoring

from common import saved_key, write_result  # noqa: E402
from fpr_per_key import token_windows  # noqa: E402
from fpr_scoring import fpr_summary  # noqa: E402

from openstamp import load_documents, split_documents  # noqa: E402
from openstamp.config import DetectConfig  # noqa: E402
from openstamp.detect import Detector  # noqa: E402
from openstamp.detect.llr import cross_matrix, cross_pvalue  # noqa: E402
from openstamp.model.generate import sample_completions  # noqa: E402
from openstamp.model.load import load_model  # noqa: E402
from openstamp.model.patch import apply_watermark  # noqa: E402
from openstamp.model.text import prompt_windows  # noqa: E402

SIZES, ALPHAS, BATCH = (10, 50, 100), (0.05, 0.01), 20


def secret(j: int, seed: int) -> bytes:
    return hashlib.sha256(f"openstamp/pool-reference/{seed}/{j}".encode()).digest()


def cross_sums(detectors: list[Detector], texts: list[str], group: int) -> tuple[np.ndarray, np.ndarray]:
    """Per detector, the cross matrix C summed over each run of ``group`` consecutive texts, and each run's scored
    tokens: ((keys, runs, L, L), (runs,)); one forward pass serves every key (original backbone)."""
    items = detectors[0].prepare(texts)
    if any(not it.n_scored for it in items):
        raise SystemExit("a text too short to score would shift the pools")
    L, runs = detectors[0].key.n_lists, len(items) // group
    sums, tokens = np.zeros((len(detectors), runs, L, L)), np.zeros(runs)
    for b in range(0, runs * group, BATCH):
        batch = items[b : min(b + BATCH, runs * group)]
        fwd = detectors[0].forward(batch)
        for k, d in enumerate(detectors):
            st = d.statistics(batch, fwd)
            for i, span in enumerate(fwd.spans):
                sums[k, (b + i) // group] += cross_matrix(st.selector[span], st.residual[span]).numpy()
                if k == 0:
                    tokens[(b + i) // group] += span.stop - span.start
    return sums, tokens


def pool_pvalues(detector: Detector, pools: np.ndarray, tokens: np.ndarray, ref=None) -> list[float]:
    """The pooled permutation p-value of each pool; with ``ref`` (C_ref, n_ref), of C - (n / n_ref) C_ref."""
    out = []
    for C, n in zip(pools, tokens, strict=True):
        C = torch.from_numpy(C if ref is None else C - (n / ref[1]) * ref[0])
        out.append(cross_pvalue(C, detector.perms, detector.key.delta)[1])
    return out


def pooled(sums: np.ndarray, tokens: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint pools of ``size`` texts from runs of 10: ((keys, pools, L, L), (pools,))."""
    g = size // 10
    runs = sums.shape[1] // g * g
    return (
        sums[:, :runs].reshape(sums.shape[0], -1, g, *sums.shape[2:]).sum(2),
        tokens[:runs].reshape(-1, g).sum(1),
    )


def summary(p: list[list[float]]) -> dict:
    """fpr_summary at each alpha of per-key pool p-values (keys, pools)."""
    return {f"{a:g}": fpr_summary(np.array(p).T, a) for a in ALPHAS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--keys", type=int, default=8)
    parser.add_argument("--n-ref", type=int, default=1000, help="reference windows (even held-out articles)")
    parser.add_argument("--n-test", type=int, default=800, help="test windows (odd held-out articles)")
    parser.add_argument("--n-news", type=int, default=400, help="news windows, pooled against the Wikipedia reference")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--power-keys", type=int, default=2)
    parser.add_argument("--power-texts", type=int, default=100)
    parser.add_argument("--power-delta", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/pool_reference"))
    parser.add_argument("--name", default="pool_reference")
    args = parser.parse_args()
    if min(args.n_test, args.n_news) < max(SIZES) or args.n_ref < 10:
        parser.error(f"--n-test and --n-news need at least {max(SIZES)} windows, --n-ref 10")
    began = time.perf_counter()
    base, tok = load_model(args.model)
    keys, states = [], None
    for j in range(args.keys):
        key, states = saved_key(args.out / "keys" / f"k{j:02d}", base, tok, model_spec=args.model,
                                secret=secret(j, args.seed), profile=args.profile, states=states)  # fmt: skip
        keys.append(key)
    detectors = [Detector(base, tok, k, DetectConfig(), base=base) for k in keys]
    held = [d.text for d in split_documents(load_documents("wikipedia"), "heldout")]
    news = [d.text for d in load_documents("news")]
    ids = {
        "reference": token_windows(tok, held[0::2], args.tokens)[: args.n_ref],
        "test": token_windows(tok, held[1::2], args.tokens)[: args.n_test],
        "news": token_windows(tok, news, args.tokens)[: args.n_news],
    }
    for name, n in (("reference", args.n_ref), ("test", args.n_test), ("news", args.n_news)):
        if len(ids[name]) < n:
            raise SystemExit(f"only {len(ids[name])} {name} windows of {args.tokens} tokens")
    texts = {name: tok.batch_decode(w, skip_special_tokens=True) for name, w in ids.items()}
    ref_sums, ref_tokens = cross_sums(detectors, texts["reference"], 10)
    refs = [(ref_sums[k].sum(0), ref_tokens.sum()) for k in range(len(keys))]
    print(f"[pool] reference: {int(ref_tokens.sum())} tokens, {time.perf_counter() - began:.0f} s", flush=True)
    result: dict = {}
    for source in ("test", "news"):
        sums, tokens = cross_sums(detectors, texts[source], 10)
        for size in SIZES:
            pools, n = pooled(sums, tokens, size)
            raw = [pool_pvalues(d, pools[k], n) for k, d in enumerate(detectors)]
            fixed = [pool_pvalues(d, pools[k], n, refs[k]) for k, d in enumerate(detectors)]
            result.setdefault(source, {})[str(size)] = {"raw": summary(raw), "corrected": summary(fixed)}
            for how, s in result[source][str(size)].items():
                r = s["0.05"]
                line = f"pooled {r['pooled_fpr']:.3f} keys {r['min_fpr']:.2f}-{r['max_fpr']:.2f}"
                print(
                    f"[pool] {source} {size} texts {how}: at 0.05 {line} spread p {r['dispersion_p']:.3f}", flush=True
                )
    prompts = [p for p, _ in prompt_windows(tok, held[1::2], 32, args.tokens, limit=args.power_texts)]
    power = {}
    for k in range(min(args.power_keys, len(keys))):
        weak = dataclasses.replace(keys[k], delta=args.power_delta)
        release = copy.deepcopy(base)
        apply_watermark(release, weak, "retie", source=args.model)
        sampled = sample_completions(release, tok, prompts, args.tokens, seed=args.seed, progress=False)
        detector = Detector(base, tok, weak, DetectConfig(), base=base)
        sums, tokens = cross_sums([detector], tok.batch_decode(sampled, skip_special_tokens=True), 10)
        power[keys[k].key_id] = {  # C does not depend on delta: the reference serves the weaker key as it is
            "raw": pool_pvalues(detector, sums[0], tokens),
            "corrected": pool_pvalues(detector, sums[0], tokens, refs[k]),
        }
        print(f"[pool] power k{k:02d}: " + ", ".join(
            f"{how} {np.mean(np.array(p) <= 0.01):.2f} at 0.01" for how, p in power[keys[k].key_id].items()
        ), flush=True)  # fmt: skip
    write_result(
        args.name,
        {
            "settings": {**{k: str(v) for k, v in vars(args).items()}, "sizes": list(SIZES), "backbone": "original"},
            "question": "does subtracting a same-domain reference's cross matrix hold one key's pooled FPR at alpha?",
            "key_ids": [k.key_id for k in keys],
            "delta": keys[0].delta,
            "tokens": {"reference": int(ref_tokens.sum())},
            "pools": result,
            "power": {"delta": args.power_delta, "pool_size": 10, "p": power},
            "seconds": time.perf_counter() - began,
            "method": __doc__.strip().splitlines()[0],
        },
    )


if __name__ == "__main__":
    main()
