"""The frontier in one figure: every method's TPR@1%FPR against its own-perplexity change, the default marked.

    python benchmarks/frontier/frontier_plot.py [--out benchmarks/results/frontier.png]

Each method's curve is the Pareto sweep's (benchmarks/results/sweep/results.json: 3 seeds, 200 prompts, 64 new
tokens), with every kept variant beside it (benchmarks/results/shrinkage/*/), as render.py's equal-cost table reads
them. Bars: the 95% interval of each TPR. The curve of the key that ``openstamp embed`` builds by default is drawn
thick, with a star at the default delta (read between the two strengths around it), and the +5/+10/+20% costs of
the table are dotted lines.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import COST, RESULTS, TPR, default_method, sweep  # noqa: E402

from openstamp.config import load_profile  # noqa: E402
from openstamp.detect.plots import new_figure, save_figure  # noqa: E402
from openstamp.lab.evaluation.metrics import interval  # noqa: E402
from openstamp.lab.evaluation.pareto import points  # noqa: E402

COSTS = (0.05, 0.10, 0.20)


def at_strength(curve: list[tuple[float, float, float]], strength: float) -> tuple[float, float] | None:
    """(cost, TPR) at ``strength``, linear between the two measured strengths around it; None outside them."""
    by = sorted(curve, key=lambda p: p[2])
    for (c0, y0, s0), (c1, y1, s1) in zip(by, by[1:], strict=False):
        if s0 <= strength <= s1:
            w = (strength - s0) / (s1 - s0)
            return c0 + w * (c1 - c0), y0 + w * (y1 - y0)
    return None


def draw(results: dict, out: Path) -> Path:
    summary = results["summary"]
    methods = list(dict.fromkeys(s["method"] for s in summary))
    marked, delta = default_method(methods), load_profile("default").green.delta
    fig, ax = new_figure(7.5, 5.2)
    for method in methods:
        curve = points(summary, method, COST)
        if not curve:
            continue
        rows = {s["strength"]: s for s in summary if s["method"] == method}
        x = [100 * c for c, _, _ in curve]
        y = [t for _, t, _ in curve]
        ends = [interval(rows[s][TPR]) or (t, t) for _, t, s in curve]
        err = [[t - e[0] for t, e in zip(y, ends, strict=True)], [e[1] - t for t, e in zip(y, ends, strict=True)]]
        thick = method == marked
        label = f"{method} (the default)" if thick else method
        ax.errorbar(x, y, yerr=err, fmt="o-", lw=2.6 if thick else 1.1, ms=5 if thick else 3, capsize=2, label=label,
                    zorder=3 if thick else 2)  # fmt: skip
        if thick and (at := at_strength(curve, delta)):
            ax.plot(100 * at[0], at[1], "*", ms=16, color="black", zorder=4,
                    label=f"default delta {delta:g} (between its neighbours)")  # fmt: skip
    for c in COSTS:
        ax.axvline(100 * c, color="grey", ls=":", lw=1)
    tokens = results["config"].get("new_tokens")
    ax.set(xlabel="own perplexity change on human text (%)", ylabel=f"TPR at 1% FPR ({tokens} new tokens)")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title("detection against cost, every method (3 seeds x 200 prompts; bars: 95% interval)", fontsize=9)
    return save_figure(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, default=RESULTS / "frontier.png")
    args = parser.parse_args()
    print(f"wrote {draw(sweep(args.results), args.out)}")


if __name__ == "__main__":
    main()
