"""openstamp audit: what does a checkpoint directory or GGUF file leak before it is released?"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from openstamp.cli.common import CacheOption, friendly_errors, out, setup_logging

STYLE = {"high": "bold red", "medium": "yellow", "info": "dim"}


@friendly_errors
def audit(
    checkpoint: Path = typer.Argument(..., help="the checkpoint directory, or .gguf file, about to be released"),
    key: Path | None = typer.Option(None, "--key", "-k", help="the private key, to look for its material"),
    base: str | None = typer.Option(None, help="the public base checkpoint (directory or packaged alias)"),
    near_cosine: float = typer.Option(
        0.5,
        help="flag two matrices as near copies when their mean-centred cosine reaches this: a watermark moves U by "
        "0.14-0.6 x delta relative to its size, so U~ and U stay near 0.6-0.96, unrelated matrices near 0",
    ),
    as_json: bool = typer.Option(False, "--json", help="print the findings as JSON"),
    cache_dir: Path | None = CacheOption,
) -> None:
    """Report findings (high/medium/info); exits 1 when any is high."""
    from openstamp.release.audit import audit as run_audit

    setup_logging(quiet=True)
    findings = run_audit(checkpoint, key, base, cache_dir=cache_dir, near_cosine=near_cosine)
    counts = {s: sum(f.severity == s for f in findings) for s in ("high", "medium", "info")}
    if as_json:
        report = {
            "checkpoint": str(checkpoint),
            "key": str(key) if key else None,
            "base": base,
            "near_cosine": near_cosine,
            "summary": counts,
            "findings": [f.to_dict() for f in findings],
        }
        out.print_json(json.dumps(report))
    else:
        table = Table(title=f"OpenStamp release audit: {checkpoint}")
        for column in ("severity", "check", "finding"):
            table.add_column(column, overflow="fold")
        for f in findings:
            text = f.message + "".join(f"\n  {d}" for d in f.details[:20])
            if len(f.details) > 20:
                text += f"\n  ... and {len(f.details) - 20} more"
            table.add_row(f"[{STYLE[f.severity]}]{f.severity}[/]", f.check, text)
        out.print(table)
        out.print(", ".join(f"{n} {s}" for s, n in counts.items()))
    if counts["high"]:
        raise typer.Exit(1)
