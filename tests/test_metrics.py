import numpy as np
import pytest
from sklearn.metrics import roc_auc_score, roc_curve

from openstamp.lab.evaluation.metrics import (
    auroc,
    bootstrap_ci,
    pooled_tpr_difference_ci,
    rate_difference_ci,
    seq_rep_n,
    threshold_at_fpr,
    tpr_at_fpr,
    tpr_at_fpr_ci,
    wilson,
)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_auroc_matches_scikit_learn_including_ties(seed):
    rng = np.random.default_rng(seed)
    pos = np.round(rng.normal(1, 1, 80), 1)  # rounding creates ties
    neg = np.round(rng.normal(0, 1, 120), 1)
    expected = roc_auc_score([1] * 80 + [0] * 120, np.concatenate([pos, neg]))
    assert abs(auroc(pos, neg) - expected) < 1e-12


@pytest.mark.parametrize("fpr", [0.01, 0.05, 0.1])
def test_tpr_at_fpr_agrees_with_the_roc_curve(fpr):
    rng = np.random.default_rng(3)
    pos, neg = rng.normal(1.5, 1, 500), rng.normal(0, 1, 1000)
    result = tpr_at_fpr(pos, neg, fpr)
    fprs, tprs, _ = roc_curve([1] * 500 + [0] * 1000, np.concatenate([pos, neg]))
    best = tprs[fprs <= fpr].max()  # the best operating point with FPR <= target on the ROC curve
    assert result["realised_fpr"] <= fpr and not result["resolution_limited"]
    assert abs(result["tpr"] - best) <= 1 / 500 + 1e-12


def test_too_few_negatives_are_marked_resolution_limited():
    result = tpr_at_fpr([3.0, 4.0], [0.0, 1.0, 2.0], 0.01)
    assert result["resolution_limited"] and result["threshold"] == 2.0 and result["tpr"] == 1.0


def test_threshold_lets_at_most_fpr_negatives_through():
    neg = np.arange(100.0)
    assert threshold_at_fpr(neg, 0.05) == 94.0  # five negatives (95..99) above
    stacked = threshold_at_fpr(np.stack([neg, neg[::-1] + 10]), 0.05)  # one threshold per row, rows unsorted
    assert stacked.tolist() == [94.0, 104.0]
    with pytest.raises(ValueError):
        threshold_at_fpr([], 0.1)


def test_seq_rep_and_bootstrap():
    assert seq_rep_n([1, 2, 3, 1, 2, 3, 1, 2, 3]) == 1 - 3 / 7
    assert seq_rep_n([1, 2, 3, 4]) == 0.0
    low, high = bootstrap_ci(np.random.default_rng(0).normal(5, 1, 400))
    assert low < 5 < high and high - low < 0.5


def _tpr_ci_by_loop(runs, fpr, n_boot, seed):
    """The reference: draw runs, then texts, one replicate at a time through tpr_at_fpr."""
    rng = np.random.default_rng(seed)
    means = []
    for _ in range(n_boot):
        tprs = []
        for g in rng.integers(0, len(runs), len(runs)):
            pos, neg = (np.asarray(a) for a in runs[g])
            draw_pos, draw_neg = pos[rng.integers(0, len(pos), len(pos))], neg[rng.integers(0, len(neg), len(neg))]
            tprs.append(tpr_at_fpr(draw_pos, draw_neg, fpr)["tpr"])
        means.append(np.mean(tprs))
    return np.quantile(means, 0.025), np.quantile(means, 0.975)


@pytest.mark.parametrize("shifts", [(1.5,), (0.8, 1.5, 2.2)])
def test_tpr_bootstrap_interval_agrees_with_a_loop_over_replicates(shifts):
    rng = np.random.default_rng(4)
    runs = [(rng.normal(s, 1, 200), rng.normal(0, 1, 200)) for s in shifts]
    low, high = tpr_at_fpr_ci(runs, 0.01, n_boot=2000, seed=1)
    ref_low, ref_high = _tpr_ci_by_loop(runs, 0.01, n_boot=2000, seed=2)
    point = np.mean([tpr_at_fpr(pos, neg, 0.01)["tpr"] for pos, neg in runs])
    assert low < point < high
    assert abs(low - ref_low) < 0.03 and abs(high - ref_high) < 0.03


def test_tpr_bootstrap_interval_widens_with_the_keys_spread_and_is_exact_when_separated():
    rng = np.random.default_rng(5)
    same = [(rng.normal(1.5, 1, 200), rng.normal(0, 1, 200)) for _ in range(3)]
    spread = [(rng.normal(s, 1, 200), rng.normal(0, 1, 200)) for s in (0.8, 1.5, 2.2)]
    width = lambda runs: np.subtract(*tpr_at_fpr_ci(runs, 0.01)[::-1])  # noqa: E731
    assert width(spread) > 2 * width(same)
    assert tpr_at_fpr_ci([(np.full(50, 9.0), rng.normal(0, 1, 200))], 0.01) == (1.0, 1.0)
    assert all(np.isnan(tpr_at_fpr_ci([], 0.01)))


