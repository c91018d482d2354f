"""Detection: per-token LLR statistics, the batched detector, calibration."""

from openstamp.detect.detector import Detector
from openstamp.detect.result import DetectionResult

__all__ = ["DetectionResult", "Detector"]
