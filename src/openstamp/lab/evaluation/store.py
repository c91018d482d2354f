"""Finished keys and generation batches of every eval, kept by the sha256 of what made them.

Two evals that build the same key (the method, its settings, the model, the key documents, the
seed) or sample the same batch (that key at that strength, the batch's prompts, the sampling
settings and seed) share the work: the second takes what the first kept instead of computing it,
and gets the same bits (a trained key included, whose rebuild can differ by machine). Each digest
also covers the package's own source code and the versions of torch and transformers, so after a
change to the code an entry misses instead of returning what other code made.

    store/
      keys/<sha256>/               a key folder as ``openstamp eval`` writes it (tensors, settings.json, done)
      generations/<sha256>.json    one batch's completions (token ids)

Entries are written to a temporary sibling and renamed, so a killed process leaves no half
entry; key files are hard links where the file system allows (a key is written once, never
edited), else copies. ``openstamp eval --store`` chooses the folder: by default
``$OPENSTAMP_EVAL_STORE``, else ``eval/`` under the model cache (``$OPENSTAMP_CACHE`` or
``~/.cache/openstamp``); ``none`` keeps nothing.

An entry's modification time is its last use (kept, or taken by an eval). ``openstamp store`` shows what the
store holds and removes entries unused for a number of days (``--prune-days``) or all of them (``--clear``);
an entry is renamed away before it is deleted, so an eval never reads half of one.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import math
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from openstamp.assets import cache_root, sha256_file
from openstamp.storage import atomic_directory, atomic_write_json, read_json

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=1)
def code_digest() -> str:
    """sha256 of every .py file of the installed package (relative path and bytes), and of torch's and transformers'
    versions: what produced an entry besides its inputs."""
    import torch
    import transformers

    package = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256(f"{torch.__version__} {transformers.__version__}".encode())
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def digest(*parts) -> str:
    """sha256 of the parts (JSON-serialisable) and of :func:`code_digest`."""
    text = json.dumps([code_digest(), *parts], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def folder_digest(directory: Path) -> str:
    """sha256 of every file in a folder (relative path and bytes): a key's identity as saved."""
    files = sorted(p for p in Path(directory).rglob("*") if p.is_file())
    listing = [[p.relative_to(directory).as_posix(), sha256_file(p)] for p in files]
    return hashlib.sha256(json.dumps(listing).encode()).hexdigest()


class EvalStore:
    """A folder of keys and generation batches by content digest (see the module docstring)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.hits = 0
        self.made_from: dict = {}  # the eval's model and key documents, set once it has loaded them

    def fetch_key(self, ident: str, directory: Path) -> bool:
        """Fill ``directory`` with the key kept under ``ident``; False if there is none."""
        kept = self.root / "keys" / ident
        if not (kept / "done").exists():
            return False
        with atomic_directory(directory, overwrite=True) as tmp:
            _link_tree(kept, tmp)
        _touch(kept)
        self.hits += 1
        log.info("key taken from the store (%s)", kept)
        return True

    def keep_key(self, ident: str, directory: Path) -> None:
        """Keep a finished key folder under ``ident`` (once: an entry is never replaced)."""
        kept = self.root / "keys" / ident
        if kept.exists():
            return
        with atomic_directory(kept) as tmp:
            _link_tree(directory, tmp)

    def batch(self, ident: str) -> list | None:
        """The completions kept under ``ident``, or None; an unreadable entry counts as none (and is replaced)."""
        path = self.root / "generations" / f"{ident}.json"
        if not path.exists():
            return None
        try:
            ids = read_json(path, "generation batch in the store")
        except ValueError as err:
            log.warning("%s; generating the batch again", err)
            return None
        _touch(path)
        self.hits += 1
        return ids

    def keep_batch(self, ident: str, ids: list) -> None:
        atomic_write_json(self.root / "generations" / f"{ident}.json", ids)

    def entries(self) -> list[Entry]:
        """Every finished entry, keys then batches (a half-written one, a hidden temporary, is left out)."""
        keys = sorted(p for p in (self.root / "keys").glob("[!.]*") if (p / "done").exists())
        batches = sorted((self.root / "generations").glob("[!.]*.json"))
        return [Entry.of(p, "key") for p in keys] + [Entry.of(p, "batch") for p in batches]

    def prune(self, days: float | None = None) -> list[Entry]:
        """Remove the entries unused for more than ``days`` days (all of them for None); return those removed."""
        cutoff = math.inf if days is None else time.time() - days * 86400
        removed = [e for e in self.entries() if e.last_used < cutoff]
        for entry in removed:
            gone = entry.path.with_name(f".{entry.path.name}.removed-{uuid.uuid4().hex[:8]}")
            os.rename(entry.path, gone)  # an eval now misses the entry instead of reading part of it
            if gone.is_dir():
                shutil.rmtree(gone)
            else:
                gone.unlink()
        return removed


@dataclass(frozen=True)
class Entry:
    """One kept key or batch: its path, kind (key or batch), bytes on disk (a hard-linked file counts in full)
    and last use (seconds since the epoch)."""

    path: Path
    kind: str
    size: int
    last_used: float

    @classmethod
    def of(cls, path: Path, kind: str) -> Entry:
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        stamp = path / "done" if path.is_dir() else path
        return cls(path, kind, sum(p.stat().st_size for p in files), stamp.stat().st_mtime)


def _touch(path: Path) -> None:
    """Record a use of an entry (its done marker for a key folder); a read-only store keeps its times."""
    with contextlib.suppress(OSError):
        os.utime(path / "done" if path.is_dir() else path)


def open_store(spec: str | None) -> EvalStore | None:
    """``none`` (or None): no store; ``auto``: $OPENSTAMP_EVAL_STORE (itself possibly ``none``), else
    <model cache>/eval; anything else: that folder."""
    if spec == "auto":
        spec = os.environ.get("OPENSTAMP_EVAL_STORE") or str(cache_root() / "eval")
    if spec is None or spec.strip().lower() == "none":
        return None
    root = Path(spec)
    try:  # fail before any work, not at the first key kept
        root.mkdir(parents=True, exist_ok=True)
        writable = os.access(root, os.W_OK | os.X_OK)
    except OSError as err:
        writable, root = False, f"{root} ({err.strerror})"
    if not writable:
        raise PermissionError(f"the eval store {root} is not a writable folder; pass --store none or another folder")
    return EvalStore(spec)


def _link_tree(source: Path, target: Path) -> None:
    for path in sorted(p for p in source.rglob("*") if p.is_file()):
        dest = target / path.relative_to(source)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(path, dest)
        except OSError:  # another file system, or links not allowed
            shutil.copy2(path, dest)
