"""The detection result: evidence, not just a verdict. The CLI, the HTTP service and the
reports all render this one object."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class DetectionResult:
    """One text's detection.

    Attributes:
        status: ``ok``, ``too_short`` (fewer scored tokens than the minimum; no score), or ``not_finite`` (the
            statistic is NaN or infinite, from a corrupt checkpoint; no score, p-value or decision).
        n_tokens: tokens scored (the completion only, never the prompt).
        score: mean per-token LLR (the paper's length-normalised score).
        p_value: p-value of ``test`` (valid when the text is independent of the key).
        test: the test behind ``p_value``.
        decision: True if flagged as watermarked under ``rule``.
        rule: what the decision compared (e.g. ``p <= 0.01``).
        detectors: every detector's score from the same forward pass.
        token_scores: per-token LLR, when asked for.
        tokens: the scored tokens' text pieces, when asked for.
        length_band: the calibrated length band the text falls in ("64-127"), when the key
            holds per-length calibration (``openstamp calibrate --lengths``).
        best_key: with several keys, the id of the best-matching key (smallest p-value);
            ``p_value`` is then its Holm-adjusted p-value, and the other fields are that key's.
        p_values_by_key: with several keys, each key's Holm-adjusted p-value.
        backbone: which backbone computed the hidden states: ``original`` (the base's, or a release's
            that is the original's) or ``release`` (a re-tied release's, which carries U~; docs/detection.md).
        n_texts: pooled detection (``Detector.detect_pool``): the texts in the set; ``n_tokens`` then counts
            the set's scored tokens and every score is the set's.
    """

    status: str
    n_tokens: int
    score: float | None = None
    p_value: float | None = None
    test: str | None = None
    decision: bool | None = None
    rule: str | None = None
    detectors: dict[str, float] = field(default_factory=dict)
    truncated: bool = False
    token_scores: list[float] | None = None
    tokens: list[str] | None = None
    length_band: str | None = None
    best_key: str | None = None
    p_values_by_key: dict[str, float | None] | None = None
    backbone: str | None = None
    n_texts: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready data; optional fields that are None are left out."""
        data = asdict(self)
        for name in OPTIONAL:
            if data[name] is None:
                data.pop(name)
        return _finite(data)


OPTIONAL = ("token_scores", "tokens", "length_band", "best_key", "p_values_by_key", "backbone", "n_texts")


def _finite(value: Any) -> Any:
    """JSON has no NaN: replace non-finite floats with None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
