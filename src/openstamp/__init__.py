"""OpenStamp: a watermark for open-weight language models, written into the unembedding matrix.

Python API::

    from openstamp import load_model, load_profile, build_key, apply_watermark, WatermarkKey

    model, tokenizer = load_model("smollm2-135m")
    key = build_key(model, tokenizer, documents, load_profile("default"))
    apply_watermark(model, key)
    key.save("runs/demo/key"); model.save_pretrained("runs/demo/model")

or, all at once, ``openstamp.embed(...)``.
"""

__version__ = "0.1.0"

from openstamp.config import (  # noqa: E402
    DetectConfig,  # noqa: E402
    EmbedConfig,
    load_profile,
)
from openstamp.corpus import Document, load_documents, split_documents  # noqa: E402
from openstamp.detect import DetectionResult, Detector  # noqa: E402
from openstamp.embed import build_key, embed  # noqa: E402
from openstamp.key import InvalidKeyError, KeyMismatchError, WatermarkKey  # noqa: E402
from openstamp.models import load_model  # noqa: E402
from openstamp.patch import apply_watermark, check_key, revert_watermark  # noqa: E402

__all__ = [
    "DetectConfig",
    "DetectionResult",
    "Detector",
    "Document",
    "EmbedConfig",
    "InvalidKeyError",
    "KeyMismatchError",
    "WatermarkKey",
    "apply_watermark",
    "build_key",
    "check_key",
    "embed",
    "load_documents",
    "load_model",
    "load_profile",
    "revert_watermark",
    "split_documents",
]
