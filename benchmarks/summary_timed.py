"""The default comparison from a cold start (``reference_runs.sh timed`` and ``timed_again``) as Markdown: its time
per stage and per method, and a later run of it with later code beside the first."""

from __future__ import annotations

from openstamp.evaluation.report import method_seconds, timing_lines
from openstamp.evaluation.shards import oracle_dtypes

# The commit that kept OpenStamp's detector (and a re-tied key's copy of the model) across the eval's score calls
# (b9ac730): evals created before it re-ran the decoder for the length curve's cut texts of both OpenStamp variants.
DETECTOR_KEPT_FROM = "2026-11-26T04:55:43+00:00"
CLOCK_FROM = "2026-11-26T05:48:42+00:00"  # fd91c95: the eval rewrites timings.json every minute, not after each run


def begun_again(invocations: list[dict]) -> str:
    """The method stages that more than one invocation of a resumed eval spent over a second on (``timings.json``:
    one record per invocation): a stage cut short by the interruption is begun again, so this is its cost."""
    seconds: dict[tuple[str, str], list[float]] = {}
    for record in invocations:
        for method, stages in record.get("methods", {}).items():
            for stage, s in stages.items():
                seconds.setdefault((method, stage), []).append(s)
    again = {k: v for k, v in seconds.items() if sum(s > 1 for s in v) > 1}
    if not again:
        return ""
    parts = ", ".join(f"{m} {stage} {' + '.join(f'{s:.0f}' for s in v)} s" for (m, stage), v in again.items())
    return (
        f" Stages that more than one invocation worked on (one cut short by an interruption is begun again, so its "
        f"later part is about what resuming cost): {parts}."
    )


def evaluation_timed(r: dict, before: dict | None, invocations: list[dict] | None = None) -> list[str]:
    """The default comparison from a cold start (``reference_runs.sh timed``): its stages against the kept eval's;
    ``invocations`` (its ``timings.json``) name what a resumed run did twice."""
    t = r["timings_s"]
    tprs = _tprs(r)
    line = (
        f"The default comparison from a cold start (`bash benchmarks/reference_runs.sh timed`: `openstamp eval --n "
        f"{r['config']['n']}`, every method, a new run folder and an empty eval store), measured on "
        f"{r['created'][:10]}: **{t['total'] / 60:.0f} min** recorded, against the issue's goal of 30 min. "
        + timing_lines(t)[0]
    )
    if not t.get("methods"):
        line += " (This run began before the eval recorded each method's part, so only the stages are known.)"
    if t.get("invocations", 1) > 1 and r["created"] < CLOCK_FROM:  # then written after each run only
        line += " The sums leave out what an interrupted invocation spent on the run it was stopped in."
    if invocations:
        line += begun_again(invocations)
    if oracle_dtypes(r) == ["float32"]:
        line += f" Its oracle ran in float32 ({t['stages']['oracle']:.0f} s; bfloat16 is the default now, below)."
    if r["created"] < DETECTOR_KEPT_FROM:
        line += (
            " It ran the code before OpenStamp's detector was kept across score calls, so its length stage re-ran "
            "the decoder for the cut texts of both OpenStamp variants (see the re-tied length curve above)."
        )
    if before is not None:
        b = before["timings_s"]
        line += (
            " The kept eval above ran before the hidden-state reuse of own perplexity and of the length curve, own "
            "perplexity's batched head, the generation batch of 100 (was 32) and the distillation's bfloat16 "
            f"autocast, partly beside other work: {b['total'] / 60:.0f} min"
            f"{'' if b.get('complete', True) else ' (incomplete: part of it predates timings)'}."
        )
    return [line + f" TPR@1%FPR in this run: {tprs} (one seed, default strengths: near saturation, as above)."]


def _machines(t: dict) -> str:
    return ", ".join(f"{m['cpu']}, {m['threads']} threads" for m in t.get("machines", [])) or "machine not recorded"


def _tprs(r: dict) -> str:
    return ", ".join(f"{row['method']} {row['tpr_at_1pct_fpr']['mean']:.3f}" for row in r["summary"])


def evaluation_retimed(
    again: dict, first: dict, made: dict | None = None, invocations: list[dict] | None = None
) -> list[str]:
    """The timed default comparison run again from a cold start with later code (``reference_runs.sh
    timed_again``, kept in ``eval_timed/rerun/``; ``made`` its commit): each stage and method beside the first run."""
    a, f = again["timings_s"], first["timings_s"]
    commit = f" with the code of {made['commit']}" if made else ""
    head = (
        f"The same comparison timed again from a cold start (`bash benchmarks/reference_runs.sh timed_again`: the "
        f"same command, a new run folder and an empty eval store; `benchmarks/results/eval_timed/rerun/`){commit}, "
        f"on {again['created'][:10]} ({_machines(a)}; the first on {first['created'][:10]}, {_machines(f)}): "
        f"**{a['total'] / 60:.0f} min** recorded over {a['invocations']} invocation(s), against the first run's "
        f"{f['total'] / 60:.0f} min and the issue's goal of 30 min ({a['total'] / 1800:.1f}x it). Seconds per stage "
        "and per method (a method's keys, completions, scores and the rest of its runs), longest first:"
    )
    rows = ["", "| stage or method | first run | again | again / first |", "|---|---:|---:|---:|"]

    def row(name: str, x: float | None, y: float | None) -> str:
        ratio = f"{y / x:.2f}" if x and y is not None and x > 1 else "-"
        return f"| {name} | {'-' if x is None else f'{x:.0f}'} | {'-' if y is None else f'{y:.0f}'} | {ratio} |"

    for name in sorted(set(a["stages"]) | set(f["stages"]), key=lambda s: -a["stages"].get(s, 0.0)):
        if max(a["stages"].get(name, 0.0), f["stages"].get(name, 0.0)) >= 1:
            rows.append(row(name, f["stages"].get(name), a["stages"].get(name)))
    spent = {"f": method_seconds(f), "a": method_seconds(a)}
    for name in sorted(set(spent["a"]) | set(spent["f"]), key=lambda m: -spent["a"].get(m, 0.0)):
        rows.append(row(f"method: {name}", spent["f"].get(name), spent["a"].get(name)))
    outside = {side: t["total"] - sum(spent[side].values()) for side, t in (("f", f), ("a", a))}
    rows.append(row("outside any method (unwatermarked sets, original model, oracle)", outside["f"], outside["a"]))
    rows.append(row("**total**", f["total"], a["total"]))
    tail = (
        "The two runs differ in both the machine and the code, so a ratio does not say which of them bought it. "
        f"TPR@1%FPR in this run: {_tprs(again)} (one seed, default strengths)."
    )
    if made and made.get("beside"):
        tail += f" Beside it on the machine: {made['beside']}."
    if invocations:
        tail += begun_again(invocations)
    return [head, *rows, "", tail, ""]
