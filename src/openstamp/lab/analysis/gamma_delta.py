"""The effect of gamma and delta: detection and cost over a grid, one key (the paper's appendix).

The key's secret, P and S stay fixed; for every green fraction gamma the lists G are redrawn
from the same secret (PRF(seed, l, i) < gamma), and for every delta the model is watermarked,
samples one completion per held-out prompt, and the completions are detected with their
calibrated p-values, exactly as ``openstamp tune`` probes a strength (``tune.probe``):

* TPR = share of completions flagged at p <= fpr (95% Clopper-Pearson interval);
* own_ppl_change = own_ppl(watermarked) / own_ppl(original) - 1 on the prompts' human
  continuations.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from pathlib import Path

from openstamp.corpus import load_documents, split_documents
from openstamp.detect.plots import new_figure, save_figure
from openstamp.embed.tune import TuneConfig, heldout_pairs, own_perplexity, probe
from openstamp.key.key import WatermarkKey
from openstamp.lab.analysis import write_results
from openstamp.model.load import load_model
from openstamp.model.patch import check_key, release_tied_head

log = logging.getLogger(__name__)


def grid(model, tokenizer, key: WatermarkKey, pairs, cfg: TuneConfig, gammas, deltas, progress: bool) -> dict:
    """Probe every (gamma, delta); ``model`` is the original model and is left as it was."""
    tied_head = release_tied_head(key)
    original = own_perplexity(model, tokenizer, pairs, cfg.batch_size)
    rows = []
    for gamma in gammas:
        for delta in deltas:
            variant = dataclasses.replace(key, gamma=gamma, delta=delta, meta=copy.deepcopy(key.meta))
            row = {"gamma": gamma, **probe(model, tokenizer, variant, pairs, cfg, tied_head, progress)}
            row["own_ppl_change"] = row["own_ppl"] / original - 1
            log.info("gamma %g, delta %g: TPR %.3f, own perplexity %+.1f%%", gamma, delta, row["tpr"],
                     100 * row["own_ppl_change"])  # fmt: skip
            rows.append(row)
    return {"own_ppl_original": original, "rows": rows}


def run_gamma_delta(model_spec: str, key_dir, corpus: str, gammas, deltas, cfg: TuneConfig, out, progress=True) -> dict:
    """Load the key and its model, probe the grid on ``corpus``'s held-out half, write results and plot."""
    out = Path(out)
    key = WatermarkKey.load(key_dir)
    model, tokenizer = load_model(model_spec)
    if check_key(model, key) != "original":
        raise ValueError(f"{model_spec} carries the watermark of {key_dir}; pass the original (unwatermarked) model")
    pairs = heldout_pairs(tokenizer, split_documents(load_documents(corpus), "heldout"), cfg)
    results = {
        "command": "openstamp analyze gamma-delta",
        "model": model_spec,
        "key_id": key.key_id,
        "corpus": corpus,
        "settings": dataclasses.asdict(cfg),
        **grid(model, tokenizer, key, pairs, cfg, gammas, deltas, progress),
    }
    return write_results(out, results, "gamma_delta.png", lambda path: plot(results, path))


def plot(results: dict, path: Path) -> None:
    """TPR and own-perplexity change against delta, one line per gamma."""
    fig, axes = new_figure(9, 3.5, ncols=2)
    settings = results["settings"]
    for gamma in dict.fromkeys(r["gamma"] for r in results["rows"]):
        rows = [r for r in results["rows"] if r["gamma"] == gamma]
        deltas = [r["delta"] for r in rows]
        axes[0].plot(deltas, [r["tpr"] for r in rows], marker="o", label=f"gamma {gamma:g}")
        axes[1].plot(deltas, [1 + r["own_ppl_change"] for r in rows], marker="o", label=f"gamma {gamma:g}")
    axes[0].set(xlabel="delta", ylabel=f"TPR at p <= {settings['fpr']:g}", ylim=(-0.02, 1.02))
    axes[0].set_title(f"detection, {settings['tokens']}-token texts (n = {settings['n']})", fontsize=9)
    axes[1].set(xlabel="delta", ylabel="own perplexity / the original's", yscale="log")
    axes[1].set_title("cost: own perplexity on human text", fontsize=9)
    axes[0].legend(fontsize=8)
    save_figure(fig, path)
