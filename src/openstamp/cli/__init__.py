"""The ``openstamp`` command: one subcommand per file."""

from __future__ import annotations

import typer

from openstamp.cli import durability  # noqa: F401  (registers merge, prune, instruct on attack_app)
from openstamp.cli.analyze import analyze_app
from openstamp.cli.attack import attack_app
from openstamp.cli.audit import audit
from openstamp.cli.calibrate import calibrate
from openstamp.cli.demo import demo
from openstamp.cli.detect import detect
from openstamp.cli.embed import embed
from openstamp.cli.eval import evaluate
from openstamp.cli.export import export_app
from openstamp.cli.merge_runs import merge_runs
from openstamp.cli.report import report
from openstamp.cli.serve import serve
from openstamp.cli.store import store
from openstamp.cli.tune import tune

app = typer.Typer(
    name="openstamp",
    help="Watermark open-weight language models inside their weights, and detect the watermark.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command()(demo)
app.command()(embed)
app.command()(tune)
app.command()(detect)
app.command()(calibrate)
app.command(name="eval")(evaluate)
app.command()(report)
app.command(name="merge-runs")(merge_runs)
app.command()(serve)
app.command()(store)
app.command()(audit)
app.add_typer(attack_app, name="attack")
app.add_typer(export_app, name="export")
app.add_typer(analyze_app, name="analyze")


def main() -> None:
    app()
