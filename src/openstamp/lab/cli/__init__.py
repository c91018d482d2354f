"""The lab's subcommands, added to the ``openstamp`` command by the ``openstamp.cli`` entry point."""

from __future__ import annotations

import typer

from openstamp.lab.cli import durability  # noqa: F401  (registers merge, prune, instruct on attack_app)
from openstamp.lab.cli.analyze import analyze_app
from openstamp.lab.cli.attack import attack_app
from openstamp.lab.cli.eval import evaluate
from openstamp.lab.cli.merge_runs import merge_runs
from openstamp.lab.cli.report import report
from openstamp.lab.cli.store import store


def register(app: typer.Typer) -> None:
    """Add eval, report, merge-runs, store, attack and analyze to ``app``."""
    app.command(name="eval")(evaluate)
    app.command()(report)
    app.command(name="merge-runs")(merge_runs)
    app.command()(store)
    app.add_typer(attack_app, name="attack")
    app.add_typer(analyze_app, name="analyze")
