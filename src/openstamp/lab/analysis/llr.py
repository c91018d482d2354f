"""The LLR detector applied to the weight-level baselines (the paper's appendix on baselines).

For a method that changes the weights (Unremovable, GaussMark, KGW-distilled), the owner holds
both models, so each text x_1..x_T (the completion alone, after BOS: no prompt, as OpenStamp's
detector) can be scored by the length-normalised log-likelihood ratio

    LLR(x) = 1/(T - s) sum_{t=s}^{T-1} [log p_wm(x_t | x_<t) - log p_orig(x_t | x_<t)]
           = NLL_orig(x) - NLL_wm(x)

(s = 1 with BOS, else the first token is context), instead of the method's native detector.
Both are compared on the same texts of the eval (the LLR reads their token ids; the native
detectors scored the decoded text, as the eval did): its watermarked completions against human
continuations (the primary negatives) and unwatermarked completions, at the eval's FPRs.

NLL_orig of a set is the same for every run that scores it (the human text for all, a seed's
unwatermarked text for that seed's runs), so it is computed once. A watermark that changes lm_head
alone (``keeps_hidden``: Unremovable) is applied to the original model in place and reverted, its
NLL_wm read from the original's final hidden states: one decoder pass per text for both models.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from openstamp.detect.plots import new_figure, save_figure
from openstamp.lab.analysis import write_results
from openstamp.lab.attacks.common import load_method, mean_sd, open_eval, watermarked_copy
from openstamp.lab.evaluation.results import detection_metrics
from openstamp.lab.hidden import HiddenCache, lab_hidden, reusing
from openstamp.lab.methods import REGISTRY, Carrier
from openstamp.model.load import load_model
from openstamp.model.perplexity import window_nll
from openstamp.model.text import bos_prefix

SELF_LLR = ("openstamp", "openstamp-nosem")  # their native detector is the LLR already


def text_nll(model, texts: list[list[int]], prefix: list[int], batch_size: int = 8) -> list[float]:
    """Mean NLL of each text after ``prefix`` (nan for a text with nothing to score)."""
    return window_nll(model, [(prefix, ids) for ids in texts], batch_size=batch_size, hidden=lab_hidden)


def text_llr(watermarked, base, texts: list[list[int]], prefix: list[int], batch_size: int = 8) -> list[float]:
    """LLR(x) of each text (nan for a text with nothing to score)."""
    wm, orig = (text_nll(m, texts, prefix, batch_size) for m in (watermarked, base))
    return [o - w for o, w in zip(orig, wm, strict=True)]


@contextlib.contextmanager
def carrying(base, method, hidden: HiddenCache):
    """The model carrying ``method``'s watermark: ``base`` itself, patched in place and reverted on leaving, with
    ``hidden``'s states re-used where the watermark keeps the decoder's (``keeps_hidden``); else a copy."""
    if not method.keeps_hidden:
        yield watermarked_copy(base, method)
        return
    method.apply(base)
    try:
        with reusing(hidden):
            yield base
    finally:
        method.revert(base)


def as_scores(values: list[float]) -> list[dict]:
    """LLRs in the record shape detection_metrics reads (no p-value: thresholds come from negatives)."""
    return [{"score": None if v != v else v, "p_value": None} for v in values]


# each side's figures: AUROC and TPR at both of the eval's FPRs against human text (0.1% is resolution-limited
# below 1000 human texts: its threshold is then the highest human score), and at 1% against unwatermarked text
NATIVE = (
    "auroc",
    "tpr_at_1pct_fpr",
    "tpr_at_0.1pct_fpr",
    "tpr_at_0.1pct_fpr_resolution_limited",
    "tpr_at_1pct_fpr_vs_unwatermarked",
)


def run_llr(eval_dir, out, n: int | None = None, batch_size: int = 8, progress: bool = True) -> dict:
    """Rescore every weight-level baseline run of an eval with the LLR; native figures beside it."""
    ev, out = open_eval(eval_dir), Path(out)
    runs = [r for r in ev.runs if r["method"] not in SELF_LLR and REGISTRY[r["method"]].carrier is Carrier.WEIGHTS]
    if not runs:
        raise ValueError(f"{eval_dir} has no weight-level baseline run (unremovable, gaussmark, kgw-distilled)")
    base, tokenizer = load_model(ev.cfg.model, dtype=ev.cfg.dtype, device=ev.cfg.device)
    count = min(n or len(ev.windows), len(ev.windows))
    prefix = bos_prefix(tokenizer)
    texts = {"human": [w["human"] for w in ev.windows[:count]]}
    hidden, original = HiddenCache(), {}  # original: NLL_orig by text set, for every run that scores the set
    rows = []
    for run in tqdm(runs, desc="LLR on baselines", disable=not progress):
        method = load_method(ev, run, base)
        sets = {
            **texts,
            "watermarked": ev.generations(run)[:count],
            "unwatermarked": ev.unwatermarked(run["seed"])[:count],
        }
        names = {"human": "human", "watermarked": run["run"], "unwatermarked": f"unwatermarked/s{run['seed']}"}
        # the original's states are kept only for a watermark that reads them (a copy runs its own decoder)
        with reusing(hidden) if method.keeps_hidden else contextlib.nullcontext():
            for k, ids in sets.items():
                if names[k] not in original:
                    original[names[k]] = text_nll(base, ids, prefix, batch_size)
        with carrying(base, method, hidden) as watermarked:
            wm = {k: text_nll(watermarked, ids, prefix, batch_size) for k, ids in sets.items()}
        del watermarked  # a copy is freed before the next run's
        scores = {k: as_scores([o - w for o, w in zip(original[names[k]], wm[k], strict=True)]) for k in sets}
        llr = detection_metrics(scores)
        native = detection_metrics({k: v[:count] for k, v in ev.scores(run).items() if k in sets})
        rows.append(
            {
                "run": run["run"],
                "method": run["method"],
                "strength": run["strength"],
                "texts": count,
                "native": {k: native[k] for k in NATIVE},
                "llr": {k: llr[k] for k in NATIVE},
                "mean_llr": {k: mean_sd([r["score"] for r in v])["mean"] for k, v in scores.items()},
            }
        )
    results = {"command": "openstamp analyze llr", "eval": str(ev.path), "n": count, "rows": rows}
    return write_results(out, results, "llr.png", lambda path: plot(rows, path))


def plot(rows: list[dict], path: Path) -> None:
    """TPR at 1% FPR against human text, native detector beside the LLR, per run."""
    fig, ax = new_figure(max(4, 1.6 * len(rows)), 3.5)
    x = np.arange(len(rows))
    for offset, detector in ((-0.2, "native"), (0.2, "llr")):
        ax.bar(x + offset, [r[detector]["tpr_at_1pct_fpr"] for r in rows], 0.4, label=detector)
    ax.set_xticks(x, [r["run"] for r in rows], fontsize=8)
    ax.set(ylabel="TPR at 1% FPR (human negatives)", ylim=(0, 1.05))
    ax.set_title(f"the LLR detector on the baselines (n = {rows[0]['texts']})")
    ax.legend(fontsize=8)
    save_figure(fig, path)
