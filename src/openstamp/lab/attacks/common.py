"""What every attack shares: open an evaluation run, load a run's key, score attacked text, cache.

An attack reads a finished ``openstamp eval`` directory (its config, prompts, keys, generations
and scores), writes its own outputs to ``--out`` and its report section into
``<eval>/attacks/<name>.md`` so that ``openstamp report <eval>`` keeps it.

    out/
      settings.json      the attack's settings; a different setting refuses to reuse the folder
      ...                per-batch caches (generations, paraphrases, scores), so a killed run resumes
      results.json       every number in the section
      section.md, report.md, *.png
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.config import check
from openstamp.lab.evaluation.config import EvalConfig
from openstamp.lab.evaluation.metrics import METRICS
from openstamp.lab.evaluation.pipeline import configured, key_directory
from openstamp.lab.evaluation.results import detection_metrics, load_generations
from openstamp.lab.hidden import autocast_decoder
from openstamp.lab.methods import REGISTRY, Carrier, WatermarkMethod
from openstamp.lab.methods.base import score_dicts
from openstamp.storage import atomic_write_json, changed_settings, read_json

log = logging.getLogger(__name__)


@dataclass
class EvalRun:
    """A finished evaluation directory: its config, prompt windows and the runs in results.json."""

    path: Path
    cfg: EvalConfig
    runs: list[dict]
    windows: list[dict]

    def scores(self, run: dict) -> dict:
        """The run's cached scores: {"watermarked" | "human" | "unwatermarked": [MethodScore dicts]}."""
        return read_json(self.path / "scores" / f"{file_name(run['run'])}.json", "score cache")

    def generations(self, run: dict) -> list[list[int]]:
        return load_generations(self.path, run["generations"])

    def unwatermarked(self, seed: int) -> list[list[int]]:
        """The original model's completions of the prompts, sampled with ``seed``."""
        return load_generations(self.path, f"unwatermarked/s{seed}")

    def prompts(self, n: int | None = None) -> list[list[int]]:
        return [w["prompt"] for w in self.windows[:n]]


def file_name(name: str) -> str:
    return name.replace("/", "_")


def open_eval(path: str | Path) -> EvalRun:
    """Read an ``openstamp eval`` run directory (it must have finished: results.json exists)."""
    path = Path(path)
    results = read_json(path / "results.json", "evaluation results (run `openstamp eval` first)")
    cfg = EvalConfig.from_dict(EvalConfig.recorded(results["config"]))
    windows = read_json(path / "data" / "prompts.json", "prompt cache")
    return EvalRun(path, cfg, results["runs"], windows)


def optional_eval(path: str | Path | None) -> Path | None:
    """Check an optional ``--eval`` directory before any work starts; None stays None."""
    return None if path is None else open_eval(path).path


def select_runs(ev: EvalRun, methods: Sequence[str] | None = None, at_cost: float | None = None) -> list[dict]:
    """The runs to attack: the named methods (default: all), one strength per method and seed.

    After a sweep, the strength kept is the method's configured one, or the middle of its grid; with ``at_cost``,
    the one whose own perplexity change (``own_ppl_change``, 0.3 for +30%) is nearest it, so that the methods are
    attacked at equal cost to the model.
    """
    unknown = set(methods or ()) - {r["method"] for r in ev.runs}
    if unknown:
        raise ValueError(f"method(s) {sorted(unknown)} are not in {ev.path}; it has {sorted(_methods(ev))}")
    chosen = []
    for name in methods or _methods(ev):
        for seed in ev.cfg.seeds:
            group = [r for r in ev.runs if r["method"] == name and r["seed"] == seed]
            if not group:
                continue
            if at_cost is not None:
                chosen.append(_nearest_cost(ev, group, at_cost))
                continue
            wanted = ev.cfg.strengths.get(name, _default_strength(ev.cfg, name))
            exact = [r for r in group if np.isclose(r["strength"], wanted)]
            chosen.append(exact[0] if exact else sorted(group, key=lambda r: r["strength"])[len(group) // 2])
    return chosen


AT_COST_HELP = (
    "attack each method at the strength whose own perplexity change is nearest this (0.3: +30%; an eval with "
    "several strengths, a sweep), not at its default: the methods compared at equal cost"
)


def check_at_cost(at_cost: float | None) -> None:
    """An attack's ``at_cost`` setting (see :func:`select_runs`) is a perplexity change: None or above -1."""
    check(at_cost is None or at_cost > -1, "at_cost is a perplexity change: more than -1 (-100%)")


def cost_note(ev: EvalRun, at_cost: float | None, runs: list[dict]) -> str:
    """The sentence of an attack's section that says, where the methods were chosen at equal cost (``at_cost``),
    each attacked run's own perplexity change; "" otherwise."""
    if at_cost is None:
        return ""
    cost = {r["run"]: r["metrics"]["own_ppl_change"] for r in ev.runs}
    chosen = ", ".join(f"{run} {cost[run]:+.1%}" for run in dict.fromkeys(r["run"] for r in runs))
    return (
        f" At equal cost: each method at the strength of the eval whose own perplexity change is nearest "
        f"{at_cost:+.0%} ({chosen})."
    )


def _nearest_cost(ev: EvalRun, group: list[dict], cost: float) -> dict:
    """The run of ``group`` (one method and seed) whose own perplexity change is nearest ``cost``."""
    if any(r["metrics"].get("own_ppl_change") is None for r in group):
        raise ValueError(
            f"{group[0]['run']} of {ev.path} has no own perplexity change to choose a strength at equal cost by; "
            "run the eval with its own perplexity (the default) or choose the strength without --at-cost"
        )
    return min(group, key=lambda r: abs(r["metrics"]["own_ppl_change"] - cost))


def _methods(ev: EvalRun) -> list[str]:
    return list(dict.fromkeys(r["method"] for r in ev.runs))


def _default_strength(cfg: EvalConfig, name: str) -> float:
    cls = REGISTRY[name]
    return cls(cls.config_class(**cfg.method_settings.get(name, {}))).strength_value


def load_method(ev: EvalRun, run: dict, base: PreTrainedModel) -> WatermarkMethod:
    """A fresh instance of the run's method with its saved key, at the run's strength.

    A weight-level method is applied to ``base`` and reverted (exactly) once, as the eval run
    did before scoring: OpenStamp records the model's head fingerprints in its key when it is
    applied, and its detector checks them.
    """
    name = run["method"]
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(REGISTRY))}")
    directory = key_directory(ev.path, ev.cfg, name, run["seed"], run["strength"])
    if not (directory / "done").exists():
        raise FileNotFoundError(f"the {name} key for seed {run['seed']} is missing from {directory}")
    method = configured(name, ev.cfg)
    method.load(directory)
    method = method.with_strength(run["strength"])
    if method.carrier is Carrier.WEIGHTS:
        method.apply(base)
        method.revert(base)
    return method


