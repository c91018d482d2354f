"""Does the selector need an intercept? Selector accuracy with and without one, with P = I and trained P.

    python benchmarks/selector_variants.py [--states 24576]

A weight patch dW = G S P has no bias, so the product uses ridge without an intercept; this
measures what an intercept (equivalently, centring the states) would add. Held-out states come
from whole held-out documents. Writes benchmarks/results/selector_variants.json.
"""

from __future__ import annotations

import argparse

import torch
from common import write_result

from openstamp import load_documents, load_model, load_profile, split_documents
from openstamp.embedder import encode_texts
from openstamp.hidden import collect_states
from openstamp.key.projection import train_projection
from openstamp.key.selector import accuracy, cluster, rescale_rows, ridge
from openstamp.watermark import split_by_document


def fit(z_train, z_held, cfg, intercept: bool) -> dict:
    clusters = cluster(z_train, cfg)
    labels, held = clusters.labels, clusters.predict(z_held)
    sizes = torch.bincount(labels, minlength=cfg.n_lists)
    keep = sizes >= cfg.min_cluster_size
    remap = torch.full((cfg.n_lists,), -1)
    remap[keep] = torch.arange(int(keep.sum()))
    y, y_held = remap[labels], remap[held]
    zt, zh = z_train[y >= 0], z_held[y_held >= 0]
    if intercept:
        zt = torch.cat([zt, torch.ones(len(zt), 1)], 1)
        zh = torch.cat([zh, torch.ones(len(zh), 1)], 1)
    S = ridge(zt, y[y >= 0], int(keep.sum()), cfg.ridge_lambda)
    S, factors = rescale_rows(S, zt, y[y >= 0])
    return {
        "train_accuracy": accuracy(S, zt, y[y >= 0]),
        "heldout_accuracy": accuracy(S, zh, y_held[y_held >= 0]),
        "rescale_factor_mean": float(factors.mean()),
        "n_lists": int(keep.sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="wikipedia")
    parser.add_argument("--states", type=int, default=24576)
    args = parser.parse_args()
    cfg = load_profile("default").with_overrides({"states.n_states": args.states})
    model, tokenizer = load_model(args.model)
    docs = split_documents(load_documents(args.corpus), "key")
    states = collect_states(model, tokenizer, docs, cfg.states)
    train, held = split_by_document(states, cfg.selector.heldout_fraction, cfg.selector.seed)
    subset = train[: cfg.projection.n_states]
    targets = encode_texts([states.texts[i] for i in subset.tolist()], cfg.projection.embedder)
    P, _ = train_projection(states.hidden[subset], targets, cfg.projection)
    rows = {}
    for name, proj in (("P = I", None), ("trained P", P)):
        z = states.hidden if proj is None else states.hidden @ proj.T
        for intercept in (False, True):
            label = f"{name}, {'with' if intercept else 'no'} intercept"
            rows[label] = fit(z[train], z[held], cfg.selector, intercept)
            print(label, rows[label], flush=True)
    write_result(
        "selector_variants",
        {
            "model": args.model,
            "corpus": args.corpus,
            "n_states": len(states),
            "n_lists": cfg.selector.n_lists,
            "variants": rows,
        },
    )
    print(f"\n{'variant':32s}{'train acc':>10s}{'held-out acc':>14s}{'rescale x':>11s}")
    for label, r in rows.items():
        print(f"{label:32s}{r['train_accuracy']:10.3f}{r['heldout_accuracy']:14.3f}{r['rescale_factor_mean']:11.2f}")


if __name__ == "__main__":
    main()
