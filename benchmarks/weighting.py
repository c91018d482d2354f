"""Does an optimal per-token weighting of the centred statistic buy detection at low strength?

    python benchmarks/weighting.py [--key runs/tune/key] [--deltas 0.35,0.5] [--n 32] [--tokens 64]

For each scored token t with hidden state h_t, the watermark logits are ``w_t = delta G S P h_t``
(over the vocabulary), the original distribution ``p0 = softmax(U~ h_t - w_t)`` and the
watermarked one ``p1 = softmax(U~ h_t)``. The centred term of the observed token x_t is

    c_t = w_t[x_t] - E0[w_t],   E0[c_t] = 0,   Var0[c_t] = v_t = E0[w_t^2] - E0[w_t]^2,
    E1[c_t] = e_t = E1[w_t] - E0[w_t]

(E0 and E1 under p0 and p1 of the same step). Two one-sided z-tests of the null "each token is
drawn from the original model given its prefix":

    unit weights     z = sum_t c_t / sqrt(sum_t v_t)
    optimal weights  z = sum_t u_t c_t / sqrt(sum_t u_t^2 v_t),   u_t = e_t / v_t

``u_t`` maximises the expected z under the watermarked model among linear weightings (the
Gaussian, independent-terms approximation): steps whose watermark moves little probability
(low entropy, or a selection that barely differs from the mean) count less. Both are compared
with the mean LLR (AUROC only: it has no p-value of this kind) and with the product's
detector (its p-value, on the decoded text), on watermarked completions of held-out prompts, on
the human continuations of the same prompts (AUROC's negatives) and on the original model's
completions of them (the null the z-tests assume: their flag rate should be near alpha). Texts
are scored without their prompts; the first token is context. Writes benchmarks/results/weighting.json.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses

import numpy as np
import torch
from common import add_key_arguments, key_and_prompts, write_result
from scipy.stats import norm
from sklearn.metrics import roc_auc_score

from openstamp import DetectConfig, Detector
from openstamp.evaluation.metrics import clopper_pearson
from openstamp.generate import sample_completions
from openstamp.hidden import final_hidden
from openstamp.key.key import WatermarkKey
from openstamp.patch import apply_watermark, head, release_tied_head, revert_watermark
from openstamp.tune import TuneConfig


@torch.inference_mode()
def text_scores(model, key: WatermarkKey, ids: list[int], chunk: int = 128) -> dict:
    """Mean LLR and the unit- and optimally-weighted z of one text, on the watermarked model."""
    x = torch.tensor([ids])
    h = final_hidden(model, x, torch.ones_like(x))[0, :-1]  # (T-1, d): each predicts the next token
    targets = x[0, 1:]
    weight = head(model).weight
    llr, c, v, e = [], [], [], []
    for i in range(0, len(h), chunk):
        hi, xi = h[i : i + chunk].float(), targets[i : i + chunk]
        w = key.watermark_logits(hi)  # (n, V)
        z1 = hi @ weight.float().T
        logp1, logp0 = torch.log_softmax(z1, -1), torch.log_softmax(z1 - w, -1)
        p0, p1 = logp0.exp(), logp1.exp()
        e0, e1 = (p0 * w).sum(-1), (p1 * w).sum(-1)
        rows = torch.arange(len(xi))
        llr.append(logp1[rows, xi] - logp0[rows, xi])
        c.append(w[rows, xi] - e0)
        v.append(((p0 * w * w).sum(-1) - e0**2).clamp_min(1e-12))
        e.append(e1 - e0)
    llr, c, v, e = (torch.cat(t).double() for t in (llr, c, v, e))
    u = e / v
    return {
        "mean_llr": float(llr.mean()),
        "z_unit": float(c.sum() / v.sum().sqrt()),
        "z_optimal": float((u * c).sum() / (u * u * v).sum().sqrt()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_key_arguments(parser, (0.35, 0.5))
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--alpha", type=float, default=0.01)
    args = parser.parse_args()
    cfg = TuneConfig(tokens=args.tokens, n=args.n, fpr=args.alpha)
    key, model, tokenizer, pairs = key_and_prompts(args, cfg)
    tied_head = release_tied_head(key)
    prompts = [p for p, _ in pairs]
    original = sample_completions(model, tokenizer, prompts, cfg.tokens, seed=cfg.seed, batch_size=cfg.batch_size)
    rows = []
    for delta in args.deltas:
        variant = dataclasses.replace(key, delta=delta, meta=copy.deepcopy(key.meta))
        apply_watermark(model, variant, tied_head)
        try:
            generated = sample_completions(
                model, tokenizer, prompts, cfg.tokens, seed=cfg.seed, batch_size=cfg.batch_size, progress=True
            )
            sets = {
                "watermarked": [list(map(int, g)) for g in generated],
                "human": [h for _, h in pairs],
                "original": [list(map(int, g)) for g in original],
            }
            scores = {name: [text_scores(model, variant, ids) for ids in texts] for name, texts in sets.items()}
            detector = Detector(model, tokenizer, variant, DetectConfig(alpha=args.alpha))
            product = {
                name: [r.p_value for r in detector.detect(tokenizer.batch_decode(texts, skip_special_tokens=True))]
                for name, texts in sets.items()
            }
        finally:
            revert_watermark(model, variant)
        row: dict = {"delta": delta}
        labels = np.r_[np.ones(len(scores["watermarked"])), np.zeros(len(scores["human"]))]  # AUROC: human negatives
        for stat in ("mean_llr", "z_unit", "z_optimal"):
            values = [s[stat] for s in scores["watermarked"]] + [s[stat] for s in scores["human"]]
            row[stat] = {"auroc": float(roc_auc_score(labels, values))}
            if stat != "mean_llr":
                p = {name: norm.sf([s[stat] for s in scores[name]]) for name in scores}
                row[stat].update(_flagged(p, args.alpha))
        row["detector"] = _flagged({k: np.array([1.0 if q is None else q for q in v]) for k, v in product.items()},
                                   args.alpha)  # fmt: skip
        rows.append(row)
    write_result(
        "weighting",
        {
            "model": args.model,
            "key": args.key,
            "key_id": key.key_id,
            "corpus": args.corpus,
            "deltas": list(args.deltas),
            "settings": dataclasses.asdict(cfg),
            "rows": rows,
        },
    )
    print(f"\n{args.tokens}-token texts, n {args.n}, flagged at p <= {args.alpha} (watermarked / human / original)")
    for r in rows:
        cells = [
            f"{s} {r[s]['tpr']:.3f} / {r[s]['human_flagged']:.3f} / {r[s]['original_flagged']:.3f}"
            for s in ("detector", "z_unit", "z_optimal")
        ]
        auroc = ", ".join(f"{s} {r[s]['auroc']:.3f}" for s in ("mean_llr", "z_unit", "z_optimal"))
        print(f"delta {r['delta']:g}: " + "; ".join(cells) + f"; AUROC {auroc}")


def _flagged(p_values: dict, alpha: float) -> dict:
    hits = int((p_values["watermarked"] <= alpha).sum())
    n = len(p_values["watermarked"])
    return {
        "tpr": hits / n,
        "tpr_ci": clopper_pearson(hits, n),
        "human_flagged": float((p_values["human"] <= alpha).mean()),
        "original_flagged": float((p_values["original"] <= alpha).mean()),
    }


if __name__ == "__main__":
    main()
