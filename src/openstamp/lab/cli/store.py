"""openstamp store: what the eval store holds, and removing what no eval has used lately."""

from __future__ import annotations

import datetime as dt

import typer
from rich.table import Table

from openstamp.cli.common import StoreOption, console, friendly_errors, out


@friendly_errors
def store(
    path: str = StoreOption,
    prune_days: float | None = typer.Option(None, help="remove the entries no eval has used for this many days"),
    clear: bool = typer.Option(False, help="remove every entry"),
) -> None:
    """Show the keys and generation batches evals share (openstamp eval --store), or remove old ones."""
    from openstamp.lab.evaluation.store import open_store  # lazy: ~6 ms at every `openstamp` call's start-up

    if clear and prune_days is not None:
        raise ValueError("choose --prune-days or --clear, not both")
    if prune_days is not None and prune_days < 0:
        raise ValueError("--prune-days must be 0 or more")
    kept = open_store(path)
    if kept is None:
        raise ValueError("--store none names no store; give a folder, or auto")
    if clear or prune_days is not None:
        removed = kept.prune(None if clear else prune_days)
        size = sum(e.size for e in removed) / 2**20
        console.print(f"removed {len(removed)} entries ({size:.1f} MiB) from {kept.root}")
    entries = kept.entries()
    table = Table(title=f"eval store {kept.root}")
    for column in ("kind", "entries", "MiB", "oldest use", "latest use"):
        table.add_column(column, justify="left" if column == "kind" else "right")
    for kind, label in (("key", "keys"), ("batch", "generation batches")):
        group = [e for e in entries if e.kind == kind]
        days = [dt.datetime.fromtimestamp(e.last_used).strftime("%Y-%m-%d %H:%M") for e in group]
        size = f"{sum(e.size for e in group) / 2**20:.1f}"
        table.add_row(label, str(len(group)), size, min(days, default="-"), max(days, default="-"))
    out.print(table)
