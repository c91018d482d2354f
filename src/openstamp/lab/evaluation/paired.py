"""Paired differences at equal cost: one method's TPR minus another's, with intervals over prompts and keys.

The frontier protocol (``benchmarks/frontier/protocol.py``) reads each method at a target cost from its grid of
strengths and compares two methods on the same test prompts. Every function here takes arrays and returns numbers.

Interpolation between the two grid points that bracket a target cost c, in two ways:

* linear: TPR linear in the own-PPL change between the points (``pareto.interpolate``'s reading);
* budget model: the separation grows with the square root of the cost. ``budget.py``'s normal-shift model reads a
  TPR at FPR alpha as d' = Phi^-1(TPR) + z_a with d'(c) = a sqrt(c), c = log(1 + own PPL change) nats per token;
  between the points d' is linear in sqrt(c), and TPR(c) = Phi(d'(c) - z_a). On a curve the model generated this
  is exact; linear interpolation of the TPR is not (Phi bends it).

The paired bootstrap resamples prompts and keys jointly: each replicate draws K key indices and N prompt indices
with replacement and applies the same draw to both methods' (K, N) hit arrays (the key index pairs one method's
k-th fresh key with the other's; prompts are shared). Percentile intervals; the cost axis is held at its mean
over keys (its spread is not resampled). With few keys the key part of the spread is under-read (by (K - 1) / K in
variance, and coarsely): where keys differ much more than prompts do, 5 keys cover less than the nominal rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import norm

from openstamp.lab.evaluation.budget import cost_nats, separation

INTERPOLATIONS = ("linear", "budget")


def bracket(costs: Sequence[float], target: float) -> tuple[int, int] | None:
    """Indices (i, j) of the grid points nearest ``target`` below-or-at and above-or-at it (costs need not be
    sorted); None where the grid does not reach both sides."""
    below = [i for i, c in enumerate(costs) if c <= target]
    above = [i for i, c in enumerate(costs) if c >= target]
    if not below or not above:
        return None
    return max(below, key=lambda i: costs[i]), min(above, key=lambda i: costs[i])


def interpolate_tpr(
    costs: Sequence[float], tprs: Sequence[float], target: float, how: str = "budget", fpr: float = 0.01, n: int = 0
) -> float | None:
    """A method's TPR at own-PPL change ``target`` from its grid (``costs``: own-PPL changes, ``tprs``: TPRs at
    ``fpr``), linear or under the budget model (module docstring); None outside the grid. ``n`` texts per point
    floor and cap a TPR of 0 or 1 at 1 / (2 n) from its end for the budget model (0: 1e-6)."""
    if how not in INTERPOLATIONS:
        raise ValueError(f"how must be one of {INTERPOLATIONS}, got {how!r}")
    ends = bracket(costs, target)
    if ends is None:
        return None
    i, j = ends
    (c0, y0), (c1, y1) = (costs[i], tprs[i]), (costs[j], tprs[j])
    if c1 == c0:
        return float(y0)
    if how == "linear":
        return float(y0 + (y1 - y0) * (target - c0) / (c1 - c0))
    floor = 0.5 / n if n else 1e-6
    d0, d1 = (separation(min(max(y, floor), 1 - floor), fpr) for y in (y0, y1))
    r0, r1, r = (math.sqrt(max(cost_nats(c), 0.0)) for c in (c0, c1, target))
    d = d0 + (d1 - d0) * (r - r0) / (r1 - r0)
    return float(norm.cdf(d - norm.isf(fpr)))


def paired_bootstrap(
    statistic: Callable[..., float],
    arrays: Sequence[np.ndarray],
    n_boot: int = 2000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float, float]:
    """``statistic`` on ``arrays`` and its percentile interval, resampling keys and prompts jointly.

    Args:
        statistic: maps the arrays (each resampled alike) to a number; a replicate where it gives None or nan is
            dropped.
        arrays: each (K, N, ...): keys by prompts (any trailing dims ride along), the same K and N in all.
        level: the interval's coverage.
    Returns:
        (estimate on the data, low, high).
    """
    shapes = {a.shape[:2] for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"every array must be (K, N, ...) with one K and N, got {sorted(shapes)}")
    (k, n), rng = shapes.pop(), np.random.default_rng(seed)
    reps = []
    for _ in range(n_boot):
        keys, prompts = rng.integers(0, k, k), rng.integers(0, n, n)
        value = statistic(*(a[keys][:, prompts] for a in arrays))
        if value is not None and math.isfinite(value):
            reps.append(value)
    if not reps:
        raise ValueError("the statistic is undefined on every bootstrap replicate")
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(reps, [tail, 100 - tail])
    return float(statistic(*arrays)), float(low), float(high)


def tpr_difference(
    target: float,
    costs_a: Sequence[float],
    hits_a: np.ndarray,
    costs_b: Sequence[float],
    hits_b: np.ndarray,
    how: str = "budget",
    fpr: float = 0.01,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict:
    """Method a's TPR minus method b's at own-PPL change ``target``, with its paired interval.

    Args:
        costs_a: (G_a,) own-PPL change of each of a's grid points (mean over keys).
        hits_a: bool (K, N, G_a): whether a's text from key k and prompt n at grid point g passes the threshold
            taken on the thresholds split's human text at ``fpr``.
        costs_b, hits_b: the same for b, on the same N prompts and K keys.
    Returns:
        {"target", "how", "a", "b", "difference", "low", "high"}; the numbers None where a grid does not bracket
        the target.
    """
    n = hits_a.shape[1]

    def at(costs, hits):
        return interpolate_tpr(costs, hits.mean(axis=(0, 1)).tolist(), target, how, fpr, n * hits.shape[0])

    def diff(ha, hb):
        a, b = at(costs_a, ha), at(costs_b, hb)
        return None if a is None or b is None else a - b

    row = {"target": target, "how": how, "a": at(costs_a, hits_a), "b": at(costs_b, hits_b)}
    if row["a"] is None or row["b"] is None:
        return {**row, "difference": None, "low": None, "high": None}
    est, low, high = paired_bootstrap(diff, [hits_a.astype(float), hits_b.astype(float)], n_boot, seed=seed)
    return {**row, "difference": est, "low": low, "high": high}
