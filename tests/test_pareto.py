import pytest

from openstamp.lab.evaluation.pareto import (
    COST_AXES,
    at_equal_cost,
    compare,
    crossing,
    interpolate,
    points,
    standard_error,
    verdict,
)
from openstamp.lab.evaluation.report import equal_cost_table, pareto_table


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


def test_crossing_is_the_first_cost_at_which_the_curve_reaches_the_target():
    curve = points(SUMMARY, "kgw", "own_ppl_change")  # (0.02, 0.1), (0.3, 0.5)
    assert crossing(curve, 0.3) == pytest.approx(0.02 + 0.2 * 0.28 / 0.4)
    assert crossing(curve, 0.05) == 0.02  # the cheapest point already reaches it: its cost bounds the answer
    assert crossing(curve, 0.6) is None
    dip = [(0.1, 0.96, 1.0), (0.2, 0.5, 2.0), (0.3, 0.99, 3.0)]  # not monotone: the first crossing counts
    assert crossing(dip, 0.95) == 0.1 and crossing(dip[1:], 0.95) == pytest.approx(0.2 + 0.1 * 0.45 / 0.49)


def test_equal_cost_reads_the_mean_and_each_interval_end_off_its_own_curve():
    summary = _summary("kgw", [(1.0, 0.02, 0.1), (2.0, 0.3, 0.5)])
    summary[0]["tpr_at_1pct_fpr"]["ci"], summary[1]["tpr_at_1pct_fpr"]["ci"] = [0.0, 0.3], [0.4, 0.7]
    read = at_equal_cost(summary, "kgw", "own_ppl_change", levels=(0.16, 0.5), target=0.3)
    assert read["tpr"][0] == pytest.approx((0.3, 0.2, 0.5))  # the mean's, the low end's, the high end's curve
    assert read["tpr"][1] == (None, None, None)  # beyond the costliest strength
    mean, early, late = read["cost"]
    assert mean == pytest.approx(0.16) and early == 0.02 and late == pytest.approx(0.02 + 0.3 * 0.28 / 0.4)


def test_the_equal_cost_table_puts_the_cheapest_trade_off_first_and_says_where_a_target_is_not_reached():
    results = {"summary": SUMMARY, "config": {"n": 100, "seeds": [0], "new_tokens": 64}}
    rows = [line for line in equal_cost_table(results) if line.startswith("| ") and "---" not in line][1:]
    assert [row.split(" | ")[0] for row in rows] == ["| openstamp", "| kgw"]  # 0.95 at +5.0%...+20%; kgw never
    assert "above +30.0% (0.500 there, its costliest strength)" in rows[1]
    assert rows[0].split(" | ")[1] == "0.900"  # TPR at +5% own PPL: openstamp's strength 0.5 sits there
    assert equal_cost_table({"summary": SUMMARY[4:5], "config": results["config"]}) == []  # one point: no curve
    # in words, from the same curves: openstamp reaches 0.95 at 0.05 + 0.15 * 0.05 / 0.1; at +10% it reads
    # 0.9 + 0.1 * 0.05 / 0.15 and kgw 0.1 + 0.4 * 0.08 / 0.28
    assert equal_cost_table(results)[-1] == (
        "In short: ranked by the own PPL change at which TPR@1%FPR reaches 0.95, among the methods whose strengths "
        "reach it (1): openstamp 1st (+12.5%). At +10.0%, the best baseline reads 0.214 (kgw) and the best OpenStamp "
        "method 0.933 (openstamp)."
    )
    swapped = [{**s, "method": {"kgw": "openstamp", "openstamp": "kgw"}[s["method"]]} for s in SUMMARY]
    line = equal_cost_table({**results, "summary": swapped})[-1]
    assert "(1): kgw 1st (+12.5%). Not reached within its strengths: openstamp (0.500 at +30.0%, its costliest" in line
    only_ours = {**results, "summary": SUMMARY[:4]}
    assert not any(line.startswith("In short") for line in equal_cost_table(only_ours))  # nothing to rank against
