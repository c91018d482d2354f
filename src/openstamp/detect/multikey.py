"""Detection against several keys: one backbone pass per batch, Holm-adjusted p-values over the keys.

A model owner who releases one watermarked copy per licensee holds several keys for one base
model. Scoring a text against all of them asks m questions at once; ``holm`` adjusts the m
p-values so that the chance of flagging a human text under any key stays at most alpha
(family-wise error), and the result names the best-matching key.
"""

from __future__ import annotations

import copy

import numpy as np

from openstamp.config import DetectConfig
from openstamp.detect.detector import Detector
from openstamp.detect.result import DetectionResult
from openstamp.key.key import WatermarkKey
from openstamp.model.load import load_model


def holm(p_values) -> np.ndarray:
    """Holm's step-down adjusted p-values along the last axis: (..., m) -> (..., m).

    With the p-values sorted, p_(1) <= ... <= p_(m), the adjusted p_(i) is
    max_{j <= i} min(1, (m - j + 1) p_(j)); rejecting where it is <= alpha controls the
    family-wise error at alpha for any dependence between the tests.
    """
    p = np.asarray(p_values, dtype=np.float64)
    m = p.shape[-1]
    order = np.argsort(p, axis=-1, kind="stable")
    ranked = np.take_along_axis(p, order, axis=-1) * (m - np.arange(m))
    adjusted = np.minimum(1.0, np.maximum.accumulate(ranked, axis=-1))
    out = np.empty_like(adjusted)
    np.put_along_axis(out, order, adjusted, axis=-1)
    return out


class MultiKeyDetector:
    """Score texts against several keys of one model; same calls and results as ``Detector``.

    Detectors that share a model object share its forward pass: the backbone runs once per
    batch and each key scores the same hidden states (a re-tied key scored on the original
    model gets its own watermarked copy, hence its own pass). Each result is the best key's,
    with ``best_key``, ``p_values_by_key`` (Holm-adjusted) and ``p_value`` = the smallest of them.

    Args:
        detectors: one per key, all with the same tokenizer and the same settings; the
            decision must be the p-value rule (a calibrated LLR threshold has no correction).
    """

    def __init__(self, detectors: list[Detector]) -> None:
        if not detectors:
            raise ValueError("give at least one key")
        self.detectors = detectors
        self.config: DetectConfig = detectors[0].config
        self.tokenizer = detectors[0].tokenizer
        self.key_ids = [d.key.key_id for d in detectors]
        if len(set(self.key_ids)) < len(self.key_ids):
            raise ValueError(f"the same key was given twice: {', '.join(self.key_ids)}")
        if any(d.config != self.config for d in detectors):
            raise ValueError("every key must be scored with the same settings")
        if len(detectors) > 1 and (not self.config.p_values or self.threshold_rule):
            raise ValueError("several keys need the p-value rule (p-values on, no --threshold or --calibrated)")

    @property
    def threshold_rule(self) -> bool:
        return self.config.threshold is not None or self.config.calibrated

    @property
    def calibration_warnings(self) -> list[str]:
        """Every key's ``Detector.calibration_warnings`` (only one key may flag with calibrated thresholds)."""
        return [why for d in self.detectors for why in d.calibration_warnings]

    @property
    def key(self) -> WatermarkKey:
        """The first key (for callers that show one key's facts, such as its calibration)."""
        return self.detectors[0].key

    @classmethod
    def from_pretrained(
        cls,
        model: str,
        keys: list[str],
        config: DetectConfig | None = None,
        *,
        dtype: str = "float32",
        device: str = "cpu",
        cache_dir: str | None = None,
        base: str | None = None,
    ) -> MultiKeyDetector:
        """Load the model once and every key directory. Give the original model when the keys are of
        different releases: each release carries only its own key's head. ``base``: the original beside the
        release, whose backbone then reads the texts (``Detector``'s ``base``)."""
        loaded, tokenizer = load_model(model, dtype=dtype, device=device, cache_dir=cache_dir)
        original = None if base is None else load_model(base, dtype=dtype, device=device, cache_dir=cache_dir)[0]
        return cls([Detector(loaded, tokenizer, WatermarkKey.load(k), config, base=original) for k in keys])

    def detect(
        self,
        texts: list,
        prompts: list | None = None,
        *,
        token_scores: bool = False,
        progress: bool = False,
    ) -> list[DetectionResult]:
        """Score each text against every key; one combined result per text (see the class)."""
        return [self.combine(r) for r in self.detect_each(texts, prompts, token_scores=token_scores, progress=progress)]

    def detect_each(
        self,
        texts: list,
        prompts: list | None = None,
        *,
        token_scores: bool = False,
        progress: bool = False,
    ) -> list[list[DetectionResult]]:
        """Each text's uncorrected results, one per key (in ``key_ids`` order); ``combine`` joins them."""
        lead = self.detectors[0]
        items = lead.prepare(texts, prompts, token_scores=token_scores)
        each = lead.run(items, lambda batch: self._score(batch, token_scores), progress)
        return [r if isinstance(r, list) else [r] * len(self.detectors) for r in each]  # too short: one for all

    def detect_pool(self, texts: list, prompts: list | None = None, **options) -> DetectionResult:
        """One pooled result per key (``Detector.detect_pool``), combined as one text's (Holm over the keys)."""
        return self.combine([d.detect_pool(texts, prompts, **options) for d in self.detectors])

    # the same rendering of conversations into Chat items, then this class's detect against every key
    detect_messages = Detector.detect_messages

    def _score(self, items, token_scores: bool) -> list[list[DetectionResult]]:
        by_key: list[list[DetectionResult]] = [[] for _ in self.detectors]
        for group in _share_model(self.detectors):
            fwd = self.detectors[group[0]].forward(items)  # one backbone pass for this model
            for k in group:
                by_key[k] = self.detectors[k].results(items, fwd, token_scores)
        return [[r[i] for r in by_key] for i in range(len(items))]

    def combine(self, results: list[DetectionResult]) -> DetectionResult:
        """One text's results (one per key) -> the best key's, with Holm-adjusted p-values."""
        if len(results) == 1 or results[0].status != "ok":
            return results[0]
        p = np.array([1.0 if r.p_value is None else r.p_value for r in results])
        adjusted = holm(p)
        scores = np.array([-np.inf if r.score is None else r.score for r in results])
        best = int(np.lexsort((-scores, p))[0])  # smallest p-value; ties to the larger LLR
        result = copy.copy(results[best])
        result.best_key = self.key_ids[best]
        result.p_values_by_key = dict(zip(self.key_ids, map(float, adjusted), strict=True))
        result.p_value = float(adjusted[best])
        result.test = f"{result.test}; Holm-adjusted over {len(results)} keys"
        result.decision = result.p_value <= self.config.alpha
        result.rule = f"Holm-adjusted p <= {self.config.alpha:g} over {len(results)} keys"
        return result


def _share_model(detectors: list[Detector]) -> list[list[int]]:
    """Indices of the detectors grouped by the model object they score with."""
    groups: dict[int, list[int]] = {}
    for i, d in enumerate(detectors):
        groups.setdefault(id(d.model), []).append(i)
    return list(groups.values())


def load_detector(
    model: str, keys: list[str], config: DetectConfig | None = None, **load
) -> Detector | MultiKeyDetector:
    """A ``Detector`` for one key, a ``MultiKeyDetector`` for several."""
    if len(keys) == 1:
        return Detector.from_pretrained(model, keys[0], config, **load)
    return MultiKeyDetector.from_pretrained(model, keys, config, **load)
