"""The errors a user can cause, in one light module (the CLI imports it without loading torch)."""

from __future__ import annotations


class AssetMissingError(RuntimeError):
    """A packaged asset's PyPI package is not installed."""


class CorpusError(ValueError):
    """A corpus spec that cannot be read, or that yields no documents."""


class ModelNotFoundError(ValueError):
    """The model spec is neither a directory, a packaged alias, nor a loadable hub id."""


class InvalidKeyError(ValueError):
    """A key directory that is missing or corrupt."""


class KeyMismatchError(InvalidKeyError):
    """A key used with a model it was not made for."""


class RepairError(ValueError):
    """A backbone repair asked of models that are not a re-tied release and its base, or that failed."""


class MissingExtraError(ImportError):
    """An optional dependency, installed with one of the package's extras, is missing."""


def require_extra(module: str, extra: str, what: str) -> None:
    """Raise ``MissingExtraError`` naming the extra if ``module`` cannot be imported."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(f"{what} needs {module}: pip install 'openstamp[{extra}]'")
