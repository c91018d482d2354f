"""What a sweep saves by scoring the negatives of a strength-free detector once per key, in the eval itself.

    cp -r runs/sweep-s0 RUN && cp RUN/results.json RESULTS_BEFORE
    for m in gaussmark kgw unremovable sir; do rm RUN/scores/$m@*.json RUN/scores/lengths/$m@*.json; done
    rm RUN/results.json
    openstamp eval <the sweep's settings> --seeds 0 --out RUN      # resumes: keys, completions, perplexities kept
    python benchmarks/sweep_memo.py --run RUN --results-before RESULTS_BEFORE

GaussMark's, KGW's, Unremovable's and SIR's detectors read their key alone, never the strength
(``WatermarkMethod.scores_ignore_strength``), so every strength of one key scores the human and unwatermarked
texts alike; the eval now scores them for the first strength only (``openstamp.methods.base.score_dicts``).
This compares the score and length stages of those methods in the first invocation of RUN's ``timings.json``
(each strength scored its negatives) with the last (the re-scoring), and every score and figure of their runs in
RESULTS_BEFORE with RUN's results.json: per method, the largest difference of a text's score, and how many
metrics and length-curve figures differ, by how much at most. Writes benchmarks/results/sweep_memo.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from common import write_result

from openstamp.methods import REGISTRY

STAGES = ("score", "lengths")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--results-before", type=Path, required=True)
    args = parser.parse_args()
    history = json.loads((args.run / "timings.json").read_text())
    before = json.loads(args.results_before.read_text())
    after = {r["run"]: r for r in json.loads((args.run / "results.json").read_text())["runs"]}
    methods = [m for m in dict.fromkeys(r["method"] for r in before["runs"]) if REGISTRY[m].scores_ignore_strength]
    first, last = history[0], history[-1]
    seconds = {
        m: {s: {"before": first["methods"][m][s], "after": last["methods"][m][s]} for s in STAGES} for m in methods
    }
    moved = {
        m: {"largest_score_difference": 0.0, "figures_that_differ": 0, "largest_figure_difference": 0.0}
        for m in methods
    }
    for r in (r for r in before["runs"] if r["method"] in methods):
        other, m = after[r["run"]], moved[r["method"]]
        for k, values in r["scores"].items():
            pairs = [(a, b) for a, b in zip(values, other["scores"][k], strict=True) if a is not None or b is not None]
            if any(a is None or b is None for a, b in pairs):
                raise SystemExit(f"{r['run']}: a {k} text was scored in one run only")
            m["largest_score_difference"] = max([m["largest_score_difference"]] + [abs(a - b) for a, b in pairs])
        figures = [(v, other["metrics"][k]) for k, v in r["metrics"].items()]
        for row, new in zip(r.get("length_curve") or [], other.get("length_curve") or [], strict=True):
            figures += [(row[k], new[k]) for k in row]
        changed = [abs(a - b) for a, b in figures if a != b and isinstance(a, float) and isinstance(b, float)]
        m["figures_that_differ"] += sum(a != b for a, b in figures)
        m["largest_figure_difference"] = max([m["largest_figure_difference"], *changed])
    total = {when: sum(v[s][when] for v in seconds.values() for s in STAGES) for when in ("before", "after")}
    result = {
        "settings": {"run": str(args.run), "results_before": str(args.results_before)},
        "invocations": {"before": first["started"], "after": last["started"]},
        "machines": [first["machine"], last["machine"]],
        "runs": sum(r["method"] in methods for r in before["runs"]),
        "seconds": seconds,
        "total": total,
        "moved": moved,
    }
    write_result("sweep_memo", result)
    print(
        f"score and length stages of {', '.join(methods)} ({result['runs']} runs), each strength scoring its "
        f"negatives -> once per key: "
        + "; ".join(
            f"{m} " + ", ".join(f"{s} {v['before']:.0f} -> {v['after']:.0f} s" for s, v in seconds[m].items())
            for m in methods
        )
        + f"; together {total['before']:.0f} -> {total['after']:.0f} s. Against the first run: "
        + "; ".join(
            f"{m} largest score difference {v['largest_score_difference']:.1e}, {v['figures_that_differ']} figures "
            f"differ (by at most {v['largest_figure_difference']:.1e})"
            for m, v in moved.items()
        )
    )


if __name__ == "__main__":
    main()
