"""Calibration: empirical LLR thresholds on reference text, and a check of the p-values.

Two ways to turn a score into a decision, with different assumptions:

* the permutation p-value (default) is valid whenever the text is independent of the key,
  whatever its source; it needs no reference data;
* a calibrated threshold on the raw LLR controls the false-positive rate only for text like
  the reference corpus (the raw LLR's null shifts with the source, with delta and with L).
  It is the split-conformal threshold (``rates.conformal_threshold``): on a new text exchangeable
  with the n reference texts its rate is at most alpha, which needs n >= 1 / alpha - 1 (999 texts
  for alpha 0.001); with fewer, that alpha gets no threshold (None).

``openstamp calibrate`` scores held-out reference text, stores LLR thresholds for target
false-positive rates in the key, and reports how the p-values behave on that text (its QQ
plot is drawn by ``openstamp.detect.plots.qq_plot``).

With ``--lengths`` it also stores, per text length, the thresholds and the measured
false-positive rates with Clopper-Pearson intervals (``by_length``); a text of n scored tokens
then falls in the band of the longest calibrated length <= n, whose threshold is conservative
for it (the null spread of the mean LLR shrinks with length).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from openstamp.corpus import load_documents, split_documents
from openstamp.detect.rates import clopper_pearson, conformal_threshold, texts_needed
from openstamp.key.key import WatermarkKey
from openstamp.model.text import encode

DEFAULT_ALPHAS = (0.001, 0.01, 0.05)
CONFORMAL_SINCE = "0.3.1"  # the first package whose stored thresholds are split conformal


def empirical_thresholds(null_scores: np.ndarray, alphas=DEFAULT_ALPHAS) -> dict[str, float | None]:
    """The LLR threshold per alpha whose false-positive rate on text like ``null_scores`` is at most alpha
    (``rates.conformal_threshold``); None where there are too few texts for that alpha (``rates.texts_needed``)."""
    return {f"{alpha:g}": conformal_threshold(null_scores, alpha) for alpha in alphas}


def stale_thresholds(record: dict[str, Any] | None) -> str | None:
    """Why a key's stored thresholds may pass more than alpha (calibrated before ``CONFORMAL_SINCE``), or None."""
    from packaging.version import Version

    if not record or not record.get("llr_thresholds"):
        return None
    made = (record.get("versions") or {}).get("openstamp")
    if made is not None and Version(made) >= Version(CONFORMAL_SINCE):
        return None
    return (
        f"the key was calibrated by openstamp {made or 'before 0.2'}, whose thresholds pass up to "
        "(floor(alpha n) + 1)/(n + 1) of human text (above alpha); run `openstamp calibrate` again for thresholds "
        "whose rate is at most alpha"
    )


def observed_rates(p_values: np.ndarray, alphas=DEFAULT_ALPHAS) -> dict[str, float]:
    """Fraction of p-values at or below each alpha (the false-positive rate on null text)."""
    p = np.asarray(p_values, dtype=np.float64)
    return {f"{alpha:g}": float(np.mean(p <= alpha)) for alpha in alphas}


def calibrated_threshold(key: WatermarkKey, alpha: float, n_tokens: int | None = None) -> float:
    """The key's calibrated LLR threshold for ``alpha``; with ``n_tokens``, that of the text's length band
    when the key holds per-length calibration (below the shortest length: the shortest length's)."""
    record = key.meta.get("calibration")
    if not record:
        raise ValueError("this key has not been calibrated; run `openstamp calibrate` first or use p-values")
    thresholds = record["llr_thresholds"]
    by_length = record.get("by_length") or {}
    if n_tokens is not None and by_length:
        lengths = sorted(map(int, by_length))
        band = max([L for L in lengths if L <= n_tokens], default=lengths[0])
        thresholds = by_length[str(band)]["llr_thresholds"]
    if f"{alpha:g}" not in thresholds:
        raise ValueError(f"the key was calibrated for alpha in {sorted(thresholds)}, not {alpha:g}")
    if thresholds[f"{alpha:g}"] is None:
        raise ValueError(
            f"the key's calibration has no threshold for alpha {alpha:g}: it needs at least {texts_needed(alpha)} "
            "reference texts (of each length); run `openstamp calibrate` again with a larger --n, or use p-values"
        )
    return float(thresholds[f"{alpha:g}"])


def length_band(key: WatermarkKey, n_tokens: int) -> str | None:
    """The calibrated length band of a text of ``n_tokens`` scored tokens ("64-127", "200+", "<32"),
    or None when the key holds no per-length calibration."""
    by_length = (key.meta.get("calibration") or {}).get("by_length") or {}
    if not by_length:
        return None
    lengths = sorted(map(int, by_length))
    if n_tokens < lengths[0]:
        return f"<{lengths[0]}"
    i = max(j for j, L in enumerate(lengths) if L <= n_tokens)
    return f"{lengths[i]}+" if i == len(lengths) - 1 else f"{lengths[i]}-{lengths[i + 1] - 1}"


