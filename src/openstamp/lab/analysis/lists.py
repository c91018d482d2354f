"""How the number of green lists L shapes the watermark: the paper's overlap and variability analyses.

For a key with factors S (L x d), P and green lists G (V x L, fraction gamma), the watermark
logits of a hidden state h are dW h = delta G S P h. With g = gamma |V| (the size of a green
list; never-green tokens excepted):

* overlap(h) = |top_g(dW h) ∩ G_l| / g, with l = argmax_i (S P h)_i: how far the tokens the
  offset favours most are the intended list's (1 at L = 1, falling as lists mix);
* jaccard(h, h') = |top_g(dW h) ∩ top_g(dW h')| / |top_g(dW h) ∪ top_g(dW h')| over random pairs
  of states: how alike the favoured sets of two contexts are (lower: a more varied watermark,
  harder to reverse-engineer).

``sweep`` refits S for every L on the same projected training states (k-means, ridge and
rescaling as key building does), draws G for every gamma from one secret, and measures both on
held-out states.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from openstamp.config import SelectorConfig, StatesConfig
from openstamp.corpus import load_documents, split_documents
from openstamp.detect.plots import new_figure, save_figure
from openstamp.embed.build import split_by_document
from openstamp.embed.states import collect_states
from openstamp.key.key import WatermarkKey
from openstamp.key.selector import fit_selector
from openstamp.lab.analysis import write_results
from openstamp.model.load import load_model


def green_size(key: WatermarkKey) -> int:
    """g: the mean size of a green list."""
    return int(round(float(key.green.sum(0).float().mean())))


def top_sets(key: WatermarkKey, hidden: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """The g token ids with the largest watermark logits of each state: long (N, g)."""
    g = green_size(key)
    return torch.cat(
        [key.watermark_logits(hidden[i : i + chunk]).topk(g, dim=-1).indices for i in range(0, len(hidden), chunk)]
    )


def overlap(key: WatermarkKey, hidden: torch.Tensor, top: torch.Tensor | None = None) -> float:
    """Mean over states of the share of the top-g tokens that lie in the state's argmax list."""
    top = top_sets(key, hidden) if top is None else top
    lists = key.selector_values(hidden).argmax(-1)
    return float(key.green[top, lists[:, None]].float().mean())


def jaccard(key: WatermarkKey, top: torch.Tensor, pairs: int = 2000, seed: int = 0) -> float:
    """Mean Jaccard similarity of the top-g sets of ``pairs`` random pairs of distinct states."""
    rng = np.random.default_rng(seed)
    first = rng.integers(0, len(top), pairs)
    second = (first + rng.integers(1, len(top), pairs)) % len(top)  # never the same state
    values = []
    for a, b in zip(first.tolist(), second.tolist(), strict=True):
        mask = torch.zeros(key.vocab_size, dtype=torch.int8)
        mask[top[a]] += 1
        mask[top[b]] += 1
        values.append(float((mask == 2).sum()) / float((mask > 0).sum()))
    return float(np.mean(values))


def sweep(
    z_train: torch.Tensor,
    z_held: torch.Tensor,
    held_hidden: torch.Tensor,
    base: WatermarkKey,
    lists: tuple[int, ...],
    gammas: tuple[float, ...],
    selector: SelectorConfig,
    pairs: int = 2000,
) -> list[dict]:
    """Overlap and Jaccard similarity for each (L, gamma): S refitted per L, G redrawn per gamma.

    ``base`` gives the secret, P, delta, the vocabulary and the never-green ids; ``z_*`` are the
    projected training and held-out states (P h), ``held_hidden`` the held-out states h.
    """
    rows = []
    for n_lists in lists:
        S, stats = fit_selector(z_train, z_held, dataclasses.replace(selector, n_lists=n_lists))
        for gamma in gammas:
            key = dataclasses.replace(base, selector=S, gamma=gamma, meta={})
            top = top_sets(key, held_hidden)
            rows.append(
                {
                    "lists_requested": n_lists,
                    "lists": key.n_lists,
                    "gamma": gamma,
                    "overlap": overlap(key, held_hidden, top),
                    "jaccard": jaccard(key, top, pairs),
                    "selector_heldout_accuracy": stats["heldout_accuracy"],
                    "states": len(held_hidden),
                }
            )
    return rows


def key_states(model, tokenizer, key: WatermarkKey, corpus: str, n_states: int, progress: bool = True):
    """States of ``corpus`` (its key half) sampled as the key's were, split as S's were, projected by its P.

    Returns (z_train, z_held, held_hidden, the key's SelectorConfig).
    """
    built = key.meta.get("config", {})  # the key's own settings: S's, and how its states were sampled
    selector = SelectorConfig(**built.get("selector", {}))
    sampling = StatesConfig(**{**built.get("states", {}), "n_states": n_states})
    documents = split_documents(load_documents(corpus), "key")
    states = collect_states(model, tokenizer, documents, sampling, progress)
    train, held = split_by_document(states, selector.heldout_fraction, selector.seed)
    z = states.hidden if key.projection is None else states.hidden @ key.projection.T
    return z[train], z[held], states.hidden[held], selector


def run_lists(
    model_spec: str, key_dir, corpus: str, lists, gammas, n_states: int, pairs: int, out, progress: bool = True
) -> dict:
    """Sample states of ``corpus`` (its key half) as the key's were, project them with its P, sweep (L, gamma).

    Writes out/results.json and out/lists.png.
    """
    out = Path(out)
    base = WatermarkKey.load(key_dir)
    model, tokenizer = load_model(model_spec)
    if base.vocab_size != model.get_output_embeddings().weight.shape[0] or base.hidden_size != model.config.hidden_size:
        raise ValueError(f"the key in {key_dir} was not built for {model_spec} (vocabulary or width differ)")
    z_train, z_held, held_hidden, selector = key_states(model, tokenizer, base, corpus, n_states, progress)
    rows = sweep(z_train, z_held, held_hidden, base, tuple(lists), tuple(gammas), selector, pairs)
    results = {
        "command": "openstamp analyze lists",
        "model": model_spec,
        "key_id": base.key_id,
        "corpus": corpus,
        "states": {"train": len(z_train), "heldout": len(z_held)},
        "projection": base.projection is not None,
        "pairs": pairs,
        "rows": rows,
    }
    return write_results(out, results, "lists.png", lambda path: plot(rows, path))


def plot(rows: list[dict], path) -> None:
    """Overlap and Jaccard similarity against L, one line per gamma."""
    fig, axes = new_figure(9, 3.8, ncols=2)
    for gamma in dict.fromkeys(r["gamma"] for r in rows):
        at = [r for r in rows if r["gamma"] == gamma]
        for ax, key in zip(axes, ("overlap", "jaccard"), strict=True):
            ax.plot([r["lists"] for r in at], [r[key] for r in at], "o-", label=f"gamma {gamma:g}")
    axes[0].set(xscale="log", xlabel="green lists L", ylabel="overlap with the intended list", title="alignment")
    axes[1].set(xscale="log", xlabel="green lists L", ylabel="mean Jaccard of top sets", title="variability")
    axes[0].legend(fontsize=8)
    save_figure(fig, path)
