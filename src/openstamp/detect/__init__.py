"""Detection: per-token LLR statistics, the batched detector, calibration, evidence views."""

from __future__ import annotations

from typing import Any

__all__ = ["DetectionResult", "Detector"]


def __getattr__(name: str) -> Any:  # lazy, so the result type is importable without torch
    if name == "Detector":
        from openstamp.detect.detector import Detector

        return Detector
    if name == "DetectionResult":
        from openstamp.detect.result import DetectionResult

        return DetectionResult
    raise AttributeError(f"module 'openstamp.detect' has no attribute {name!r}")
