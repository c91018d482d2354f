"""Atomic writes: everything is written to a temporary sibling, then renamed into place; and the
settings a folder recorded, compared with the wanted ones."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def _writable_parent(target: Path) -> Path:
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PermissionError(f"cannot create directory {parent}: {err.strerror}") from err
    if not os.access(parent, os.W_OK | os.X_OK):
        raise PermissionError(f"output directory {parent} is not writable")
    return parent


def check_can_write(target: str | os.PathLike, overwrite: bool = False) -> Path:
    """Fail early, before any expensive work, if ``target`` cannot be written."""
    target = Path(target)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} already exists; pass --overwrite to replace it")
    _writable_parent(target)
    return target


@contextmanager
def atomic_directory(target: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``target`` only if the block finishes.

    An exception (or a killed process) leaves ``target`` untouched; the temporary
    directory is a hidden sibling that is removed on error.
    """
    target = check_can_write(target, overwrite)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
            os.rename(target, old)
            os.rename(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` through a temporary file with permissions ``mode``."""
    path = Path(path)
    _writable_parent(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str, mode: int = 0o644) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), mode)


def atomic_write_json(path: str | os.PathLike, data: Any, mode: int = 0o644) -> Path:
    return atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode)


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{what} {path} does not exist")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{what} {path} is corrupt: {err}") from err


def changed_settings(
    path: str | os.PathLike, wanted: dict, what: str, defaults: dict | None = None, grows: tuple[str, ...] = ()
) -> str:
    """How the settings stored in ``path`` differ from ``wanted``: '' where they match or ``path`` is absent.

    Both sides are compared as JSON (tuples are lists there); a field missing from the stored
    settings takes its value from ``defaults`` (a field added since, at its default, still matches);
    a list field named in ``grows`` also matches where the stored items are all among the wanted
    ones (a folder that may grow). Each differing field reads 'name: stored value there, wanted value now'.
    """
    if not Path(path).exists():
        return ""
    return differences({**(defaults or {}), **read_json(path, what)}, wanted, grows)


def differences(stored: dict, wanted: dict, grows: tuple[str, ...] = ()) -> str:
    """How two settings dicts differ, compared as JSON: 'name: stored value there, wanted value now' per field,
    '' where they match; a list field named in ``grows`` matches where the stored items are all wanted."""
    stored, wanted = json.loads(json.dumps(stored)), json.loads(json.dumps(wanted))
    changed = changed_fields(stored, wanted, grows)
    return "; ".join(f"{k}: {stored.get(k)!r} there, {wanted.get(k)!r} now" for k in changed)


def changed_fields(stored: dict, wanted: dict, grows: tuple[str, ...] = ()) -> list[str]:
    """The names of the fields in which two settings dicts differ, compared as JSON (see :func:`differences`)."""
    stored, wanted = json.loads(json.dumps(stored)), json.loads(json.dumps(wanted))

    def same(k: str) -> bool:
        old, new = stored.get(k), wanted.get(k)
        grown = k in grows and isinstance(old, list) and isinstance(new, list) and set(old) <= set(new)
        return old == new or grown

    return sorted(k for k in stored.keys() | wanted.keys() if not same(k))
