"""Metrics computed from score arrays, apart from any pipeline, and the one registry of their names.

Each metric is a plain function of numpy arrays. ``METRICS`` names every number that results,
reports, attacks and the CLI summary show: its label, the function behind it, whether higher is
better, and its digits. Everything that lists metrics reads it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import norm, rankdata

from openstamp.detect.rates import threshold_at_fpr  # also re-exported: TPR@FPR's threshold


@dataclass(frozen=True)
class Metric:
    """One reported number: ``summary`` puts it in the per-method table; ``attack`` in before/after tables;
    ``cost_axis`` makes it an x axis of the Pareto plot and comparison (a quality cost: higher is worse);
    ``percent`` shows a relative change as a signed percentage (0.6 -> +60.0%)."""

    name: str
    label: str
    function: str
    higher_is_better: bool
    digits: int = 3
    summary: bool = True
    attack: bool = False
    cost_axis: bool = False
    percent: bool = False

    def text(self, value: float) -> str:
        """The value as reports print it: ``digits`` decimals, or a signed percentage."""
        return f"{100 * value:+.{self.digits}f}%" if self.percent else f"{value:.{self.digits}f}"


def _registry(*metrics: Metric) -> dict[str, Metric]:
    return {m.name: m for m in metrics}


METRICS = _registry(
    Metric("auroc", "AUROC", "auroc(watermarked, human)", True, attack=True),
    Metric("tpr_at_1pct_fpr", "TPR@1%FPR", "tpr_at_fpr(watermarked, human, 0.01)", True, attack=True),
    Metric("tpr_at_0.1pct_fpr", "TPR@0.1%FPR", "tpr_at_fpr(watermarked, human, 0.001)", True),
    # needs no threshold, so it holds on text an attack shortened; None for a detector without p-values
    Metric("flagged_at_p_0.01", "at p<=0.01", "mean(p_value(watermarked) <= 0.01)", True, summary=False, attack=True),
    Metric("auroc_vs_unwatermarked", "AUROC vs unwm.", "auroc(watermarked, unwatermarked)", True),
    Metric("own_ppl", "own PPL", "own_perplexity(model, human continuations)", False, 1),
    Metric("own_ppl_change", "own PPL change", "own_ppl / original's - 1", False, 1, cost_axis=True, percent=True),
    Metric("downstream_acc", "downstream acc", "mean lm-eval accuracy over EvalConfig.downstream's tasks", True),
    Metric("downstream_change", "downstream change", "downstream_acc - the original model's, same items", True),
    Metric("ppl_mean", "PPL mean", "mean oracle perplexity of the completions", False, 1, cost_axis=True),
    Metric("ppl_median", "PPL median", "median oracle perplexity of the completions", False, 1),
    Metric("ppl_ratio_median", "PPL ratio", "median of oracle PPL / unwatermarked PPL, same prompt", False),
    Metric("seq_rep_3", "seq-rep-3", "seq_rep_n(completion, 3)", False),
)


def auroc(positives, negatives) -> float:
    """Area under the ROC curve: P(score_pos > score_neg) + 0.5 P(tie) (Mann-Whitney U)."""
    pos, neg = np.asarray(positives, dtype=np.float64), np.asarray(negatives, dtype=np.float64)
    if len(pos) == 0 or len(neg) == 0:
        return float("nan")
    ranks = rankdata(np.concatenate([pos, neg]))  # average ranks handle ties
    u = ranks[: len(pos)].sum() - len(pos) * (len(pos) + 1) / 2
    return float(u / (len(pos) * len(neg)))


def tpr_at_fpr(positives, negatives, fpr: float) -> dict:
    """True-positive rate at a false-positive rate, with the threshold chosen on the negatives.

    With fewer than 1/fpr negatives the threshold is the largest negative score, so the
    realised false-positive rate is 0 and the figure is marked ``resolution_limited``.
    """
    threshold = threshold_at_fpr(negatives, fpr)
    pos = np.asarray(positives, dtype=np.float64)
    return {
        "tpr": float(np.mean(pos > threshold)) if len(pos) else float("nan"),
        "threshold": threshold,
        "realised_fpr": float(np.mean(np.asarray(negatives) > threshold)),
        "resolution_limited": len(negatives) < 1.0 / fpr,
    }


def _redrawn_hits(positives: np.ndarray, negatives: np.ndarray, fpr: float, n_boot: int, rng) -> np.ndarray:
    """Per bootstrap replicate (``n_boot``), how many of the positives, drawn again with replacement, score above the
    threshold that :func:`tpr_at_fpr` chooses on the negatives, drawn again likewise: the texts' error and the
    threshold's together."""
    threshold = threshold_at_fpr(negatives[rng.integers(0, len(negatives), (n_boot, len(negatives)))], fpr)
    draws = positives[rng.integers(0, len(positives), (n_boot, len(positives)))]
    return np.sum(draws > threshold[:, None], axis=1)


