"""Would OpenStamp's detector gain from the LLR of the whole release, not just its head?

    python benchmarks/full_llr.py [--eval runs/sweep-s0 runs/sweep-s1 ...] [--runs openstamp@0.5/s0,...]

On a tied model the release is re-tied: its input embeddings are ``U~`` too, so the released model differs from the
original in its backbone as well as its head. OpenStamp's detector reads the hidden states of the released backbone
and takes the LLR of its head against the original head on them (``detect/llr.py``), so the part of the cost that
the re-tied input embeddings add is not in its score: ``benchmarks/detection_budget.py`` finds its LLR sees about
two thirds of the own perplexity change on human text. This script scores the eval's texts with the full LLR,
``log p_release(x) - log p_original(x)`` with each model's own backbone (two forward passes, ``own_ppl.window_nll``
on each text's scored tokens, as the detector tokenises it), and sets its TPR@1%FPR against the eval's human text and
its budget (``openstamp.evaluation.budget.llr_budget``) beside the kept scores' on the same texts. Each eval's folder
must hold its keys and completions (a sweep seed run here: ``bash benchmarks/reference_runs.sh sweep``, or the
at-cost stages' rerun of it; by default runs/sweep-s0, -s1 and -s2, those that exist).
Writes benchmarks/results/full_llr.json.
"""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import numpy as np
from common import write_result
from tqdm.auto import tqdm

from openstamp.evaluation.budget import cost_nats, llr_budget
from openstamp.evaluation.metrics import pooled_tpr_difference_ci, tpr_at_fpr
from openstamp.evaluation.own_ppl import window_nll
from openstamp.evaluation.results import load_generations
from openstamp.methods import REGISTRY, create
from openstamp.methods.common import scored_sequences
from openstamp.models import load_model
from openstamp.storage import read_json

FPR = 0.01


def text_nll(model, tokenizer, texts: list[str], batch_size: int) -> np.ndarray:
    """Each text's mean NLL over the tokens a detector scores (from ``scored_sequences``)."""
    seqs, first, _ = scored_sequences(tokenizer, texts)
    return np.array(window_nll(model, [(s[:first], s[first:]) for s in seqs], batch_size=batch_size))


def tpr(marked, human) -> float:
    return tpr_at_fpr(marked, human, FPR)["tpr"]


def openstamp_runs(results: dict, wanted: list[str]) -> list[dict]:
    """The eval's OpenStamp runs (OpenStamp and its ablations), or those of them ``wanted`` names."""
    ours = [r for r in results["runs"] if issubclass(REGISTRY.get(r["method"], type(None)), REGISTRY["openstamp"])]
    return [r for r in ours if r["run"] in wanted] if wanted else ours


def eval_rows(folder: Path, results: dict, runs: list[dict], model, tokenizer, batch_size: int) -> list[dict]:
    """Per run of the eval at ``folder``: TPR and budget of the kept (head) LLR and of the full LLR, and (under
    ``_scores``, left out of the JSON) each one's (watermarked, human) per-text scores."""
    cfg = results["config"]
    windows = read_json(folder / "data" / "prompts.json", "prompts")
    human = tokenizer.batch_decode([w["human"] for w in windows], skip_special_tokens=True)
    human_original = text_nll(model, tokenizer, human, batch_size)
    rows = []
    for run in tqdm(runs, desc=str(folder)):
        method = create(run["method"])
        method.load(folder / "keys" / run["method"] / f"s{run['seed']}")
        method = method.with_strength(run["strength"])
        release = copy.deepcopy(model)
        method.apply(release)
        marked = tokenizer.batch_decode(load_generations(folder, run["generations"]), skip_special_tokens=True)
        full_human = human_original - text_nll(release, tokenizer, human, batch_size)
        full_marked = text_nll(model, tokenizer, marked, batch_size) - text_nll(release, tokenizer, marked, batch_size)
        kept = read_json(folder / "scores" / f"{run['run'].replace('/', '_')}.json", "scores")
        kept_human = np.array([t["score"] for t in kept["human"]], dtype=np.float64)
        kept_marked = np.array([t["score"] for t in kept["watermarked"]], dtype=np.float64)
        # a text either LLR could not score (too short: None, or empty: nan) is left out of both
        both = np.isfinite(kept_human) & np.isfinite(full_human)
        kept_human, full_human = kept_human[both], full_human[both]
        both = np.isfinite(kept_marked) & np.isfinite(full_marked)
        kept_marked, full_marked = kept_marked[both], full_marked[both]
        cost, tokens = cost_nats(run["metrics"]["own_ppl_change"]), cfg["new_tokens"]
        rows.append(
            {
                "eval": str(folder),
                "run": run["run"],
                "method": run["method"],
                "strength": run["strength"],
                "own_ppl_change": run["metrics"]["own_ppl_change"],
                "head_llr": {"tpr": tpr(kept_marked, kept_human), **llr_budget(kept_human, kept_marked, cost, tokens)},
                "full_llr": {"tpr": tpr(full_marked, full_human), **llr_budget(full_human, full_marked, cost, tokens)},
                "_scores": {"head_llr": (kept_marked, kept_human), "full_llr": (full_marked, full_human)},
            }
        )
        del release
    return rows


