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


def conformal_threshold(null_scores, alpha: float) -> float | None:
    """The calibration threshold whose false-positive rate on a new text like ``null_scores`` is at most ``alpha``.

    Split conformal: with the n reference scores sorted, s_(1) <= ... <= s_(n), and k = ceil((1 - alpha)(n + 1)),
    the threshold is tau = s_(k), and a text is flagged when its score S > tau. When S and the n reference scores are
    exchangeable (the same domain, one key), S is equally likely to take each of the n + 1 ranks, so

        P(S > s_(k)) <= (n + 1 - k) / (n + 1) <= alpha,

    averaged over the draw of the reference set. Equivalently, flag when the conformal p-value
    (1 + #{i : s_i >= S}) / (n + 1) is at most alpha. ``threshold_at_fpr`` (at most a fraction alpha of the reference
    above tau) allows floor(alpha n) scores above tau instead, whose rate is (floor(alpha n) + 1) / (n + 1): at least
    alpha, and about twice alpha where alpha n is a whole number (2/1001 at alpha 0.001 on 1,000 texts). When k > n
    (fewer than 1 / alpha - 1 texts) no threshold can hold alpha, and the answer is None.
    """
    scores = np.sort(np.asarray(null_scores, dtype=np.float64).ravel())
    if scores.size == 0:
        raise ValueError("no reference scores to calibrate on")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), not {alpha:g}")
    k = int(np.ceil(round((1 - alpha) * (scores.size + 1), 9)))  # rounded: (1 - 0.01) * 100 is 99, not 99.000001
    return None if k > scores.size else float(scores[k - 1])


def texts_needed(alpha: float) -> int:
    """The fewest reference texts for which ``conformal_threshold`` has a threshold at ``alpha``."""
    return int(np.ceil(round(1 / alpha - 1, 9)))


def clopper_pearson(hits: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval of a rate ``hits / n`` (Clopper-Pearson): beta quantiles, (low, high)."""
    a = (1 - level) / 2
    low = 0.0 if hits == 0 else float(beta_dist.ppf(a, hits, n - hits + 1))
    high = 1.0 if hits == n else float(beta_dist.ppf(1 - a, hits + 1, n - hits))
    return low, high
