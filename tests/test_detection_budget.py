"""benchmarks/detection_budget.py on a small kept sweep, and its section in the summary."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from openstamp.evaluation.budget import ceiling_separation, cost_nats, separation


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "benchmarks"))
    import detection_budget
    import summary_budget

    return detection_budget, summary_budget


def run(method: str, strength: float, seed: int, tpr: float, change: float, rng) -> dict:
    """One sweep run as results.json keeps it: metrics, a length curve (16 and 64 tokens) and per-text scores."""
    curve = [{"tokens": 16, "tpr_at_1pct_fpr": tpr / 2}, {"tokens": 64, "tpr_at_1pct_fpr": tpr}]
    scores = {"human": rng.normal(-change, 0.05, 50).tolist(), "watermarked": rng.normal(change, 0.05, 50).tolist()}
    return {
        "method": method,
        "strength": strength,
        "seed": seed,
        "run": f"{method}@{strength:g}/s{seed}",
        "metrics": {"own_ppl_change": change, "tpr_at_1pct_fpr": tpr},
        "length_curve": curve,
        "scores": scores,
    }


def kept_sweep(folder: Path) -> None:
    rng = np.random.default_rng(0)
    runs = [
        run(m, s, seed, tpr, change, rng)
        for m, points in (("kgw-llr", ((1.0, 0.6, 0.08), (2.0, 1.0, 0.3))), ("kgw", ((1.0, 0.5, 0.08),)))
        for s, tpr, change in points
        for seed in (0, 1)
    ]
    folder.mkdir(parents=True)
    results = {"created": "2026-11-29T00:00:00+00:00", "config": {"n": 50, "seeds": [0, 1]}, "runs": runs}
    (folder / "results.json").write_text(json.dumps(results))


def test_points_pool_the_seeds_and_split_llr_scores(bench, tmp_path):
    detection_budget, _ = bench
    kept_sweep(tmp_path / "sweep")
    pts = {(p["method"], p["strength"]): p for p in detection_budget.points(tmp_path / "sweep")}
    assert set(pts) == {("kgw-llr", 1.0), ("kgw-llr", 2.0), ("kgw", 1.0)}
    one = pts[("kgw-llr", 1.0)]
    assert one["seeds"] == 2 and [row["tokens"] for row in one["lengths"]] == [16, 64]
    full = one["lengths"][-1]
    assert full["efficiency"] == pytest.approx(separation(0.6, 0.01, 100) / ceiling_separation(cost_nats(0.08), 64))
    assert not full["saturated"] and pts[("kgw-llr", 2.0)]["lengths"][-1]["saturated"]
    assert one["llr_budget"]["seen"] > 0 and "llr_budget" not in pts[("kgw", 1.0)]  # kgw's score is a z-score
    methods = detection_budget.method_efficiency(list(pts.values()))
    assert methods["kgw-llr"]["points"] == 1  # the saturated point is left out
    assert methods["kgw"]["own_ppl_change_for_target"] > methods["kgw-llr"]["own_ppl_change_for_target"]
    assert methods["kgw"]["tokens_for_target"] > methods["kgw-llr"]["tokens_for_target"]


def test_section_ranks_methods_and_states_the_target(bench, tmp_path):
    detection_budget, summary_budget = bench
    kept_sweep(tmp_path / "sweep")
    pts = detection_budget.points(tmp_path / "sweep")
    result = {
        "fpr": 0.01,
        "target": {
            "tpr": 0.95,
            "tokens": 64,
            "own_ppl_change": 0.1,
            "ceiling_tpr": 0.878,
            "ceiling_own_ppl_change": 0.131,
            "ceiling_tokens": 83.0,
        },
        "methods": detection_budget.method_efficiency(pts),
        "points": pts,
    }
    rows = summary_budget.detection_budget(result, whole=True)
    text = "\n".join(rows)
    assert "the ceiling is TPR 0.878" in text and "+13.1% at the ceiling" in text and "needs 83 tokens" in text
    table = [r for r in rows if r.startswith("| kgw")]
    assert [r.split(" | ")[0] for r in table[:2]] == ["| kgw-llr", "| kgw"]  # ranked by efficiency
    assert sum(r.startswith("| kgw-llr | ") for r in rows) == 1 + 2  # the method row and one per strength
    assert not math.isnan(float(table[0].split(" | ")[1]))
    assert len(summary_budget.detection_budget(result, whole=False)) < len(rows)


def test_section_reads_the_full_llr_beside_the_head(bench):
    _, summary_budget = bench
    part = {"seen": 0.7, "signal": 0.8, "spread": 1.1}
    runs = [{"head_llr": {**part, "tpr": 0.6}, "full_llr": {**part, "seen": 0.95, "tpr": 0.62}} for _ in range(2)]
    pooled = [
        {"method": "openstamp", "strength": s, "keys": 2, "own_ppl_change": 0.1, "head_llr": 0.6, "full_llr": 0.62}
        | {"gap": gap, "gap_ci": ci}
        for s, gap, ci in ((0.25, 0.1, [0.02, 0.18]), (0.5, -0.1, [-0.2, -0.01]), (1.0, 0.0, [-0.05, 0.05]))
    ]
    full = {"evals": [{"eval": "runs/sweep-s0", "created": "x"}], "runs": runs, "pooled": pooled}
    text = "".join(summary_budget._full_llr(full))
    assert "2 OpenStamp runs" in text and "sees 0.95 of the cost (the head's: 0.70)" in text
    assert "above 0 at openstamp@0.25 +0.100 [+0.020, +0.180], below 0 at openstamp@0.5 -0.100" in text
    assert "unresolved at the other 1 of 3" in text
    assert len(summary_budget._full_llr_table(full)) == 2 + 3 + 1
    assert summary_budget._full_llr(None) == [] and summary_budget._full_llr_table(None) == []
    none = {**full, "pooled": [p | {"gap_ci": [-0.2, 0.3]} for p in pooled]}
    assert "resolved at none of the 3 method and strength points (largest: openstamp@0.25 +0.100" in "".join(
        summary_budget._full_llr(none)
    )