def pooled_gaps(rows: list[dict]) -> list[dict]:
    """Per method and strength, over the evals' keys: each LLR's pooled TPR@1%FPR and the full LLR's minus the head's,
    with ``pooled_tpr_difference_ci``'s paired bootstrap over texts (both LLRs score the same texts)."""
    groups: dict[tuple[str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["strength"]), []).append(r)
    out = []
    for (method, strength), group in groups.items():
        full, head = ([r["_scores"][part] for r in group] for part in ("full_llr", "head_llr"))
        gap, low, high = pooled_tpr_difference_ci(full, head, FPR, paired=True)
        hits = lambda runs: sum(tpr(m, h) * len(m) for m, h in runs) / sum(len(m) for m, _ in runs)  # noqa: E731
        out.append(
            {
                "method": method,
                "strength": strength,
                "keys": len(group),
                "own_ppl_change": float(np.mean([r["own_ppl_change"] for r in group])),
                "head_llr": hits(head),
                "full_llr": hits(full),
                "gap": gap,
                "gap_ci": [low, high],
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = [p for p in (Path(f"runs/sweep-s{seed}") for seed in (0, 1, 2)) if (p / "results.json").exists()]
    parser.add_argument("--eval", type=Path, nargs="+", default=default, help="eval folders with their keys")
    parser.add_argument("--runs", default="", help="comma-separated runs (default: every OpenStamp run of each eval)")
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    if not args.eval:
        raise SystemExit("no eval folder: pass --eval, or run `bash benchmarks/reference_runs.sh sweep` first")
    wanted, loaded = [r for r in args.runs.split(",") if r], []
    for folder in args.eval:
        if not (folder / "results.json").exists():
            raise SystemExit(f"{folder / 'results.json'} is missing: run `bash benchmarks/reference_runs.sh sweep`")
        results = json.loads((folder / "results.json").read_text())
        loaded.append((folder, results, openstamp_runs(results, wanted)))
    missing = sorted(set(wanted) - {r["run"] for _, _, runs in loaded for r in runs})
    if missing or not any(runs for _, _, runs in loaded):
        held = [r["run"] for _, results, _ in loaded for r in openstamp_runs(results, [])]
        raise SystemExit(f"no OpenStamp runs {missing or ''} in {[str(f) for f in args.eval]} (they hold: {held})")
    models = {r["config"]["model"] for _, r, _ in loaded}
    if len(models) != 1:
        raise SystemExit(f"the evals watermark different models: {sorted(models)}")
    model, tokenizer = load_model(models.pop())
    loaded = [(f, r, runs) for f, r, runs in loaded if runs]
    rows = [row for f, r, runs in loaded for row in eval_rows(f, r, runs, model, tokenizer, args.batch_size)]
    pooled = pooled_gaps(rows)
    write_result(
        "full_llr",
        {
            "evals": [{"eval": str(f), "created": r["created"]} for f, r, _ in loaded],
            "model": loaded[0][1]["config"]["model"],
            "fpr": FPR,
            "pooled": pooled,
            "runs": [{k: v for k, v in r.items() if k != "_scores"} for r in rows],
        },
    )
    for r in rows:
        h, f = r["head_llr"], r["full_llr"]
        print(
            f"{r['eval']} {r['run']:24s} +{r['own_ppl_change']:.1%}: head LLR TPR {h['tpr']:.3f} (seen "
            f"{h['seen']:.2f}, signal {h['signal']:.2f}, spread {h['spread']:.2f}); full LLR TPR {f['tpr']:.3f} "
            f"(seen {f['seen']:.2f}, signal {f['signal']:.2f}, spread {f['spread']:.2f})"
        )
    for p in pooled:
        print(
            f"{p['method']}@{p['strength']:g} over {p['keys']} keys: TPR {p['head_llr']:.3f} -> {p['full_llr']:.3f}, "
            f"{p['gap']:+.3f} [{p['gap_ci'][0]:+.3f}, {p['gap_ci'][1]:+.3f}]"
        )


if __name__ == "__main__":
    main()
