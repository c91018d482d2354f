"""Merge evaluations run as shards: one comparison, each shard holding its own seeds.

A seed of the Pareto sweep costs about 86 minutes on 2 CPU cores, so its seeds can run in
separate folders, on separate machines or days, and be merged from their results.json files
alone. Each run keeps its scores there, so the merged summary is what one folder holding every
seed computes: per (method, strength) the mean and sd over seeds, and TPR@1%FPR's bootstrap
interval over seeds then texts (results.summarize); the length curve is the mean over seeds.

Shards must agree on every setting but their seeds, hold no seed twice, and have scored the
same human text (their human reference figures agree); each shard's seeds, versions, creation
time and timings are kept under ``shards``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from openstamp.lab.evaluation.config import EvalConfig
from openstamp.lab.evaluation.lengths import mean_curve
from openstamp.lab.evaluation.results import summarize
from openstamp.lab.evaluation.timings import sum_timings
from openstamp.storage import atomic_write_json, differences, read_json

TOLERANCE = 1e-3  # relative: the same text's reference figures, maybe computed on another machine


def load_shard(path: Path) -> tuple[str, dict]:
    """(name, results) from a results.json file or the folder holding one."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if not file.exists():
        raise ValueError(f"{path} holds no results.json: run `openstamp eval` into it first")
    return str(path), read_json(file, "results file")


def mismatch(results: dict, other: dict) -> str:
    """Why two evaluations are not shards of one comparison, '' where they are: a setting other than the seeds
    differs, or they scored other human text (their human reference figures or the original model's downstream
    accuracy differ)."""
    ours, theirs = (
        {k: v for k, v in EvalConfig.recorded(r["config"]).items() if k != "seeds"} for r in (results, other)
    )
    if changed := differences(ours, theirs):
        return f"they ran other settings ({changed})"
    for what, of in (
        ("human reference", lambda r: r["references"]["human"]),
        ("original model's downstream accuracy", lambda r: r["downstream_original"]),
    ):
        if not _agree(of(results), of(other)):
            return f"they differ in the {what}, so they did not score the same text"
    return ""


def oracle_dtypes(results: dict) -> list[str]:
    """The dtypes the oracle ran in; results from before they were recorded ran it in the model's dtype."""
    return results["oracle"]["dtypes"] if "oracle" in results else [results["config"].get("dtype", "float32")]


def merge_shards(shards: list[tuple[str, dict]]) -> dict:
    """One results dict from the (name, results) of shards of the same comparison."""
    if len(shards) < 2:
        raise ValueError("a merge needs at least two results files")
    first_name, first = shards[0]
    seen: dict[int, str] = {}
    for name, results in shards:
        if any("scores" not in r for r in results["runs"]):
            raise ValueError(
                f"{name} was written before results kept each run's scores: run the same `openstamp eval` on its "
                "folder again (with its caches every stage is re-used and only results.json is rewritten; without "
                "them its seeds run again)"
            )
        if reason := mismatch(results, first):
            raise ValueError(f"{name} and {first_name} are not shards of one comparison: {reason}")
        for seed in results["config"]["seeds"]:
            if seed in seen:
                raise ValueError(f"seed {seed} is in both {seen[seed]} and {name}; a shard holds its own seeds")
            seen[seed] = name
    runs = sorted((r for _, results in shards for r in results["runs"]), key=lambda r: r["seed"])
    references = {"human": first["references"]["human"]}
    for _, results in shards:
        references.update({k: v for k, v in results["references"].items() if k != "human"})
    return {
        "config": {**first["config"], "seeds": sorted(seen)},
        "versions": _versions([results["versions"] for _, results in shards]),
        "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "runs": runs,
        "summary": summarize(runs),
        "length_curve": mean_curve(runs),
        "downstream_original": first["downstream_original"],
        "references": references,
        "oracle": {
            "model": first["config"]["oracle"],
            "dtypes": sorted({d for _, r in shards for d in oracle_dtypes(r)}),
        },
        "timings_s": _timings([results.get("timings_s") for _, results in shards]),
        "shards": [
            {
                "from": name,
                "seeds": results["config"]["seeds"],
                "created": results["created"],
                "versions": results["versions"],
                **({"timings_s": results["timings_s"]} if "timings_s" in results else {}),
            }
            for name, results in shards
        ],
    }


def merge_into(out: Path, sources: list[Path]) -> dict:
    """Merge the shards at ``sources`` into ``out``/results.json (a folder of merged results, not a run)."""
    out = Path(out)
    if (out / "config.json").exists():
        raise ValueError(f"{out} is an `openstamp eval` run folder; merge into a new folder")
    merged = merge_shards([load_shard(p) for p in sources])
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", merged)
    return merged


def _agree(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_agree(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_agree(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float | int) and isinstance(b, float | int):
        return bool(np.isclose(a, b, rtol=TOLERANCE, atol=0.0, equal_nan=True))
    return a == b


def _versions(all_versions: list[dict]) -> dict:
    """Each package's version; where shards ran different ones, all of them ('a / b')."""
    names = dict.fromkeys(k for v in all_versions for k in v)
    return {k: " / ".join(dict.fromkeys(str(v.get(k)) for v in all_versions)) for k in names}


def _timings(all_timings: list[dict | None]) -> dict | None:
    """Each stage's seconds summed over the shards (their machines' time, not wall-clock time)."""
    known = [t for t in all_timings if t]
    if not known:
        return None
    return {
        **sum_timings([t["stages"] for t in known], [t.get("methods", {}) for t in known]),
        "invocations": sum(t["invocations"] for t in known),
        "complete": len(known) == len(all_timings) and all(t.get("complete", True) for t in known),
        "shards": len(all_timings),
    }
