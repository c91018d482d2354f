"""OpenStamp: a watermark for open-weight language models, written into the unembedding matrix.

Python API::

    from openstamp import load_model, load_profile, build_key, apply_watermark, Detector

    model, tokenizer = load_model("smollm2-135m")
    key = build_key(model, tokenizer, documents, load_profile("default"))
    apply_watermark(model, key)
    key.save("runs/demo/key"); model.save_pretrained("runs/demo/model")

or, all at once, ``openstamp.embed(...)``. Names are imported on first use, so light entry
points (the HTTP client, ``openstamp detect --server``) start without loading torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.3.1"

_EXPORTS = {
    "DetectConfig": "openstamp.config",
    "EmbedConfig": "openstamp.config",
    "load_profile": "openstamp.config",
    "Document": "openstamp.corpus",
    "load_documents": "openstamp.corpus",
    "split_documents": "openstamp.corpus",
    "DetectionResult": "openstamp.detect.result",
    "Detector": "openstamp.detect.detector",
    "MultiKeyDetector": "openstamp.detect.multikey",
    "WatermarkDetector": "openstamp.detect.hf",
    "WatermarkDetectorOutput": "openstamp.detect.hf",
    "Chat": "openstamp.detect.chat",
    "render_chat": "openstamp.detect.chat",
    "build_key": "openstamp.embed.build",
    "embed": "openstamp.embed",
    "InvalidKeyError": "openstamp.errors",
    "KeyMismatchError": "openstamp.errors",
    "WatermarkKey": "openstamp.key.key",
    "load_model": "openstamp.model.load",
    "apply_watermark": "openstamp.model.patch",
    "check_key": "openstamp.model.patch",
    "revert_watermark": "openstamp.model.patch",
    "RepairConfig": "openstamp.embed.repair",
    "repair_backbone": "openstamp.embed.repair",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name == "embed":  # the package, which can be called as the pipeline
        return importlib.import_module("openstamp.embed")
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'openstamp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
