"""Provenance: is this checkpoint a derivative of my release (the weights test), and signed receipts."""

from openstamp.provenance.verify import VerifyResult, verify_model

__all__ = ["VerifyResult", "verify_model"]
