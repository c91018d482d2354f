"""The ``openstamp`` command: one subcommand per file.

The product's commands are registered here. Other packages add theirs through the ``openstamp.cli``
entry point group (the lab's eval, report, store, merge-runs, attack and analyze): each entry point is a
function that takes this app. One whose imports fail (an extra not installed) is left out.
"""

from __future__ import annotations

import logging
from importlib.metadata import entry_points

import typer

from openstamp.cli.audit import audit
from openstamp.cli.calibrate import calibrate
from openstamp.cli.demo import demo
from openstamp.cli.detect import detect
from openstamp.cli.embed import embed
from openstamp.cli.export import export_app
from openstamp.cli.serve import serve
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
app.command()(serve)
app.command()(audit)
app.add_typer(export_app, name="export")

for plugin in entry_points(group="openstamp.cli"):
    try:
        plugin.load()(app)
    except ImportError as err:  # a plugin whose dependencies are not installed
        logging.getLogger(__name__).debug("openstamp.cli plugin %s not loaded: %s", plugin.name, err)


def main() -> None:
    app()
