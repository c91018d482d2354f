"""openstamp report: re-render an evaluation's report from its saved results."""

from __future__ import annotations

from pathlib import Path

import typer

from openstamp.cli.common import console, friendly_errors
from openstamp.lab.cli.eval import print_summary
from openstamp.storage import read_json


@friendly_errors
def report(
    run_dir: Path = typer.Argument(..., help="a directory written by `openstamp eval`"),
    drop_attack: list[str] = typer.Option(
        [],
        "--drop-attack",
        help="leave out the section an attack added (the name of its --out folder), a trial run's; repeatable",
    ),
) -> None:
    """Re-render report.md and the plots from a run's saved results (no generation, no scoring)."""
    from openstamp.lab.attacks.report import drop_section
    from openstamp.lab.evaluation.report import write_report

    results = read_json(run_dir / "results.json", "results file")  # an eval run, before any section goes
    for name in drop_attack:
        drop_section(run_dir, name)
        console.print(f"dropped the attack section {name!r}")
    path = write_report(run_dir)
    print_summary(results)
    console.print(f"report: [bold]{path}[/]")