def rate(hits: int, n: int, level: float = 0.95) -> dict[str, float]:
    """A measured rate with its Clopper-Pearson interval."""
    low, high = clopper_pearson(hits, n, level)
    return {"rate": hits / n if n else float("nan"), "hits": hits, "n": n, "low": low, "high": high, "level": level}


def length_record(scores: np.ndarray, p_values: np.ndarray | None, alphas=DEFAULT_ALPHAS) -> dict[str, Any]:
    """Thresholds and measured false-positive rates of one length's null scores (N,) and p-values (N,).

    ``llr_threshold_fpr`` is cross-fitted: thresholds chosen on one half are tried on the other, and
    the hits of both halves pooled, so the rate is not the thresholds' own training error. The halves
    take alternate pairs of texts (0, 1 | 2, 3 | 4, 5 ...): ``reference_texts`` interleaves its corpora
    text by text, so each half holds every corpus alike, and the rate is not one corpus's threshold
    tried on another. ``p_value_fpr`` is the fraction of p-values <= alpha. Both carry Clopper-Pearson
    intervals.
    """
    scores = np.asarray(scores, dtype=np.float64)
    pair = (np.arange(len(scores)) // 2) % 2
    halves = (scores[pair == 0], scores[pair == 1])
    record: dict[str, Any] = {"n_texts": len(scores), "llr_thresholds": empirical_thresholds(scores, alphas)}
    if min(map(len, halves)) > 0:
        fpr = {}
        for alpha in alphas:
            taus = [conformal_threshold(fit, alpha) for fit in halves]
            if None not in taus:  # each half alone must hold enough texts for alpha
                hits = sum(int((test > tau).sum()) for tau, test in zip(taus, halves[::-1], strict=True))
                fpr[f"{alpha:g}"] = rate(hits, len(scores))
        record["llr_threshold_fpr"] = fpr
    if p_values is not None and len(p_values):
        p = np.asarray(p_values, dtype=np.float64)
        record["p_value_fpr"] = {f"{a:g}": rate(int((p <= a).sum()), len(p)) for a in alphas}
    return record


def store_calibration(key_dir: str | os.PathLike, record: dict[str, Any]) -> None:
    """Write the calibration into the key's metadata (an atomic rewrite of key.json, whose checksum covers it)."""
    key = WatermarkKey.load(key_dir)
    key.meta["calibration"] = record
    key.write_header(key_dir)


def reference_texts(
    tokenizer, corpora: list[str], n: int, length: int, exclude: set[str], part: str = "heldout"
) -> list[str]:
    """``n`` windows of ``length`` tokens from ``part`` of ``corpora`` (``heldout``, or ``all`` for an owner's own
    domain text, which built no key), decoded to text.

    Documents listed in ``exclude`` (sha256 of the texts that built the key) are skipped, and
    corpora are interleaved window by window.
    """

    per_corpus = []
    for spec in corpora:
        docs = [d for d in split_documents(load_documents(spec), part) if d.sha256 not in exclude]
        windows = []
        for ids in encode(tokenizer, [d.text for d in docs]):
            windows.extend(ids[i : i + length] for i in range(0, len(ids) - length + 1, length))
        per_corpus.append(windows)
    mixed = [w for group in zip(*per_corpus, strict=False) for w in group]
    mixed += [w for windows in per_corpus for w in windows[min(map(len, per_corpus)) :]]
    if len(mixed) < n:
        raise ValueError(f"the {part} reference text gives {len(mixed)} windows of {length} tokens, fewer than {n}")
    return tokenizer.batch_decode(mixed[:n], skip_special_tokens=True)


def calibration_record(results, alphas, reference: dict[str, Any]) -> tuple[dict[str, Any], np.ndarray]:
    """LLR thresholds and the observed behaviour of the p-values on null (reference) text."""
    from scipy.stats import kstest

    ok = [r for r in results if r.status == "ok"]
    scores = np.array([r.score for r in ok])
    p_values = np.array([r.p_value for r in ok if r.p_value is not None])
    record = {
        **reference,
        "n_texts": len(ok),
        "llr_thresholds": empirical_thresholds(scores, alphas),
        "llr_null_mean": float(scores.mean()),
        "llr_null_sd": float(scores.std()),
    }
    if len(p_values):
        record.update(
            p_value_observed_fpr=observed_rates(p_values, alphas),
            p_value_ks_uniform=float(kstest(p_values, "uniform").pvalue),
        )
    return record, p_values
