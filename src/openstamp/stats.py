"""Small statistics on score arrays shared by calibration and evaluation (numpy only)."""

from __future__ import annotations

import numpy as np


def threshold_at_fpr(negatives, fpr: float) -> float:
    """Smallest threshold tau such that at most a fraction ``fpr`` of negatives score above tau."""
    neg = np.sort(np.asarray(negatives, dtype=np.float64))
    if len(neg) == 0:
        raise ValueError("no negative scores to choose a threshold on")
    allowed = int(np.floor(fpr * len(neg)))  # negatives allowed strictly above tau
    return float(neg[len(neg) - allowed - 1])
