"""openstamp report: re-render an evaluation's report from its saved results."""

from __future__ import annotations

from pathlib import Path

import typer

from openstamp.cli.common import console, friendly_errors
from openstamp.cli.eval import print_summary


@friendly_errors
def report(run_dir: Path = typer.Argument(..., help="a directory written by `openstamp eval`")) -> None:
    """Re-render report.md and the plots from a run's saved results (no generation, no scoring)."""
    from openstamp.evaluation.report import write_report
    from openstamp.storage import read_json

    path = write_report(run_dir)
    print_summary(read_json(run_dir / "results.json", "results file"))
    console.print(f"report: [bold]{path}[/]")
