"""Stage ``score`` of fpr_per_key.py: one backbone pass per text, statistics for many keys.

Why key variants with a shared S and P. The p-value's guarantee is over the secret: given the
text, S and P, the secret decides G (and the permutations), and under the null (text written
without the key) the permutation test is exact over that randomness. An owner's S and P are
fixed once built, so "one key against all texts" asks how the false-positive rate varies across
secrets for a fixed S, P; that is what the variants sample. (Variation across S, P, i.e. owners
with other corpora or seeds, is not measured here.)

The backbone is the original model's (its hidden states do not depend on the key), the
released head is U + dW for each variant. Exact m needs p_t @ G for every key: one bf16 product
per batch, (tokens, |V|) x (|V|, keys * L) with fp32 accumulation; m's rounding error is below
2^-9 of its value. The older top-32 centring is computed beside it ("before").
"""

from __future__ import annotations

import dataclasses
import hashlib
import time

import numpy as np
import torch
from scipy.stats import chi2

from openstamp.detect.rates import clopper_pearson
from openstamp.detect.tail import chernoff_pvalue, combined_pvalue, tail_terms
from openstamp.key.key import WatermarkKey
from openstamp.key.prf import permutations
from openstamp.model.hidden import final_hidden
from openstamp.model.load import load_model
from openstamp.model.patch import head
from openstamp.model.text import bos_prefix
from openstamp.storage import atomic_write_json, read_json

ALPHAS = (0.01, 0.001)
N_PERMUTATIONS = 999


def variant_keys(key: WatermarkKey, n: int) -> list[WatermarkKey]:
    """The key itself, then n - 1 keys with the same S and P and a secret of their own."""
    out = [key]
    for j in range(1, n):
        secret = hashlib.sha256(b"openstamp/fpr-variant/" + key.secret + j.to_bytes(4, "little")).digest()
        out.append(dataclasses.replace(key, secret=secret, meta={}))
    return out


def centred_pvalues(s, residual, spans, perms, delta):
    """Per text and key: statistic T and the permutation p-value. residual: (N, K, L); perms: (K, P, L)."""
    stats, pvals = [], []
    for span in spans:
        C = torch.einsum("tl,tkm->klm", s[span], residual[span]).double()  # (K, L, L)
        observed = delta * torch.diagonal(C, dim1=1, dim2=2).sum(-1)  # (K,)
        null = delta * torch.gather(C, 2, perms.permute(0, 2, 1)).sum(1)  # (K, P)
        tolerance = 1e-9 * observed.abs().clamp(min=1.0)
        count = (null >= (observed - tolerance)[:, None]).sum(-1)
        stats.append(observed)
        pvals.append((1 + count).double() / (perms.shape[1] + 1))
    return torch.stack(stats), torch.stack(pvals)  # (texts, K)


@torch.inference_mode()
def score_source(model, tokenizer, keys, texts, batch_size=16):
    key0 = keys[0]
    K, L, delta, gamma = len(keys), key0.n_lists, key0.delta, key0.gamma
    weight = head(model).weight.detach()
    green_all = torch.cat([k.green for k in keys], 1)  # (V, K*L) bool
    green_bf16 = green_all.to(torch.bfloat16)
    perms = torch.stack([permutations(k.secret, L, N_PERMUTATIONS) for k in keys])  # (K, P, L)
    bos, pad = bos_prefix(tokenizer), tokenizer.pad_token_id or 0
    ids = [bos + t for t in tokenizer(texts, add_special_tokens=False).input_ids]
    rows = {"exact": [], "top32": [], "T_exact": [], "tail": [], "n_tokens": []}
    for start in range(0, len(ids), batch_size):
        batch = ids[start : start + batch_size]
        width = max(len(x) for x in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for i, seq in enumerate(batch):
            input_ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
        hidden = final_hidden(model, input_ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))
        hs, xs, spans = [], [], []
        for i, seq in enumerate(batch):
            first = len(bos) if bos else 1
            spans.append(slice(sum(len(x) for x in xs), sum(len(x) for x in xs) + len(seq) - first))
            hs.append(hidden[i, first - 1 : len(seq) - 1])
            xs.append(torch.tensor(seq[first:]))
        h, x = torch.cat(hs), torch.cat(xs)
        s = key0.selector_values(h)  # (N, L), shared by the variants
        logits = h @ weight.T
        lse = torch.logsumexp(logits, -1)
        p = torch.exp(logits - lse[:, None])
        g_x = green_all[x].float().view(len(x), K, L)
        m_exact = (p.to(torch.bfloat16) @ green_bf16).float().view(len(x), K, L)
        top_p, top_i = p.topk(32, dim=-1)
        m_top = gamma * (1 - top_p.sum(-1, keepdim=True)).expand(-1, K * L).clone()
        for j in range(top_p.shape[1]):
            m_top += top_p[:, j, None] * green_all[top_i[:, j]]
        m_top = m_top.view(len(x), K, L)
        T_exact, p_exact = centred_pvalues(s, g_x - m_exact, spans, perms, delta)
        _, p_top = centred_pvalues(s, g_x - m_top, spans, perms, delta)
        floor = 1 / (N_PERMUTATIONS + 1)
        for i, span in enumerate(spans):
            tail = [None] * K
            if bool((p_exact[i] <= floor).any()):  # refine only where a key sits at the floor
                terms = tail_terms(h[span], x[span], weight, key0, s[span], lse[span], 0.0, head_is_watermarked=False)
                for k in range(K):
                    if p_exact[i, k] <= floor:
                        shifted = dataclasses.replace(terms, deviation=terms.deviation + float(T_exact[i, k]))
                        tail[k] = chernoff_pvalue(shifted, delta, gamma)
            rows["tail"].append(tail)
            rows["n_tokens"].append(span.stop - span.start)
        rows["exact"] += p_exact.tolist()
        rows["top32"] += p_top.tolist()
        rows["T_exact"] += T_exact.tolist()
    rows["combined"] = [
        [combined_pvalue(p, N_PERMUTATIONS, t) for p, t in zip(pe, tl, strict=True)]
        for pe, tl in zip(rows["exact"], rows["tail"], strict=True)
    ]
    return rows


