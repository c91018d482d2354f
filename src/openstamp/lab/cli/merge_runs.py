"""openstamp merge-runs: one comparison from evaluations run as shards (each holding its own seeds)."""

from __future__ import annotations

from pathlib import Path

import typer

from openstamp.cli.common import console, friendly_errors
from openstamp.lab.cli.eval import print_summary


@friendly_errors
def merge_runs(
    shards: list[Path] = typer.Argument(..., help="run folders (or their results.json) of `openstamp eval`"),
    out_dir: Path = typer.Option(..., "--out", help="new folder for the merged results.json, report and plots"),
    mixed_dtypes: bool = typer.Option(
        False,
        "--mixed-dtypes",
        help="let the runs differ in the dtypes their machines resolved (sample, score, own perplexity); "
        "the merge names each seed's",
    ),
) -> None:
    """Merge evaluations that differ only in their seeds, as one run holding all of them would report them."""
    from openstamp.lab.evaluation.report import write_report
    from openstamp.lab.evaluation.shards import merge_into

    merged = merge_into(out_dir, shards, mixed_dtypes)
    path = write_report(out_dir)
    print_summary(merged)
    seeds = ", ".join(map(str, merged["config"]["seeds"]))
    console.print(f"merged {len(shards)} runs (seeds {seeds}); report: [bold]{path}[/]")
