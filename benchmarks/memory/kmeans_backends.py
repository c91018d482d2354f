"""The selector's k-means: scikit-learn (the CPU default) against the torch path used on a GPU.

    python benchmarks/memory/kmeans_backends.py [--model smollm2-135m --states 24576 --lists 254]

Samples the default profile's hidden states of the packaged model (no P: k-means on the raw
576-wide states, the harder case), fits the selector with each backend on the same states
and seed, and reports wall time, k-means inertia, selector accuracy on training and held-out
states, and the rounds run. The torch path runs on this machine's device (a GPU when there is
one). Writes benchmarks/results/kmeans_backends.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import write_result  # noqa: E402

from openstamp import load_documents, load_model, load_profile, split_documents  # noqa: E402
from openstamp.embed.build import split_by_document  # noqa: E402
from openstamp.embed.states import collect_states  # noqa: E402
from openstamp.key.kmeans import assign, kmeans  # noqa: E402
from openstamp.key.selector import fit_selector  # noqa: E402


def inertia(z: torch.Tensor, centroids: torch.Tensor) -> float:
    return float(((z - centroids[assign(z, centroids)]) ** 2).sum(1).double().mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="wikipedia")
    parser.add_argument("--states", type=int, default=24576)
    parser.add_argument("--lists", type=int, default=254)
    args = parser.parse_args()
    cfg = load_profile("default").with_overrides({"states.n_states": args.states, "selector.n_lists": args.lists})
    model, tokenizer = load_model(args.model)
    states = collect_states(model, tokenizer, split_documents(load_documents(args.corpus), "key"), cfg.states)
    train, held = split_by_document(states, cfg.selector.heldout_fraction, cfg.selector.seed)
    z_train, z_held = states.hidden[train].float(), states.hidden[held].float()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    rows = {}
    for backend in ("sklearn", "torch"):
        sel = dataclasses.replace(cfg.selector, kmeans=backend)
        start = time.perf_counter()
        _, stats = fit_selector(z_train, z_held, sel)
        wall = time.perf_counter() - start
        kept = ("kmeans", "n_lists", "train_accuracy", "heldout_accuracy")
        rows[backend] = {"wall_s": wall, **{k: stats[k] for k in kept}}
        print(f"{backend}: {wall:.1f} s, {stats['kmeans']}, held-out {stats['heldout_accuracy']:.3f}", flush=True)
    # inertia per state of each backend's centroids (sklearn's refitted the same way for a like-for-like number)
    from sklearn.cluster import KMeans

    km = KMeans(n_clusters=args.lists, random_state=cfg.selector.seed, n_init=1, max_iter=cfg.selector.kmeans_max_iter)
    km.fit(z_train.numpy())
    centroids, _, rounds = kmeans(z_train, args.lists, cfg.selector.seed, cfg.selector.kmeans_max_iter, device)
    rows["sklearn"]["inertia_per_state"] = inertia(z_train, torch.from_numpy(km.cluster_centers_).float())
    rows["torch"]["inertia_per_state"] = inertia(z_train, centroids)
    rows["torch"]["rounds"] = rounds
    write_result(
        "kmeans_backends",
        {
            "model": args.model,
            "states_train": len(train),
            "states_heldout": len(held),
            "hidden_size": z_train.shape[1],
            "lists": args.lists,
            "device": device,
            "threads": torch.get_num_threads(),
            "backends": rows,
        },
    )
    ratio = rows["torch"]["inertia_per_state"] / rows["sklearn"]["inertia_per_state"]
    print(
        f"torch/sklearn: wall {rows['torch']['wall_s'] / rows['sklearn']['wall_s']:.2f}x, inertia {ratio:.3f}x, "
        f"held-out accuracy {rows['torch']['heldout_accuracy']:.3f} vs {rows['sklearn']['heldout_accuracy']:.3f}"
    )


if __name__ == "__main__":
    main()
