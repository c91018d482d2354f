"""Detection: per-token LLR statistics, the batched detector, calibration, evidence views."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Chat": "openstamp.detect.chat",
    "DetectionResult": "openstamp.detect.result",
    "Detector": "openstamp.detect.detector",
    "MultiKeyDetector": "openstamp.detect.multikey",
    "WatermarkDetector": "openstamp.detect.hf",
    "holm": "openstamp.detect.multikey",
    "load_detector": "openstamp.detect.multikey",
    "render_chat": "openstamp.detect.chat",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:  # lazy, so the result type is importable without torch
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'openstamp.detect' has no attribute {name!r}")
