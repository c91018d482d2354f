"""What changed in the eval's own stages when a finished comparison is scored again with newer code.

    cp -r runs/eval-t RUN && cp -r RUN/ppl PPL_BEFORE && cp RUN/results.json RESULTS_BEFORE
    rm RUN/scores/openstamp*.json RUN/scores/lengths/openstamp*.json RUN/results.json
    openstamp eval --model smollm2-135m --n 200 --out RUN --store STORE      # resumes: keys, completions kept
    python benchmarks/eval_retime.py --run RUN --ppl-before PPL_BEFORE --results-before RESULTS_BEFORE

``RUN/timings.json`` holds one entry per invocation; this compares the per-method seconds of OpenStamp's two
variants (score and length stages) in the first entry that recorded them against the last, and the oracle stage
of the last entry, and compares every perplexity file of RUN (the dtype the last invocation asked for) with the
one kept in PPL_BEFORE: per text, the relative difference. With ``--results-before`` (RUN's results.json as it
was before, copied aside), it also lists every length-curve figure and every metric but the oracle's that differs
between the two. Writes benchmarks/results/eval_retime.json.

To time a change of the detector alone on one machine in one session, score the same folder twice, with the code
before and after (the oracle is not run again, so leave out --ppl-before), and compare the last two invocations:

    rm RUN/scores/openstamp*.json RUN/scores/lengths/openstamp*.json RUN/results.json   # then, with the old code:
    openstamp eval --model smollm2-135m --n 200 --out RUN && cp RUN/results.json RESULTS_BEFORE
    rm RUN/scores/openstamp*.json RUN/scores/lengths/openstamp*.json RUN/results.json   # then, with the new code:
    openstamp eval --model smollm2-135m --n 200 --out RUN
    python benchmarks/eval_retime.py --run RUN --results-before RESULTS_BEFORE --invocations -2 -1 \
        --name score_retime --change "what changed"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from common import write_result

from openstamp.evaluation.oracle import load_perplexities

METHODS = ("openstamp", "openstamp-nosem")
STAGES = ("score", "lengths")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument(
        "--ppl-before", type=Path, help="the perplexity files before (left out: the oracle is not compared)"
    )
    parser.add_argument("--results-before", type=Path)
    parser.add_argument(
        "--invocations",
        type=int,
        nargs=2,
        default=(0, -1),
        metavar=("BEFORE", "AFTER"),
        help="which of the invocations that scored OpenStamp to compare (Python indices)",
    )
    parser.add_argument("--name", default="eval_retime", help="the results file: benchmarks/results/NAME.json")
    parser.add_argument("--change", help="what changed between the two invocations, for the summary")
    args = parser.parse_args()
    history = json.loads((args.run / "timings.json").read_text())
    timed = [e for e in history if any(m in e.get("methods", {}) for m in METHODS)]
    if len(timed) < 2:
        raise SystemExit(f"{args.run}/timings.json holds {len(timed)} invocation(s) that scored OpenStamp; need 2")
    first, last = timed[args.invocations[0]], timed[args.invocations[1]]
    seconds = {
        m: {s: {"before": first["methods"][m].get(s), "after": last["methods"][m].get(s)} for s in STAGES}
        for m in METHODS
    }
    changed = _changed(json.loads(args.results_before.read_text()), args.run) if args.results_before else None
    result = {
        "settings": {
            "run": str(args.run),
            "ppl_before": args.ppl_before and str(args.ppl_before),
            "change": args.change,
        },
        "invocations": {"before": first["started"], "after": last["started"]},
        "machines": [first["machine"], last["machine"]],
        "seconds": seconds,
        "changed_besides_the_oracle": changed,
        "oracle": _oracle(args.run, args.ppl_before, last) if args.ppl_before else None,
    }
    write_result(args.name, result)
    print(
        "OpenStamp in the eval, before -> after (s): "
        + "; ".join(
            f"{m}: " + ", ".join(f"{s} {v['before']:.0f} -> {v['after']:.0f}" for s, v in seconds[m].items())
            for m in METHODS
        )
        + (
            ""
            if result["oracle"] is None
            else f". Oracle ({', '.join(result['oracle']['dtypes'])}): {result['oracle']['seconds_after']:.0f} s for "
            f"{result['oracle']['sets']} sets, {result['oracle']['texts']} texts; per-text perplexity differs by at "
            f"most {result['oracle']['max_abs_relative_difference']:.2%}"
        )
        + ("" if changed is None else f"; other figures that changed: {len(changed)}")
    )


def _oracle(run: Path, ppl_before: Path, last: dict) -> dict:
    """Every perplexity file of ``run`` against the one kept in ``ppl_before``: per text, the relative difference."""
    config = json.loads((run / "config.json").read_text())
    agreement, dtypes = {}, set()
    for path in sorted((run / "ppl").glob("*.json")):
        now = load_perplexities(path, config["dtype"])
        then = load_perplexities(ppl_before / path.name, config["dtype"])
        dtypes.add((then["dtype"], now["dtype"]))
        a, b = np.array(then["values"], dtype=np.float64), np.array(now["values"], dtype=np.float64)
        relative = b / a - 1
        agreement[path.stem] = {
            "texts": len(a),
            "median_before": float(np.nanmedian(a)),
            "median_after": float(np.nanmedian(b)),
            "max_abs_relative_difference": float(np.nanmax(np.abs(relative))),
        }
    return {
        "dtypes": sorted({f"{a} -> {b}" for a, b in dtypes}),
        "seconds_after": last["seconds"].get("oracle"),
        "sets": len(agreement),
        "texts": sum(v["texts"] for v in agreement.values()),
        "max_abs_relative_difference": max(v["max_abs_relative_difference"] for v in agreement.values()),
        "per_set": agreement,
    }


def _changed(before: dict, run: Path) -> list[str]:
    """Each run's length-curve figure and metric (but the oracle's perplexity) that differs between the results."""
    after = {r["run"]: r for r in json.loads((run / "results.json").read_text())["runs"]}
    out = []
    for r in before["runs"]:
        other = after[r["run"]]
        for row, new in zip(r.get("length_curve") or [], other.get("length_curve") or [], strict=True):
            out += [f"{r['run']} {row['tokens']} tokens {k}" for k in row if row[k] != new[k]]
        out += [
            f"{r['run']} {k}" for k, v in r["metrics"].items() if not k.startswith("ppl") and v != other["metrics"][k]
        ]
    return out


if __name__ == "__main__":
    main()
