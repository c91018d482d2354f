"""Merge evaluations run as shards: one comparison, each shard holding its own seeds.

A seed of the Pareto sweep costs about 86 minutes on 2 CPU cores, so its seeds can run in
separate folders, on separate machines or days, and be merged from their results.json files
alone. Each run keeps its scores there, so the merged summary is what one folder holding every
seed computes: per (method, strength) the mean and sd over seeds, and TPR@1%FPR's bootstrap
interval over seeds then texts (results.summarize); the length curve is the mean over seeds.

Shards must agree on every setting but their seeds, hold no seed twice, and have scored the
same human text (their human reference figures agree); each shard's seeds, versions, creation
time and timings are kept under ``shards``.

The dtypes an eval resolved for its machine (``RESOLVED_DTYPES``: 'fast' is bfloat16 where the CPU
computes it natively, float32 elsewhere) may differ only when the merge is told so
(``mixed_dtypes``): each run's cost is measured against its own shard's original model, so its
figures stay paired, and the merged config names each seed's dtype (``dtypes`` keeps them by
seed). Where the shards' dtypes differ, or their oracles', the human perplexities they share need
agree only to ``DTYPE_TOLERANCE``; the rest of the reference still to ``TOLERANCE``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import numpy as np

from openstamp.lab.evaluation.config import RESOLVED_DTYPES, EvalConfig
from openstamp.lab.evaluation.lengths import mean_curve
from openstamp.lab.evaluation.results import summarize
from openstamp.lab.evaluation.timings import sum_timings
from openstamp.storage import atomic_write_json, changed_fields, differences, read_json

TOLERANCE = 1e-3  # relative: the same text's reference figures, maybe computed on another machine
# relative, for perplexities of the same text computed in other dtypes (bfloat16 against float32 moved Qwen2.5-Coder-
# 0.5B's own perplexity of 100 human windows by 0.15%)
DTYPE_TOLERANCE = 1e-2


def load_shard(path: Path) -> tuple[str, dict]:
    """(name, results) from a results.json file or the folder holding one."""
    path = Path(path)
    file = path / "results.json" if path.is_dir() else path
    if not file.exists():
        raise ValueError(f"{path} holds no results.json: run `openstamp eval` into it first")
    return str(path), read_json(file, "results file")


def mismatch(results: dict, other: dict, mixed_dtypes: bool = False) -> str:
    """Why two evaluations are not shards of one comparison, '' where they are: a setting other than the seeds
    (and, with ``mixed_dtypes``, the resolved dtypes) differs, or they scored other human text (their human
    reference figures or the original model's downstream accuracy differ)."""
    free = ("seeds", *(RESOLVED_DTYPES if mixed_dtypes else ()))
    ours, theirs = (
        {k: v for k, v in EvalConfig.recorded(r["config"]).items() if k not in free} for r in (results, other)
    )
    if changed := differences(ours, theirs):
        dtypes_only = set(changed_fields(ours, theirs)) <= set(RESOLVED_DTYPES)
        return f"they ran other settings ({changed})" + (" (merge with --mixed-dtypes)" if dtypes_only else "")
    loose = _other_dtypes(results, other)
    for what, of in (
        ("human reference", lambda r: r["references"]["human"]),
        ("original model's downstream accuracy", lambda r: r["downstream_original"]),
    ):
        if not _agree(of(results), of(other), loose):
            return f"they differ in the {what}, so they did not score the same text"
    return ""


def _other_dtypes(results: dict, other: dict) -> bool:
    """Whether two evaluations' models ran in more than one dtype between them: a resolved field with two dtypes
    over their seeds, or other oracle dtypes."""
    ours, theirs = (dtypes_by_seed([("", r)]) for r in (results, other))
    mixed = any(len({*ours[k].values(), *theirs[k].values()}) > 1 for k in RESOLVED_DTYPES)
    return mixed or oracle_dtypes(results) != oracle_dtypes(other)


def dtypes_by_seed(shards: list[tuple[str, dict]]) -> dict[str, dict[str, str]]:
    """Each resolved dtype field -> seed -> the dtype that seed ran in (a merged shard keeps its own)."""
    by_seed: dict[str, dict[str, str]] = {k: {} for k in RESOLVED_DTYPES}
    for _, results in shards:
        recorded = EvalConfig.recorded(results["config"])
        for field in RESOLVED_DTYPES:
            kept = results.get("dtypes", {}).get(field, {})
            by_seed[field].update({str(s): kept.get(str(s), recorded[field]) for s in results["config"]["seeds"]})
    return {k: dict(sorted(v.items(), key=lambda kv: int(kv[0]))) for k, v in by_seed.items()}


def _described(seeds: dict[str, str]) -> str:
    """'bfloat16' where every seed ran in it, else 'bfloat16 (seed 0), float32 (seeds 1, 2)'."""
    groups: dict[str, list[str]] = {}
    for seed, dtype in seeds.items():
        groups.setdefault(dtype, []).append(seed)
    if len(groups) == 1:
        return next(iter(groups))
    return ", ".join(f"{d} (seed{'s' * (len(s) > 1)} {', '.join(s)})" for d, s in groups.items())


def oracle_dtypes(results: dict) -> list[str]:
    """The dtypes the oracle ran in; results from before they were recorded ran it in the model's dtype."""
    return results["oracle"]["dtypes"] if "oracle" in results else [results["config"].get("dtype", "float32")]


def merge_shards(shards: list[tuple[str, dict]], mixed_dtypes: bool = False) -> dict:
    """One results dict from the (name, results) of shards of the same comparison (``mixed_dtypes``: they may have
    resolved other dtypes; see the module's docstring)."""
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
        if reason := mismatch(results, first, mixed_dtypes):
            raise ValueError(f"{name} and {first_name} are not shards of one comparison: {reason}")
        for seed in results["config"]["seeds"]:
            if seed in seen:
                raise ValueError(f"seed {seed} is in both {seen[seed]} and {name}; a shard holds its own seeds")
            seen[seed] = name
    runs = sorted((r for _, results in shards for r in results["runs"]), key=lambda r: r["seed"])
    references = {"human": first["references"]["human"]}
    for _, results in shards:
        references.update({k: v for k, v in results["references"].items() if k != "human"})
    dtypes = dtypes_by_seed(shards)
    mixed = {k: seeds for k, seeds in dtypes.items() if len(set(seeds.values())) > 1}
    return {
        "config": {**first["config"], "seeds": sorted(seen), **{k: _described(v) for k, v in mixed.items()}},
        **({"dtypes": mixed} if mixed else {}),
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


def merge_into(out: Path, sources: list[Path], mixed_dtypes: bool = False) -> dict:
    """Merge the shards at ``sources`` into ``out``/results.json (a folder of merged results, not a run)."""
    out = Path(out)
    if (out / "config.json").exists():
        raise ValueError(f"{out} is an `openstamp eval` run folder; merge into a new folder")
    merged = merge_shards([load_shard(p) for p in sources], mixed_dtypes)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", merged)
    return merged


def _agree(a, b, loose: bool = False, ppl: bool = False) -> bool:
    """Equal, numbers to ``TOLERANCE``; with ``loose``, perplexities (a key naming ppl) to ``DTYPE_TOLERANCE``."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_agree(a[k], b[k], loose, ppl or "ppl" in str(k)) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_agree(x, y, loose, ppl) for x, y in zip(a, b, strict=True))
    if isinstance(a, float | int) and isinstance(b, float | int):
        rtol = DTYPE_TOLERANCE if loose and ppl else TOLERANCE
        return bool(np.isclose(a, b, rtol=rtol, atol=0.0, equal_nan=True))
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
