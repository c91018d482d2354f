"""Small statistics on score arrays shared by calibration and evaluation (numpy only)."""

from __future__ import annotations

import numpy as np


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
