"""Turn cached scores, generations and perplexities into results.json and samples.jsonl."""

from __future__ import annotations

import datetime as _dt
import json
import math
from pathlib import Path

import numpy as np
from transformers import AutoTokenizer

from openstamp.lab.evaluation.config import EvalConfig
from openstamp.lab.evaluation.downstream import change as downstream_change
from openstamp.lab.evaluation.lengths import LEVEL, mean_curve, run_curve
from openstamp.lab.evaluation.metrics import METRICS, auroc, bootstrap_ci, seq_rep_n, tpr_at_fpr, tpr_at_fpr_ci
from openstamp.lab.evaluation.oracle import load_perplexities
from openstamp.model.load import resolve_model_path
from openstamp.model.perplexity import change, perplexity
from openstamp.runtime import versions
from openstamp.storage import atomic_write_text, read_json

FPRS = {"tpr_at_1pct_fpr": 0.01, "tpr_at_0.1pct_fpr": 0.001}
SUMMARY_METRICS = tuple(m.name for m in METRICS.values() if m.summary)


def _name(s: str) -> str:
    return s.replace("/", "_")


def load_generations(out: Path, name: str) -> list[list[int]]:
    """The completions of a generation set, from its per-batch files under ``out/generations/``."""
    files = sorted((out / "generations" / name).glob("b*.json"))
    return [ids for f in files for ids in read_json(f, "generation batch")]


def score_values(scores: dict) -> dict[str, list[float | None]]:
    """A score cache's scores alone, per text set (None where a text was unscorable): what results.json keeps."""
    return {name: [r["score"] for r in records] for name, records in scores.items()}


def against(values: dict, negatives: str = "human") -> tuple[np.ndarray, np.ndarray]:
    """(watermarked, negatives) score arrays from :func:`score_values`: an unscorable positive is a miss, an
    unscorable negative is dropped."""
    pos = np.array([-math.inf if v is None else v for v in values["watermarked"]], dtype=np.float64)
    return pos, np.array([v for v in values[negatives] if v is not None], dtype=np.float64)


def detection_metrics(scores: dict) -> dict:
    """AUROC and TPR at fixed FPRs against human text (primary) and unwatermarked completions; TPR@1%FPR's
    bootstrap interval over texts."""
    values = score_values(scores)
    (pos, human), (_, unwm) = against(values), against(values, "unwatermarked")
    if not len(human) or not len(unwm):
        raise ValueError(
            "no human or no unwatermarked text got a score (each was shorter than the detector's min_tokens once "
            "re-tokenised): raise --new-tokens"
        )
    out = {"auroc": auroc(pos, human), "auroc_vs_unwatermarked": auroc(pos, unwm)}
    for name, fpr in FPRS.items():
        t = tpr_at_fpr(pos, human, fpr)
        out[name] = t["tpr"]
        out[f"{name}_resolution_limited"] = t["resolution_limited"]
    out["tpr_at_1pct_fpr_ci"] = tpr_at_fpr_ci([(pos, human)], FPRS["tpr_at_1pct_fpr"])
    out["tpr_at_1pct_fpr_vs_unwatermarked"] = tpr_at_fpr(pos, unwm, 0.01)["tpr"]
    # a method that gives p-values; a text it refused as too short is not flagged
    if any(r["p_value"] is not None for r in scores["watermarked"]):
        p_values = [1.0 if r["p_value"] is None else r["p_value"] for r in scores["watermarked"]]
        out["flagged_at_p_0.01"] = float(np.mean(np.array(p_values) <= LEVEL))
        for negatives in ("human", "unwatermarked"):  # the false-positive rate of the p-value's decision
            out[f"{negatives}_flagged_at_p_0.01"] = float(
                np.mean([r["p_value"] <= LEVEL for r in scores[negatives] if r["p_value"] is not None])
            )
    return out


def quality_metrics(ppl: list[float], reference: list[float] | None, completions: list[list[int]]) -> dict:
    """Perplexity (mean, median, bootstrap CIs, ratio to the same prompts' reference) and seq-rep-3."""
    out = {"seq_rep_3": float(np.nanmean([seq_rep_n(c, 3) for c in completions]))}
    if ppl:
        values = np.array(ppl, dtype=np.float64)
        out.update(
            ppl_mean=float(np.nanmean(values)),
            ppl_median=float(np.nanmedian(values)),
            ppl_mean_ci=bootstrap_ci(values, np.mean),
            ppl_median_ci=bootstrap_ci(values, np.median),
        )
        if reference is not None:
            ratios = values / np.array(reference, dtype=np.float64)
            out.update(
                ppl_ratio_median=float(np.nanmedian(ratios)),
                ppl_ratio_of_means=float(np.nanmean(values) / np.nanmean(reference)),
            )
    return out


def own_ppl_metrics(nll: list[float] | None, original: list[float] | None) -> dict:
    """The generating model's own perplexity on the human continuations, and its change against the original's."""
    if nll is None:
        return {}
    out = {"own_ppl": perplexity(nll)}
    if original is not None:
        delta = change(nll, original)
        out.update(own_ppl_change=delta["change"], own_ppl_change_ci=delta["ci"])
    return out