def tpr_at_fpr_ci(runs, fpr: float, n_boot: int = 1000, level: float = 0.95, seed: int = 0) -> tuple:
    """Percentile bootstrap interval of the mean TPR at ``fpr`` over ``runs``: a list of (positives, negatives).

    Each replicate draws len(runs) runs with replacement (the key's variability, when there are
    several seeds), then, inside each drawn run, its positives and its negatives with replacement
    (the texts' variability), re-chooses the threshold on the resampled negatives as ``tpr_at_fpr``
    does, and averages the drawn runs' TPRs. With one run it is the bootstrap over texts alone.
    """
    if not runs:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    k = len(runs)
    # tprs[g, b, j]: run g's TPR on its own resample for copy j of replicate b
    tprs = np.empty((k, n_boot, k))
    for g, (positives, negatives) in enumerate(runs):
        pos, neg = np.asarray(positives, dtype=np.float64), np.asarray(negatives, dtype=np.float64)
        if len(pos) == 0 or len(neg) == 0:
            return float("nan"), float("nan")
        tprs[g] = (_redrawn_hits(pos, neg, fpr, n_boot * k, rng) / len(pos)).reshape(n_boot, k)
    picks = rng.integers(0, k, (n_boot, k)) if k > 1 else np.zeros((n_boot, 1), dtype=int)
    means = tprs[picks, np.arange(n_boot)[:, None], np.arange(k)[None, :]].mean(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))


def pooled_tpr_difference_ci(
    ours, other, fpr: float, n_boot: int = 2000, level: float = 0.95, seed: int = 0, paired: bool = False
) -> tuple[float, float, float]:
    """The TPR at ``fpr`` of ``ours`` minus that of ``other``, each pooled over its keys, with a percentile bootstrap
    interval: (gap, low, high). ``ours`` and ``other`` are lists of (positives, negatives), one per key.

    A pooled TPR counts texts: ``sum_k hits_k / sum_k n_k``, where ``hits_k`` are key k's positives above its
    threshold, chosen on its own negatives as :func:`tpr_at_fpr` does. Each replicate redraws, inside every key, its
    positives and its negatives with replacement and re-chooses the threshold, so the interval holds the
    threshold's own error as well as the positives'; an interval for two rates over texts alone (Newcombe's) leaves
    the first out. The keys are not redrawn, and the two methods are drawn independently, unless ``paired``: then
    both score the same texts of each key (the same counts, in the same order), and each replicate redraws the same
    texts for both, so what the two share cancels in the difference.
    """
    if paired and [(len(p), len(n)) for p, n in ours] != [(len(p), len(n)) for p, n in other]:
        raise ValueError("paired runs need the same number of positive and negative texts per key")

    def pooled(runs, rng) -> tuple[float, np.ndarray]:
        hits, draws, total = 0, np.zeros(n_boot), 0
        for positives, negatives in runs:
            pos, neg = np.asarray(positives, dtype=np.float64), np.asarray(negatives, dtype=np.float64)
            if len(pos) == 0 or len(neg) == 0:
                raise ValueError("each key needs positive and negative scores")
            hits += int(np.sum(pos > threshold_at_fpr(neg, fpr)))
            draws += _redrawn_hits(pos, neg, fpr, n_boot, rng)
            total += len(pos)
        if not total:
            raise ValueError("no keys to pool")
        return hits / total, draws / total

    rng = np.random.default_rng(seed)
    # paired: a stream of its own from the same seed, so each replicate redraws the same texts for both
    (ours_rate, ours_draws) = pooled(ours, rng)
    (other_rate, other_draws) = pooled(other, np.random.default_rng(seed) if paired else rng)
    tail, gaps = (1 - level) / 2, ours_draws - other_draws
    return ours_rate - other_rate, float(np.quantile(gaps, tail)), float(np.quantile(gaps, 1 - tail))


def interval(stat: dict | None) -> tuple[float, float] | None:
    """A summary entry's ``ci`` (low, high) where it holds a finite one, else None."""
    ci = (stat or {}).get("ci")
    return (float(ci[0]), float(ci[1])) if ci and all(v is not None and np.isfinite(v) for v in ci) else None


def seq_rep_n(tokens, n: int = 3) -> float:
    """1 - unique n-grams / n-grams of one sequence (Welleck et al.)."""
    grams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams) if grams else float("nan")


def bootstrap_ci(values, statistic=np.mean, n_boot: int = 2000, level: float = 0.95, seed: int = 0) -> tuple:
    """Percentile bootstrap interval of ``statistic`` over ``values``: (low, high)."""
    data = np.asarray(values, dtype=np.float64)
    data = data[np.isfinite(data)]
    if len(data) == 0:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    stats = [statistic(data[rng.integers(0, len(data), len(data))]) for _ in range(n_boot)]
    tail = (1 - level) / 2
    return float(np.quantile(stats, tail)), float(np.quantile(stats, 1 - tail))


def wilson(hits: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of a rate ``p = hits / n``, with ``z`` the normal quantile of ``level``:
    ``(p + z^2 / 2n -+ z sqrt(p (1 - p) / n + z^2 / 4n^2)) / (1 + z^2 / n)``."""
    z = norm.ppf(1 - (1 - level) / 2)
    p = hits / n
    centre, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return float((centre - half) / (1 + z * z / n)), float((centre + half) / (1 + z * z / n))


def rate_difference_ci(hits1: int, n1: int, hits2: int, n2: int, level: float = 0.95) -> tuple[float, float]:
    """Interval of ``p1 - p2`` for two independent rates: Newcombe's hybrid score interval (1998, method 10),
    from the Wilson intervals ``(l1, u1)`` and ``(l2, u2)``:
    ``d - sqrt((p1 - l1)^2 + (u2 - p2)^2)`` to ``d + sqrt((u1 - p1)^2 + (p2 - l2)^2)``."""
    p1, p2 = hits1 / n1, hits2 / n2
    (l1, u1), (l2, u2) = wilson(hits1, n1, level), wilson(hits2, n2, level)
    d = p1 - p2
    return float(d - np.hypot(p1 - l1, u2 - p2)), float(d + np.hypot(u1 - p1, p2 - l2))
