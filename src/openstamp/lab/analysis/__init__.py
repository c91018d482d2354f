"""The paper's analyses of how a key behaves, as functions with plots (``openstamp analyze``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from openstamp.runtime import versions
from openstamp.storage import atomic_write_json


def write_results(out: str | Path, results: dict, figure: str, draw: Callable[[Path], None]) -> dict:
    """Add the versions, write ``out/results.json`` atomically, then draw ``out/figure`` (``draw(path)``)."""
    out = Path(out)
    results["versions"] = versions()
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "results.json", results)
    draw(out / figure)
    return results
