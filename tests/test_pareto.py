import pytest

from openstamp.evaluation.pareto import COST_AXES, compare, interpolate, points, standard_error, verdict
from openstamp.evaluation.report import pareto_table


def _summary(method, pairs):
    return [
        {"method": method, "strength": s, "own_ppl_change": {"mean": c}, "tpr_at_1pct_fpr": {"mean": y}}
        for s, c, y in pairs
    ]


SUMMARY = _summary("openstamp", [(0.5, 0.05, 0.9), (1.0, 0.2, 1.0), (0.25, 0.01, 0.2), (2.0, 0.9, 1.0)]) + _summary(
    "kgw", [(1.0, 0.02, 0.1), (2.0, 0.3, 0.5)]
)


def test_cost_axes_come_from_the_metric_registry():
    assert set(COST_AXES) == {"own_ppl_change", "ppl_mean"}


def test_points_are_sorted_by_cost_and_interpolation_is_linear():
    curve = points(SUMMARY, "kgw", "own_ppl_change")
    assert [p[2] for p in curve] == [1.0, 2.0]
    assert interpolate(curve, 0.16) == pytest.approx(0.1 + 0.4 * 0.5)
    assert interpolate(curve, 0.01) is None and interpolate(curve, 0.31) is None
    assert interpolate([(0.1, 0.7, 1.0)], 0.1) == 0.7


def _verdict(y, y_b, n):  # binomial standard errors over n texts
    return verdict(y, standard_error({"mean": y}, n), y_b, standard_error({"mean": y_b}, n), n)


def test_verdict_uses_binomial_standard_errors_without_an_interval():
    assert _verdict(0.9, 0.5, 200) == "above" and _verdict(0.5, 0.9, 200) == "below"
    assert _verdict(0.52, 0.5, 200) == "on" and _verdict(1.0, 1.0, 200) == "on"
    assert _verdict(0.9, 0.6, 10) == "on"  # the same gap is not resolved with 10 texts


def test_a_bootstrap_interval_sets_the_standard_error_and_can_undo_a_verdict():
    assert standard_error({"mean": 0.5, "ci": [0.4, 0.6]}, 200) == pytest.approx(0.2 / 3.92)
    assert standard_error({"mean": 0.5, "ci": [float("nan"), 0.6]}, 200) == pytest.approx((0.25 / 200) ** 0.5)
    summary = _summary("openstamp", [(0.5, 0.16, 0.6)]) + SUMMARY[4:]  # kgw's curve is at 0.3 there
    assert compare(summary, "openstamp", "kgw", "own_ppl_change", n=200)[0]["verdict"] == "above"  # binomial
    summary[0]["tpr_at_1pct_fpr"]["ci"] = [0.2, 0.9]  # keys that disagree this much resolve nothing
    assert compare(summary, "openstamp", "kgw", "own_ppl_change", n=200)[0]["verdict"] == "on"


def test_compare_gives_a_verdict_inside_the_baseline_range_only():
    rows = {r["strength"]: r for r in compare(SUMMARY, "openstamp", "kgw", "own_ppl_change", n=200)}
    assert rows[0.5]["verdict"] == "above" and rows[0.5]["baseline_tpr"] == pytest.approx(0.1 + 0.4 * 0.03 / 0.28)
    assert rows[0.25]["verdict"] == "cheaper than every baseline point"
    assert rows[2.0]["verdict"] == "costlier than every baseline point" and rows[2.0]["baseline_tpr"] is None


def test_report_lists_each_openstamp_strength_against_each_swept_baseline():
    results = {"summary": SUMMARY, "config": {"n": 100, "seeds": [0, 1]}}
    lines = pareto_table(results)
    rows = [line for line in lines if line.startswith("| own PPL change | openstamp | kgw")]
    assert len(rows) == 1 and "0.5: above (0.900 vs" in rows[0] and "0.25: cheaper than every" in rows[0]
    assert pareto_table({"summary": SUMMARY[:4], "config": {"n": 100, "seeds": [0]}}) == []  # no baseline curve