def watermarked_copy(base: PreTrainedModel, method: WatermarkMethod) -> PreTrainedModel:
    """A deep copy of ``base`` carrying the method's weight watermark (unchanged for decode-time methods)."""
    model = copy.deepcopy(base)
    if method.carrier is Carrier.WEIGHTS:
        method.apply(model)
    return model


def score_texts(
    method: WatermarkMethod,
    base: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: list[str],
    cfg: EvalConfig,
) -> list[dict]:
    """The method's unchanged detector (with the original model) on attacked texts, as dicts: batched and with its
    decoder in the dtype the eval's own scores were made in."""
    with autocast_decoder(cfg.score_dtype):
        return score_dicts(method, base, tokenizer, texts, cfg.score_batch_size)


# the attack metrics of the registry (the rate at p <= 0.01 among them), then the stricter TPR
DETECTION = (*(name for name, m in METRICS.items() if m.attack), "tpr_at_0.1pct_fpr")


def attacked_metrics(attacked: list[dict], eval_scores: dict) -> dict:
    """AUROC and TPR of attacked positives against the eval run's human (and unwatermarked) negatives, and each
    attacked text's score (``scores``, None where unscorable): with the eval's human scores, a summary can redraw
    both, the threshold with them (``pooled_tpr_difference_ci``)."""
    texts = {"watermarked": attacked, "human": eval_scores["human"], "unwatermarked": eval_scores["unwatermarked"]}
    return {**detection_metrics(texts), "scores": [r["score"] for r in attacked]}


def detection_fields(metrics: dict) -> dict:
    """What an attack's result row keeps of :func:`attacked_metrics`: each of ``DETECTION`` (None where absent: the
    rate at p <= 0.01 of a detector without p-values), TPR@1%FPR's interval and the attacked texts' scores."""
    return {**{k: metrics.get(k) for k in DETECTION}, **{k: metrics[k] for k in ("tpr_at_1pct_fpr_ci", "scores")}}


def mean_score(records: list[dict]) -> float | None:
    """The mean detector score of the scored texts (it moves where TPR saturates); None if none was scored."""
    values = [r["score"] for r in records if r["score"] is not None]
    return float(np.mean(values)) if values else None


def cached_json(path: Path, compute: Callable[..., Any], *args: Any) -> Any:
    """Read ``path`` if it exists; otherwise ``compute(*args)``, write it atomically and return it."""
    if path.exists():
        return read_json(path, "attack cache")
    value = compute(*args)
    atomic_write_json(path, value)
    return value


def prepare_out(out: Path, settings: dict) -> None:
    """Create ``out`` and record the settings; refuse a folder that holds an attack with others.

    A folder may grow by ``methods``: a list that holds every method it already has re-uses their
    caches (paraphrases, scores) and attacks the new ones.
    """
    out.mkdir(parents=True, exist_ok=True)
    path = out / "settings.json"
    if changed := changed_settings(path, settings, "attack settings", grows=("methods",)):
        raise ValueError(
            f"{out} holds an attack with different settings ({changed}); choose another --out or delete it"
        )
    atomic_write_json(path, settings)


def config_dict(cfg: Any) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def mean_sd(values: Sequence[float | None]) -> dict:
    arr = np.array([v for v in values if v is not None and np.isfinite(v)], dtype=np.float64)
    if len(arr) == 0:
        return {"mean": None, "sd": None}
    return {"mean": float(arr.mean()), "sd": float(arr.std(ddof=1)) if len(arr) > 1 else 0.0}


def by_method(rows: list[dict], keys: Sequence[str], extra: Sequence[str] = ()) -> list[dict]:
    """Mean +- sd over seeds of ``keys`` for each (method, *extra) group, in first-seen order."""
    groups = dict.fromkeys(tuple(r[k] for k in ("method", *extra)) for r in rows)
    summary = []
    for group in groups:
        members = [r for r in rows if tuple(r[k] for k in ("method", *extra)) == group]
        entry = dict(zip(("method", *extra), group, strict=True))
        entry.update(seeds=len(members), **{k: mean_sd([m.get(k) for m in members]) for k in keys})
        summary.append(entry)
    return summary
