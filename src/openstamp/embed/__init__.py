"""The write side: from a model and documents to a key and a watermarked release.

    states.py      hidden states at sampled positions, with their prefix texts (shards.py: on disk)
    selector.py    S fitted on them, in memory or streamed over shards
    build.py       the key: states -> P -> S -> green lists (``build_key``)
    tune.py        delta chosen for a target detection rate at the least cost
    repair.py      a re-tied release's backbone trained back towards the base
    pipeline.py    all of it, then the files (``embed``, ``write_release``)
    sentences.py   sentence embeddings for the paper's projection P

The package can be called: ``openstamp.embed(model, corpus, out, key_dir, cfg)`` runs
:func:`openstamp.embed.pipeline.embed`, as it did when the pipeline was one module.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

_EXPORTS = {
    "build_key": "openstamp.embed.build",
    "embed": "openstamp.embed.pipeline",
    "EmbedResult": "openstamp.embed.pipeline",
    "write_release": "openstamp.embed.pipeline",
    "RepairConfig": "openstamp.embed.repair",
    "repair_backbone": "openstamp.embed.repair",
    "TuneConfig": "openstamp.embed.tune",
    "tune_delta": "openstamp.embed.tune",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'openstamp.embed' has no attribute {name!r}")


class _CallablePackage(types.ModuleType):
    """``openstamp.embed(...)`` keeps working now that ``embed`` is a package."""

    def __call__(self, *args: Any, **kwargs: Any):
        return __getattr__("embed")(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
