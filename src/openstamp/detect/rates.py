"""Small statistics on score arrays shared by calibration, tuning and evaluation (numpy and scipy)."""

from __future__ import annotations

import numpy as np
from scipy.stats import beta as beta_dist


def threshold_at_fpr(negatives, fpr: float):
    """Smallest threshold tau such that at most a fraction ``fpr`` of negatives score above tau.

    One set of negatives (1-D) gives a float; a stack of sets (..., n), one threshold per set along
    the last axis (the bootstrap's resamples), gives an array.
    """
    neg = np.sort(np.asarray(negatives, dtype=np.float64), axis=-1)
    if neg.shape[-1] == 0:
        raise ValueError("no negative scores to choose a threshold on")
    allowed = int(np.floor(fpr * neg.shape[-1]))  # negatives allowed strictly above tau
    tau = neg[..., neg.shape[-1] - allowed - 1]
    return float(tau) if neg.ndim == 1 else tau


def clopper_pearson(hits: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval of a rate ``hits / n`` (Clopper-Pearson): beta quantiles, (low, high)."""
    a = (1 - level) / 2
    low = 0.0 if hits == 0 else float(beta_dist.ppf(a, hits, n - hits + 1))
    high = 1.0 if hits == n else float(beta_dist.ppf(1 - a, hits + 1, n - hits))
    return low, high
