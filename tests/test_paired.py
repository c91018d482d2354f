"""Paired differences at equal cost: budget-model interpolation and the joint bootstrap over prompts and keys."""

import math

import numpy as np
import pytest
from scipy.stats import norm

from openstamp.lab.evaluation.paired import bracket, interpolate_tpr, paired_bootstrap, tpr_difference

Z = norm.isf(0.01)


def model_tpr(change: float, a: float = 9.0) -> float:
    """TPR at 1% FPR of the normal-shift budget model: d'(c) = a sqrt(c), c = log(1 + change)."""
    return float(norm.cdf(a * math.sqrt(math.log1p(change)) - Z))


def test_budget_interpolation_recovers_the_model_where_linear_does_not():
    costs = [0.02, 0.04, 0.08, 0.16, 0.25]
    tprs = [model_tpr(c) for c in costs]
    for target in (0.05, 0.10, 0.20):
        truth = model_tpr(target)
        assert interpolate_tpr(costs, tprs, target, "budget") == pytest.approx(truth, abs=1e-9)
        assert abs(interpolate_tpr(costs, tprs, target, "linear") - truth) > 5e-3
    assert interpolate_tpr(costs, tprs, 0.30) is None and interpolate_tpr(costs, tprs, 0.01, "linear") is None
    assert interpolate_tpr(costs, tprs, 0.04) == pytest.approx(tprs[1])  # at a grid point, both read it
    with pytest.raises(ValueError):
        interpolate_tpr(costs, tprs, 0.1, "spline")


def test_bracket_takes_the_nearest_points_on_each_side():
    assert bracket([0.1, 0.02, 0.3, 0.07], 0.08) == (3, 0)
    assert bracket([0.1, 0.2], 0.05) is None


def crossed(rng, k, n, shift, prompt_sd=1.0):
    """Two methods' per-(key, prompt) values: shared prompt effects, own key effects, noise; means differ by
    ``shift``. (With key effects three times larger, 8 keys cover at 0.87: few keys undercover.)"""
    prompt = rng.normal(0, prompt_sd, (1, n))
    a = prompt + rng.normal(0, 0.1, (k, 1)) + rng.normal(0, 1.0, (k, n)) + shift
    b = prompt + rng.normal(0, 0.1, (k, 1)) + rng.normal(0, 1.0, (k, n))
    return a, b


def test_paired_bootstrap_covers_a_known_difference_at_about_the_nominal_rate():
    rng, shift, covered, trials = np.random.default_rng(0), 0.25, 0, 150
    for t in range(trials):
        a, b = crossed(rng, 8, 120, shift)
        _, low, high = paired_bootstrap(lambda x, y: float((x - y).mean()), [a, b], n_boot=400, seed=t)
        covered += low <= shift <= high
    assert 0.88 <= covered / trials <= 0.995  # nominal 0.95; binomial sd over 150 trials is 0.018


def test_pairing_narrows_the_interval_against_shared_prompt_effects():
    rng = np.random.default_rng(1)
    a, b = crossed(rng, 6, 200, 0.2, prompt_sd=3.0)
    mean_diff = lambda x, y: float((x - y).mean())  # noqa: E731
    est, low, high = paired_bootstrap(mean_diff, [a, b], n_boot=500)
    _, lo_u, hi_u = paired_bootstrap(mean_diff, [a, b[:, rng.permutation(200)]], n_boot=500)  # pairs broken
    assert low < est < high and high - low < 0.8 * (hi_u - lo_u)  # the prompts' spread cancels in the difference
    with pytest.raises(ValueError, match="one K and N"):
        paired_bootstrap(lambda x, y: 0.0, [a, b[:, :10]])


def test_tpr_difference_reads_both_grids_at_the_target():
    rng = np.random.default_rng(2)
    costs = [0.03, 0.06, 0.12, 0.24]
    hits_a = rng.random((5, 400, 4)) < np.array([model_tpr(c, 10.0) for c in costs])
    hits_b = rng.random((5, 400, 4)) < np.array([model_tpr(c, 8.0) for c in costs])
    row = tpr_difference(0.10, costs, hits_a, costs, hits_b, n_boot=300)
    assert row["low"] < row["difference"] < row["high"]
    assert row["low"] > 0  # a separates more at every cost
    assert row["difference"] == pytest.approx(model_tpr(0.10, 10.0) - model_tpr(0.10, 8.0), abs=0.06)
    assert tpr_difference(0.5, costs, hits_a, costs, hits_b)["difference"] is None
