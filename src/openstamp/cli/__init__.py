"""The ``openstamp`` command: one subcommand per file.

The product's commands are registered here. Other packages add theirs through the ``openstamp.cli``
entry point group (the lab's eval, report, store, merge-runs, attack and analyze): each entry point is a
function that takes the app. One whose imports fail (an extra not installed) is left out.
"""

from __future__ import annotations

import functools
import logging
from importlib.metadata import entry_points

import typer

from openstamp.cli.audit import audit
from openstamp.cli.calibrate import calibrate
from openstamp.cli.demo import demo
from openstamp.cli.detect import detect
from openstamp.cli.embed import embed
from openstamp.cli.export import export_app
from openstamp.cli.receipt import receipt_app
from openstamp.cli.serve import serve
from openstamp.cli.tune import tune
from openstamp.cli.verify import verify_model


def build_app() -> typer.Typer:
    """The command: the product's subcommands, then each ``openstamp.cli`` entry point's."""
    app = typer.Typer(
        name="openstamp",
        help="Watermark open-weight language models inside their weights, and detect the watermark.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )
    app.callback()(main_options)
    for command in (demo, embed, tune, detect, calibrate, serve, audit):
        app.command()(command)
    app.command("verify-model")(verify_model)
    app.add_typer(export_app, name="export")
    app.add_typer(receipt_app, name="receipt")
    for plugin in entry_points(group="openstamp.cli"):
        try:
            plugin.load()(app)
        except ImportError as err:  # a plugin whose dependencies are not installed
            logging.getLogger(__name__).debug("openstamp.cli plugin %s not loaded: %s", plugin.name, err)
    return app


def show_version(value: bool) -> None:
    if value:
        from openstamp import __version__

        typer.echo(f"openstamp {__version__}")
        raise typer.Exit()


def main_options(
    version: bool = typer.Option(
        False, "--version", callback=show_version, is_eager=True, help="print the version and exit"
    ),
) -> None:
    """Watermark open-weight language models inside their weights, and detect the watermark."""


@functools.cache
def get_app() -> typer.Typer:
    """The command, built on first use: a plugin's modules may import ``openstamp.cli.common`` (and so this
    package) while they load, so the plugins are loaded only once this package is whole."""
    return build_app()


def __getattr__(name: str):
    if name == "app":  # ``from openstamp.cli import app``
        return get_app()
    raise AttributeError(f"module 'openstamp.cli' has no attribute {name!r}")


def main() -> None:
    get_app()()
