"""benchmarks/frontier/detection_budget.py on a small kept sweep, and its table in benchmarks/render.py."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from openstamp.lab.evaluation.budget import ceiling_separation, cost_nats, separation


@pytest.fixture
def bench(benchmark):
    return benchmark("frontier/detection_budget"), benchmark("render")


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


def test_table_ranks_methods_below_the_ceiling(bench, tmp_path):
    detection_budget, render = bench
    kept_sweep(tmp_path / "sweep")
    pts = detection_budget.points(tmp_path / "sweep")
    target = {"tpr": 0.95, "tokens": 64, "own_ppl_change": 0.1}
    ceiling = {"ceiling_tpr": 0.878, "ceiling_own_ppl_change": 0.131, "ceiling_tokens": 83.0}
    result = {"fpr": 0.01, "target": target | ceiling, "methods": detection_budget.method_efficiency(pts)}
    (tmp_path / "detection_budget.json").write_text(json.dumps(result | {"points": pts}))
    rows = render.budget(tmp_path)
    assert rows[2].startswith("| second-order ceiling | 1.00 | +13.1% | 83 |")
    assert [r.split(" | ")[0] for r in rows[3:]] == ["| kgw-llr", "| kgw"]  # ranked by efficiency
    assert not math.isnan(float(rows[3].split(" | ")[1]))
    llr = render.llr_split(tmp_path)  # the mean-LLR score's factors: kgw-llr's one unsaturated strength
    assert len(llr) == 2 + 2 and all(r.startswith("| kgw-llr | ") for r in llr[2:])
