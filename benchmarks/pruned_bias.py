"""Why Wanda pruning raises Unremovable's detection while it lowers OpenStamp's.

    python benchmarks/pruned_bias.py [--windows 32 --sparsity 0.3,0.5 --epsilon 0.6]

In the at-cost pruning results, Unremovable is detected more often after pruning than before. OpenStamp and
GaussMark are detected less often. This script measures two candidate causes on SmolLM2-135M, unpruned and pruned
by the prune attack's Wanda (its defaults: 8 calibration windows of wikipedia's key half), teacher-forced on
held-out wikipedia windows:

* Unremovable's mark is a fixed logit bias ``b = epsilon * n`` (n: its keyed standard normal noise, the key of seed
  0 here). At each position its detector gains ``E_q[n_y]``, the noise of the next token expected under the marked
  distribution ``q = softmax(U h + b)``. For a small bias, ``E_q[n] ~ epsilon * Var_p(n)``, which grows as the
  model's own next-token distribution ``p = softmax(U h)`` flattens. The script reports the mean entropy of ``p``
  (nats) and the mean ``E_q[n]`` for each model, and ``E_q[n]`` by entropy quartile of the unpruned model's
  positions: the same link inside one model.
* OpenStamp's selector reads the final hidden state ``h``, and its detector runs the original model. The script
  reports the cosine of each position's ``h`` with the unpruned model's. When it falls, the lists the release
  favours can differ from the ones the detector looks for (how often they do is not measured here).

Writes benchmarks/results/pruned_bias.json.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from common import write_result

from openstamp import load_model
from openstamp.attacks.prune import PruneConfig, calibration_norms, prune_model
from openstamp.attacks.weights import quality_windows
from openstamp.methods.base import create


@torch.inference_mode()
def position_statistics(model, windows: torch.Tensor, noise: torch.Tensor, epsilon: float, batch: int = 4) -> dict:
    """Per position of ``windows`` (N, T), except the last: entropy of p, E_q[n], and the final hidden state."""
    entropy, gain, hidden = [], [], []
    bias = epsilon * noise
    for start in range(0, len(windows), batch):
        out = model(input_ids=windows[start : start + batch], output_hidden_states=True)
        h = out.hidden_states[-1][:, :-1].float()
        logits = out.logits[:, :-1].float()
        logp = torch.log_softmax(logits, dim=-1)
        entropy.append(-(logp.exp() * logp).sum(-1).reshape(-1))
        gain.append((torch.softmax(logits + bias, dim=-1) * noise).sum(-1).reshape(-1))
        hidden.append(h.reshape(-1, h.shape[-1]))
    return {"entropy": torch.cat(entropy), "gain": torch.cat(gain), "hidden": torch.cat(hidden)}


def by_quartile(entropy: torch.Tensor, gain: torch.Tensor) -> list[dict]:
    """Mean E_q[n] of the positions in each quartile of entropy."""
    edges = torch.quantile(entropy.double(), torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0], dtype=torch.float64))
    rows = []
    for q in range(4):
        inside = (entropy >= edges[q]) & ((entropy < edges[q + 1]) if q < 3 else (entropy <= edges[q + 1]))
        rows.append(
            {
                "entropy_from": float(edges[q]),
                "entropy_to": float(edges[q + 1]),
                "mean_entropy": float(entropy[inside].mean()),
                "mean_gain": float(gain[inside].mean()),
                "positions": int(inside.sum()),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--windows", type=int, default=32, help="held-out wikipedia windows, teacher-forced")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--sparsity", default="0.3,0.5", help="Wanda sparsities, comma-separated")
    parser.add_argument("--epsilon", type=float, default=0.6, help="Unremovable's strength (0.6: +12%% own PPL)")
    parser.add_argument("--seed", type=int, default=0, help="Unremovable's key")
    args = parser.parse_args()
    sparsities = [float(s) for s in args.sparsity.split(",")]

    start = time.perf_counter()
    base, tokenizer = load_model(args.model)
    base.eval()
    method = create("unremovable", epsilon=args.epsilon)
    method.build(base, tokenizer, [], args.seed)
    noise = method.noise.float()
    windows = quality_windows("wikipedia", tokenizer, args.windows, args.seq_len, seed=args.seed)

    cfg = PruneConfig()
    norms = calibration_norms(base, tokenizer, cfg)
    original = position_statistics(base, windows, noise, args.epsilon)
    rows = []
    for sparsity in [0.0, *sparsities]:
        if sparsity == 0.0:
            stats = original
        else:
            pruned = copy.deepcopy(base)
            prune_model(pruned, sparsity, cfg, norms)
            stats = position_statistics(pruned, windows, noise, args.epsilon)
            del pruned
        cosine = torch.nn.functional.cosine_similarity(stats["hidden"], original["hidden"], dim=-1)
        rows.append(
            {
                "sparsity": sparsity,
                "mean_entropy": float(stats["entropy"].mean()),
                "mean_gain": float(stats["gain"].mean()),
                "mean_hidden_cosine": float(cosine.mean()),
                "positions": int(stats["entropy"].numel()),
            }
        )
        print(
            f"wanda {sparsity:.0%}: entropy {rows[-1]['mean_entropy']:.3f} nats, E_q[n] {rows[-1]['mean_gain']:.4f}, "
            f"cosine of h with the unpruned {rows[-1]['mean_hidden_cosine']:.3f}"
        )
    quartiles = by_quartile(original["entropy"], original["gain"])
    for q in quartiles:
        print(f"unpruned, entropy {q['entropy_from']:.2f}-{q['entropy_to']:.2f}: E_q[n] {q['mean_gain']:.4f}")
    write_result(
        "pruned_bias",
        {
            "settings": {
                "model": args.model,
                "windows": args.windows,
                "seq_len": args.seq_len,
                "epsilon": args.epsilon,
                "seed": args.seed,
                "pruner": cfg.pruner,
                "calibration": cfg.calibration,
                "calibration_windows": cfg.calibration_windows,
            },
            "rows": rows,
            "unpruned_by_entropy": quartiles,
            "seconds": time.perf_counter() - start,
        },
    )


if __name__ == "__main__":
    main()
