"""Shared CLI plumbing: console, options, and turning known errors into one clear line."""

from __future__ import annotations

import functools
import logging
import os
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

from openstamp.errors import AssetMissingError, CorpusError, InvalidKeyError, MissingExtraError, ModelNotFoundError

console = Console(stderr=True)
out = Console()

USER_ERRORS = (
    AssetMissingError,
    CorpusError,
    FileExistsError,
    FileNotFoundError,
    InvalidKeyError,
    IsADirectoryError,
    MissingExtraError,
    ModelNotFoundError,
    NotADirectoryError,
    PermissionError,
    ValueError,
)

ModelOption = typer.Option("smollm2-135m", "--model", "-m", help="hub id, local HF directory, or packaged alias")
DtypeOption = typer.Option("float32", help="float32, bfloat16, float16 or auto")
DeviceOption = typer.Option("cpu", help="cpu, cuda, cuda:N or auto")
StoreOption = typer.Option(
    "auto",
    "--store",
    help="folder where keys and generation batches are shared with other evals by content digest; "
    "auto: $OPENSTAMP_EVAL_STORE, else eval/ under the model cache; none: keep nothing",
)
CacheOption = typer.Option(
    None, help="where packaged models are converted (default $OPENSTAMP_CACHE or ~/.cache/openstamp)"
)


def setup_logging(quiet: bool = False) -> None:
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False, show_time=False)],
        force=True,
    )
    for noisy in ("httpx", "urllib3", "sentence_transformers", "transformers", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # bitsandbytes' CPU backend warns, whenever anything imports it on a CPU with AVX512-BF16, that it cannot fetch an
    # optional kernel from the hub ("kernels-community"); it falls back to its own. That module warns of nothing else
    logging.getLogger("bitsandbytes.backends.cpu.ops").setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def friendly_errors(func):
    """Print known user errors as one red line and exit 2, instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any):
        try:
            return func(*args, **kwargs)
        except USER_ERRORS as err:
            console.print(f"[bold red]error:[/] {escape(str(err))}", soft_wrap=True)  # "[ray]" is not markup
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            console.print("[yellow]interrupted; nothing half-written was left behind[/]")
            raise typer.Exit(130) from None

    return wrapper


def check_output(path: Path | None, overwrite: bool, option: str = "--output") -> None:
    """Refuse, before any work, an output path that is a directory, lies in no directory, or exists (unless
    ``overwrite``)."""
    if path is None:
        return
    if path.is_dir():
        raise IsADirectoryError(f"{option} {path} is a directory; give a file name")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{option} {path}: the directory {path.parent} does not exist")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{option} {path} exists; pass --overwrite to replace it")


def hide_progress_bars() -> None:
    """--quiet: no progress bars, transformers' weight loading's included."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def numbers(text: str, name: str, kind: type = float) -> tuple:
    """A comma-separated option (``--t 0.1,0.3``) as a tuple of ``kind``; a clear error when it is not."""
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--{name} expects comma-separated numbers, got {text!r}") from None
    if not values:
        raise ValueError(f"--{name} needs at least one value")
    return values


def parse_settings(items: list[str] | None) -> dict[str, Any]:
    """``--set section.field=value`` pairs; values are parsed as JSON when possible."""
    import json

    settings: dict[str, Any] = {}
    for item in items or []:
        name, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects section.field=value, got {item!r}")
        try:
            settings[name.strip()] = json.loads(raw)
        except json.JSONDecodeError:
            settings[name.strip()] = raw
    return settings


def is_terminal() -> bool:
    return sys.stdout.isatty()
