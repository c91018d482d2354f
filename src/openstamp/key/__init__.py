"""Pure tensor code for the key: green lists (G), projection (P), selector (S)."""

from openstamp.key.key import InvalidKeyError, KeyMismatchError, WatermarkKey
from openstamp.key.prf import PRF_VERSION, green_lists, new_secret

__all__ = ["InvalidKeyError", "KeyMismatchError", "PRF_VERSION", "WatermarkKey", "green_lists", "new_secret"]
