"""Watermarking methods with one shape: OpenStamp and the open-weight and decode-time baselines."""

# isort: off
# Importing a method's module registers it; this order is the order of every table.
from openstamp.lab.methods import openstamp  # noqa: F401
from openstamp.lab.methods import unremovable  # noqa: F401
from openstamp.lab.methods import gaussmark  # noqa: F401
from openstamp.lab.methods import kgw  # noqa: F401
from openstamp.lab.methods import kgw_distilled  # noqa: F401
from openstamp.lab.methods import sir  # noqa: F401
from openstamp.lab.methods import hf_kgw  # noqa: F401
from openstamp.lab.methods import synthid  # noqa: F401

# isort: on
from openstamp.lab.methods.base import REGISTRY, Carrier, MethodScore, WatermarkMethod, create, register

__all__ = ["REGISTRY", "Carrier", "MethodScore", "WatermarkMethod", "create", "register"]