def fpr_summary(pvalues: np.ndarray, alpha: float) -> dict:
    """pvalues: (texts, keys). Per-key FPR, its spread, and the binomial checks."""
    n, K = pvalues.shape
    counts = (pvalues <= alpha).sum(0)
    rates = counts / n
    intervals = [clopper_pearson(int(c), n) for c in counts]
    pooled = counts.sum() / (n * K)
    dispersion = float(((counts - counts.mean()) ** 2).sum() / (n * pooled * (1 - pooled))) if 0 < pooled < 1 else 0.0
    band = (0.5 * alpha, 2 * alpha)
    return {
        "alpha": alpha,
        "n_texts": n,
        "n_keys": K,
        "pooled_fpr": float(pooled),
        "median_fpr": float(np.median(rates)),
        "max_fpr": float(rates.max()),
        "min_fpr": float(rates.min()),
        "per_key_fpr": rates.tolist(),
        "per_key_ci95": intervals,
        "keys_with_estimate_in_band": int(((rates >= band[0]) & (rates <= band[1])).sum()),
        "keys_above_band_significantly": int(sum(lo > band[1] for lo, _ in intervals)),
        "keys_below_band_significantly": int(sum(hi < band[0] for _, hi in intervals)),
        "keys_above_2alpha": int((rates > band[1]).sum()),
        "dispersion_chi2": dispersion,
        "dispersion_df": K - 1,
        "dispersion_p": float(chi2.sf(dispersion, K - 1)) if K > 1 else float("nan"),
    }


def stage_score(out, args, sources: dict[str, list[str]]) -> None:
    """Score each source's texts (name -> texts, in report order) with every key variant; write the summary."""
    from common import write_result

    model, tokenizer = load_model(args.model)
    key = WatermarkKey.load(out / "key")
    keys = variant_keys(key, args.keys)
    report, timings = {}, {}
    for name, texts in sources.items():
        cache = out / "scores" / f"{name}_k{args.keys}.json"
        if not cache.exists():
            began = time.perf_counter()
            rows = score_source(model, tokenizer, keys, texts)
            cache.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_json(cache, rows)
            timings[name] = time.perf_counter() - began
            print(f"[score] {name}: {len(rows['exact'])} texts x {len(keys)} keys in {timings[name]:.0f} s", flush=True)
        rows = read_json(cache, "scores")
        tails = [t for row in rows["tail"] for t in row if t is not None]
        report[name] = {
            "n_tokens_mean": float(np.mean(rows["n_tokens"])),
            "exact_m": {f"{a:g}": fpr_summary(np.array(rows["exact"]), a) for a in ALPHAS},
            "top32_m": {f"{a:g}": fpr_summary(np.array(rows["top32"]), a) for a in ALPHAS},
            "tail_bound_invocations": len(tails),
            "tail_bound_min": min(tails) if tails else None,
            "mean_statistic": float(np.mean(rows["T_exact"])),
            "sd_statistic": float(np.std(rows["T_exact"])),
        }
        for variant in ("exact_m", "top32_m"):
            for a, r in report[name][variant].items():
                print(
                    f"{name:16s} {variant:8s} alpha {a:6s} FPR median {r['median_fpr']:.4f} max {r['max_fpr']:.4f} "
                    f"pooled {r['pooled_fpr']:.4f}  in band {r['keys_with_estimate_in_band']}/{r['n_keys']}  "
                    f"significantly above {r['keys_above_band_significantly']}  dispersion p {r['dispersion_p']:.3f}",
                    flush=True,
                )
    settings = read_json(out / "settings.json", "settings")
    write_result(
        args.name,
        {
            "settings": settings,
            "key_id": key.key_id,
            "gamma": key.gamma,
            "delta": key.delta,
            "n_lists": key.n_lists,
            "n_permutations": N_PERMUTATIONS,
            "sources": report,
            "score_seconds": timings,
            "method": __doc__.strip().splitlines()[0],
        },
    )