def _pooled_gap_by_loop(ours, other, fpr, n_boot, seed):
    """pooled_tpr_difference_ci's interval, one replicate at a time with tpr_at_fpr (slow, float64)."""
    rng = np.random.default_rng(seed)

    def draw(runs):
        hits = sum(
            tpr_at_fpr(pos[rng.integers(0, len(pos), len(pos))], neg[rng.integers(0, len(neg), len(neg))], fpr)["tpr"]
            * len(pos)
            for pos, neg in runs
        )
        return hits / sum(len(pos) for pos, _ in runs)

    gaps = [draw(ours) - draw(other) for _ in range(n_boot)]
    return np.quantile(gaps, 0.025), np.quantile(gaps, 0.975)


def test_pooled_tpr_difference_agrees_with_a_loop_and_pools_texts_over_keys():
    rng = np.random.default_rng(6)
    ours = [(rng.normal(s, 1, 64), rng.normal(0, 1, 200)) for s in (2.0, 2.6)]
    other = [(rng.normal(s, 1, 64), rng.normal(0, 1, 200)) for s in (2.8, 3.0)]
    gap, low, high = pooled_tpr_difference_ci(ours, other, 0.01, n_boot=2000, seed=1)
    hits = lambda runs: sum(tpr_at_fpr(pos, neg, 0.01)["tpr"] * len(pos) for pos, neg in runs)  # noqa: E731
    assert gap == pytest.approx((hits(ours) - hits(other)) / 128)
    ref_low, ref_high = _pooled_gap_by_loop(ours, other, 0.01, n_boot=2000, seed=2)
    assert low < gap < high
    assert abs(low - ref_low) < 0.03 and abs(high - ref_high) < 0.03


def test_pooled_tpr_difference_holds_the_thresholds_error_that_newcombe_leaves_out():
    rng = np.random.default_rng(7)
    ours_pos, other_pos = rng.normal(2.6, 1, 400), rng.normal(2.0, 1, 400)
    fixed = np.zeros(200)  # every negative alike: the threshold cannot move, only the positives' draw counts
    gap, low, high = pooled_tpr_difference_ci([(ours_pos, fixed)], [(other_pos, fixed)], 0.01, seed=3)
    newcombe = rate_difference_ci(int(np.sum(ours_pos > 0)), 400, int(np.sum(other_pos > 0)), 400)
    assert abs(low - newcombe[0]) < 0.01 and abs(high - newcombe[1]) < 0.01
    spread = rng.normal(0, 1, 200)  # the 1% threshold rests on the two largest of 200 negatives
    _, low, high = pooled_tpr_difference_ci([(ours_pos, spread)], [(other_pos, spread)], 0.01, seed=3)
    hits = [int(np.sum(pos > tpr_at_fpr(pos, spread, 0.01)["threshold"])) for pos in (ours_pos, other_pos)]
    narrow = rate_difference_ci(hits[0], 400, hits[1], 400)
    assert high - low > 1.3 * (narrow[1] - narrow[0])
    with pytest.raises(ValueError, match="positive and negative"):
        pooled_tpr_difference_ci([(ours_pos, [])], [(other_pos, spread)], 0.01)


def test_paired_tpr_difference_redraws_the_same_texts_for_both():
    """Two detectors of the same texts, one a little better: pairing cancels what they share, so its interval is
    narrower than the independent one's and still holds the gap; a detector against itself gives exactly 0."""
    rng = np.random.default_rng(11)
    keys = []
    for _ in range(3):
        signal, human = rng.normal(2.0, 1, 200), rng.normal(0, 1, 200)
        keys.append((signal, human, signal + rng.normal(0.3, 0.2, 200), human + rng.normal(0, 0.2, 200)))
    ours = [(better, human_b) for _, _, better, human_b in keys]
    other = [(signal, human) for signal, human, _, _ in keys]
    gap, low, high = pooled_tpr_difference_ci(ours, other, 0.01, seed=2, paired=True)
    _, wide_low, wide_high = pooled_tpr_difference_ci(ours, other, 0.01, seed=2)
    assert low <= gap <= high and high - low < 0.6 * (wide_high - wide_low)
    assert pooled_tpr_difference_ci(other, other, 0.01, paired=True) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="same number"):
        pooled_tpr_difference_ci(ours[:1], [(other[0][0][:100], other[0][1])], 0.01, paired=True)


@pytest.mark.parametrize(
    ("counts", "published"),
    [
        # Newcombe (1998), Stat. Med. 17:873, Table II, method 10 (hybrid score), to its 4 decimals
        ((56, 70, 48, 80), (0.0524, 0.3339)),
        ((9, 10, 3, 10), (0.1705, 0.8090)),
        ((5, 56, 0, 29), (-0.0381, 0.1926)),
    ],
)
def test_rate_difference_interval_matches_newcombes_published_values(counts, published):
    assert rate_difference_ci(*counts) == pytest.approx(published, abs=6e-5)


def test_wilson_interval_matches_newcombes_single_rate_example():
    # Newcombe (1998), Stat. Med. 17:857, 81 of 263: 0.2553 to 0.3662
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=6e-5)
