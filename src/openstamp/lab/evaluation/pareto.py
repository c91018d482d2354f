"""Where does a method stand against another's trade-off curve? Point by point, on a cost axis.

A sweep gives each method points (cost c, TPR y) over its strengths, where the cost is a
quality metric that rises with damage (``own_ppl_change``, the oracle's ``ppl_mean``). The
baseline's curve is the piecewise-linear interpolation of its points sorted by cost. For a point
(c, y) of the compared method inside the baseline's cost range [c_min, c_max]:

    y_b(c)  = linear interpolation of the baseline's TPR at cost c
    se(y)   = (high - low) / (2 z) of the point's 95% bootstrap interval over seeds and texts
              (results' ``ci``: it holds the keys' spread), else sqrt(y (1 - y) / n)   (binomial)
    se_b(c) = the baseline's se, interpolated as y_b is
    se      = sqrt(se(y)^2 + se_b(c)^2)
    verdict = "above" if y - y_b > z se, "below" if y_b - y > z se, else "on"   (z = 1.96)

with se floored at 1 / n so that two saturated points (y = y_b = 1) read "on". A point outside
the range is "cheaper than every baseline point" or "costlier than every baseline point": no
verdict is drawn from extrapolation.

At equal cost (what a model owner reads first): each method's TPR at a fixed cost c, ``y(c)`` as
above, with the ends of its 95% interval interpolated alike (the curves through each point's low and
high end); and the cost at which its curve first reaches a target TPR t, the first crossing

    c(t) = c_i + (t - y_i) (c_{i+1} - c_i) / (y_{i+1} - y_i)   for the first i with y_i < t <= y_{i+1}

(c_0 where the cheapest point already reaches t, which then bounds the cost from above; none where no
point reaches it), with a range from the same crossing of the high-end and low-end curves.
"""

from __future__ import annotations

import math

from openstamp.lab.evaluation.metrics import METRICS, interval

COST_AXES = tuple(m.name for m in METRICS.values() if m.cost_axis)
Point = tuple[float, float, float]  # (cost, TPR, strength)


def points(
    summary: list[dict], method: str, cost: str, tpr: str = "tpr_at_1pct_fpr", end: int | None = None
) -> list[Point]:
    """(cost, TPR, strength) of each strength of ``method`` that has both, sorted by cost; ``end`` 0 or 1: the low or
    high end of each TPR's 95% interval instead of its mean (a strength without an interval is left out)."""
    out = []
    for s in summary:
        if s["method"] != method:
            continue
        stat = s.get(tpr) or {}
        ci = interval(stat)
        c, y = (s.get(cost) or {}).get("mean"), stat.get("mean") if end is None else (ci and ci[end])
        if c is not None and y is not None and math.isfinite(c):
            out.append((float(c), float(y), float(s["strength"])))
    return sorted(out)


def interpolate(curve: list[Point], cost: float) -> float | None:
    """The curve's TPR at ``cost`` (linear between its neighbours); None outside its range."""
    if not curve or cost < curve[0][0] or cost > curve[-1][0]:
        return None
    for (c0, y0, _), (c1, y1, _) in zip(curve, curve[1:], strict=False):
        if c0 <= cost <= c1:
            return y0 if c1 == c0 else y0 + (y1 - y0) * (cost - c0) / (c1 - c0)
    return curve[0][1]  # a one-point curve, at its cost


def standard_error(stat: dict, n: int, z: float = 1.96) -> float:
    """A TPR's standard error: from its bootstrap interval where results hold one, else binomial over n texts."""
    if ci := interval(stat):
        return (ci[1] - ci[0]) / (2 * z)
    y = stat["mean"]
    return math.sqrt(y * (1 - y) / n)


def verdict(y: float, se: float, y_b: float, se_b: float, n: int, z: float = 1.96) -> str:
    """above / on / below: the gap against z times the two standard errors combined (floored at 1/n)."""
    se = max(math.sqrt(se**2 + se_b**2), 1.0 / n)
    if y - y_b > z * se:
        return "above"
    if y_b - y > z * se:
        return "below"
    return "on"


def compare(summary: list[dict], method: str, baseline: str, cost: str, n: int, tpr: str = "tpr_at_1pct_fpr") -> list:
    """One row per strength of ``method``: its cost and TPR, the baseline's TPR there, and the verdict."""
    curve = points(summary, baseline, cost, tpr)
    at = {(s["method"], float(s["strength"])): s[tpr] for s in summary if s["method"] in (method, baseline)}
    se_curve = [(c, standard_error(at[baseline, strength], n), strength) for c, _, strength in curve]
    rows = []
    for c, y, strength in points(summary, method, cost, tpr):
        y_b = interpolate(curve, c)
        if y_b is not None:
            word = verdict(y, standard_error(at[method, strength], n), y_b, interpolate(se_curve, c), n)
        elif curve:
            word = "cheaper than every baseline point" if c < curve[0][0] else "costlier than every baseline point"
        else:
            word = "no baseline points"
        rows.append({"strength": strength, "cost": c, "tpr": y, "baseline_tpr": y_b, "verdict": word})
    return rows


def crossing(curve: list[Point], target: float) -> float | None:
    """The least cost at which ``curve`` reaches TPR ``target``: its first crossing, linear between neighbours (the
    cheapest point's cost where that point already reaches it); None where no point does."""
    for i, (c, y, _) in enumerate(curve):
        if y >= target:
            if i == 0:
                return c
            c0, y0, _ = curve[i - 1]
            return c0 + (target - y0) * (c - c0) / (y - y0)
    return None


def at_equal_cost(summary: list[dict], method: str, cost: str, levels, target: float, tpr: str = "tpr_at_1pct_fpr"):
    """``method``'s TPR at each cost of ``levels`` (mean, low, high; None outside its range), the cost at which it
    reaches ``target`` (mean, from the high end, from the low end; each None where not reached) and its curve."""
    curves = [points(summary, method, cost, tpr, end) for end in (None, 0, 1)]
    tprs = [tuple(interpolate(curve, level) for curve in curves) for level in levels]
    reach = (crossing(curves[0], target), crossing(curves[2], target), crossing(curves[1], target))
    return {"tpr": tprs, "cost": reach, "curve": curves[0]}
