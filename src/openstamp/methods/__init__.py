"""Watermarking methods with one shape: OpenStamp and the open-weight and decode-time baselines."""

from openstamp.methods import gaussmark, kgw, openstamp, unremovable  # noqa: F401  (registers the methods)
from openstamp.methods.base import REGISTRY, MethodScore, WatermarkMethod, create, register

__all__ = ["REGISTRY", "MethodScore", "WatermarkMethod", "create", "register"]