def downstream_metrics(acc: dict | None, original: dict | None) -> dict:
    """Per task: accuracy and its paired change against the original model; their means over the tasks."""
    if not acc or not original:
        return {}
    per_task = {task: downstream_change(values, original[task]) for task, values in acc.items()}
    return {
        "downstream": per_task,
        "downstream_acc": float(np.mean([t["acc"] for t in per_task.values()])),
        "downstream_change": float(np.mean([t["change"] for t in per_task.values()])),
    }


def _mean_sd(values: list[float]) -> dict:
    arr = np.array([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if len(arr) == 0:
        return {"mean": None, "sd": None}
    return {"mean": float(arr.mean()), "sd": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0}


def summarize(runs: list[dict]) -> list[dict]:
    """One point per (method, strength): each summary metric's mean and sd over its seeds, and TPR@1%FPR's
    bootstrap interval over seeds and texts (runs drawn with replacement, then texts inside each:
    metrics.tpr_at_fpr_ci), from the scores each run keeps."""
    summary = []
    for key in dict.fromkeys((r["method"], r["strength"]) for r in runs):
        group = [r for r in runs if (r["method"], r["strength"]) == key]
        point = {m: _mean_sd([g["metrics"].get(m) for g in group]) for m in SUMMARY_METRICS}
        point["tpr_at_1pct_fpr"]["ci"] = tpr_at_fpr_ci([against(g["scores"]) for g in group], FPRS["tpr_at_1pct_fpr"])
        summary.append({"method": key[0], "strength": key[1], "seeds": len(group), **point})
    return summary


def collect_results(out: Path, cfg: EvalConfig, runs: list[dict], windows: list[dict]) -> dict:
    oracle_files = {}

    def ppl_of(name):
        path = out / "ppl" / f"{_name(name)}.json"
        if not path.exists():
            return []
        oracle_files[name] = load_perplexities(path, cfg.dtype)
        return oracle_files[name]["values"]

    def own_nll(name):
        path = out / "own_ppl" / f"{_name(name)}.json"
        return read_json(path, "own perplexity cache") if path.exists() else None

    def downstream_of(name):
        path = out / "downstream" / f"{_name(name)}.json"
        return read_json(path, "downstream accuracy cache") if path.exists() else None

    original = own_nll("original")
    original_downstream = downstream_of("original")
    per_run = []
    for r in runs:
        scores = read_json(out / "scores" / f"{_name(r['run'])}.json", "score cache")
        reference = ppl_of(f"unwatermarked/s{r['seed']}") or None
        metrics = {
            **detection_metrics(scores),
            **quality_metrics(ppl_of(r["generations"]), reference, load_generations(out, r["generations"])),
            **own_ppl_metrics(own_nll(r["generations"]), original),
            **downstream_metrics(downstream_of(r["generations"]), original_downstream),
        }
        length_curve = run_curve(out, r["run"], scores, cfg.new_tokens)
        extra = {"length_curve": length_curve} if length_curve else {}
        per_run.append({**r, "metrics": metrics, **extra, "scores": score_values(scores)})
    references = {"human": quality_metrics(ppl_of("human"), None, [w["human"] for w in windows])}
    if original is not None:
        references["human"]["own_ppl_original"] = perplexity(original)
    for seed in cfg.seeds:
        name = f"unwatermarked/s{seed}"
        references[name] = quality_metrics(ppl_of(name), None, load_generations(out, name))
    write_samples(out, cfg, per_run, windows, ppl_of)
    return {
        "config": json.loads(json.dumps(cfg.to_dict())),
        "versions": versions(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "runs": per_run,
        "summary": summarize(per_run),
        "length_curve": mean_curve(per_run),
        "downstream_original": {t: float(np.mean(a)) for t, a in (original_downstream or {}).items()},
        "references": references,
        "oracle": {"model": cfg.oracle, "dtypes": sorted({f["dtype"] for f in oracle_files.values()})},
    }


def write_samples(out: Path, cfg: EvalConfig, runs: list[dict], windows: list[dict], ppl_of) -> None:
    """One line per (seed, prompt): the texts and every score, for inspection."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(cfg.model))
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)  # noqa: E731
    lines = []
    for seed in cfg.seeds:
        unwm, unwm_ppl = load_generations(out, f"unwatermarked/s{seed}"), ppl_of(f"unwatermarked/s{seed}")
        per_run = {
            r["run"]: (
                read_json(out / "scores" / f"{_name(r['run'])}.json", "score cache"),
                load_generations(out, r["generations"]),
                ppl_of(r["generations"]),
            )
            for r in runs
            if r["seed"] == seed
        }
        for i, w in enumerate(windows):
            record = {
                "seed": seed,
                "index": i,
                "corpus": w["corpus"],
                "prompt": decode(w["prompt"]),
                "human": decode(w["human"]),
                "unwatermarked": decode(unwm[i]),
                "unwatermarked_ppl": unwm_ppl[i] if unwm_ppl else None,
                "runs": {},
            }
            for run, (scores, gens, ppl) in per_run.items():
                record["runs"][run] = {
                    "completion": decode(gens[i]),
                    "ppl": ppl[i] if ppl else None,
                    **{f"{k}_score": scores[k][i]["score"] for k in ("watermarked", "human", "unwatermarked")},
                    "p_value": scores["watermarked"][i]["p_value"],
                }
            lines.append(json.dumps(record))
    atomic_write_text(out / "samples.jsonl", "\n".join(lines) + "\n")
