"""Step 4 of detection: one text's statistics become a result, a score, a p-value and a decision.

The decision rule, in order: a fixed LLR threshold (``DetectConfig.threshold``); a calibrated one (the
key's, for the text's length band where it has one); else the p-value against ``alpha``. The p-value is
the permutation test over list assignments; below its floor 1/(K+1) the tail bound refines it
(:func:`with_tail`).
"""

from __future__ import annotations

import math

import torch
from scipy.stats import binom

from openstamp.config import DetectConfig
from openstamp.detect.calibrate import calibrated_threshold, length_band
from openstamp.detect.items import Item
from openstamp.detect.llr import TokenStats, permutation_pvalue
from openstamp.detect.result import DetectionResult
from openstamp.detect.tail import combined_pvalue
from openstamp.key.key import WatermarkKey

PERMUTATION_TEST = "permutation test of the centred LLR over list assignments (K={k})"
TAIL_TEST = PERMUTATION_TEST + "; below 1/(K+1): Chernoff bound over random keys"


def fixed_threshold(key: WatermarkKey, config: DetectConfig) -> float | None:
    """The LLR threshold for every length: the configured one, else the key's calibrated one, else None."""
    if config.threshold is not None:
        return config.threshold
    if config.calibrated:
        return calibrated_threshold(key, config.alpha)
    return None


def too_short(item: Item, config: DetectConfig) -> DetectionResult | None:
    """The result of an item with fewer than ``min_tokens`` scored tokens; None when it is long enough."""
    if item.n_scored >= config.min_tokens:
        return None
    return DetectionResult(
        status="too_short",
        n_tokens=item.n_scored,
        truncated=item.truncated,
        rule=f"needs at least {config.min_tokens} scored tokens",
    )


def decide(
    item: Item,
    stats: TokenStats,
    span: slice,
    *,
    key: WatermarkKey,
    config: DetectConfig,
    perms: torch.Tensor | None,
    never_green: torch.Tensor,
) -> DetectionResult:
    """The result of one text from its rows ``span`` of the batch's statistics."""
    llr = stats.llr[span]
    n = len(llr)
    detectors = {
        "llr": float(llr.mean()),
        "discrete_llr": float(stats.discrete[span].mean()),
        "green_fraction": float(stats.green[span].float().mean()),
        **binomial(item.targets(), stats, span, never_green, key.gamma),
    }
    p_value, test = None, None
    if perms is not None:
        statistic, p_value, z = permutation_pvalue(stats.selector[span], stats.residual[span], perms, key.delta)
        detectors.update(centred_llr=statistic / n, permutation_z=z, permutation_p=p_value)
        test = PERMUTATION_TEST.format(k=len(perms))
    score = detectors["llr"]
    if not all(math.isfinite(detectors[k]) for k in ("llr", "centred_llr") if k in detectors):
        return not_finite(item, n, detectors)
    band = length_band(key, n)
    threshold = fixed_threshold(key, config)
    if config.calibrated and config.threshold is None and band is not None:
        threshold = calibrated_threshold(key, config.alpha, n)
    if threshold is not None:
        decision, rule = score > threshold, f"llr > {threshold:.4g}"
    elif p_value is not None:
        decision, rule = p_value <= config.alpha, f"p <= {config.alpha:g}"
    else:
        decision, rule = None, "no threshold: pass a threshold, calibrate the key, or enable p-values"
    return DetectionResult(
        status="ok",
        n_tokens=n,
        score=score,
        p_value=p_value,
        test=test,
        decision=decision,
        rule=rule,
        detectors=detectors,
        truncated=item.truncated,
        length_band=band,
    )


def not_finite(item: Item, n: int, detectors: dict) -> DetectionResult:
    """The result of a text whose statistic is NaN or infinite: no score, no p-value and no decision."""
    return DetectionResult(
        status="not_finite",
        n_tokens=n,
        rule="the LLR is not finite (NaN or inf): the model's head or hidden states hold non-finite values",
        detectors={k: v for k, v in detectors.items() if k != "permutation_p"},  # that p-value ranks a NaN
        truncated=item.truncated,
    )


def below_floor(result: DetectionResult, config: DetectConfig) -> bool:
    """Whether the tail bound could refine this result's p-value: it sits at the permutation floor."""
    floor = 1.0 / (config.n_permutations + 1)
    return result.p_value is not None and config.tail_bound and result.p_value <= floor


def with_tail(result: DetectionResult, p_tail: float | None, n_permutations: int) -> DetectionResult:
    """The result with its p-value refined by the tail bound (in place; it is returned too)."""
    result.detectors["tail_p"] = p_tail
    result.p_value = combined_pvalue(result.p_value, n_permutations, p_tail)
    result.test = TAIL_TEST.format(k=n_permutations)
    return result


def binomial(targets: list[int], stats: TokenStats, span: slice, never_green: torch.Tensor, gamma: float) -> dict:
    """Green count over unique (token, selected list) pairs; exact binomial p-value.

    Repeated pairs are counted once (their memberships are not independent), and tokens that are in
    no list are left out, so under a random key each counted pair is green with probability exactly gamma.
    """
    pairs = {}
    for t, sel, g in zip(targets, stats.selected[span].tolist(), stats.green[span].tolist(), strict=True):
        if not never_green[t]:
            pairs[(t, sel)] = g
    n, k = len(pairs), sum(pairs.values())
    if n == 0:
        return {"binomial_z": float("nan"), "binomial_p": float("nan"), "binomial_pairs": 0}
    z = (k - gamma * n) / math.sqrt(n * gamma * (1 - gamma))
    return {"binomial_z": z, "binomial_p": float(binom.sf(k - 1, n, gamma)), "binomial_pairs": n}
