"""The README and docs/ stay true: the README's size and markers, every command of docs/usage.md (run with
--help, its options checked against the command's), every relative link, and every repository path they quote."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from openstamp.cli import app

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
TEST_COMMAND = "<!-- test-command -->\n```bash\nbash scripts/setup.sh && .venv/bin/python -m pytest -q\n```\n"
# benchmarks/render.py fills the table between (historical: its rows span two package versions)
GLANCE = ("<!-- table: glance --> <!-- historical -->\n", "<!-- /table -->\n")
SHELL_OPERATORS = {"|", "||", "&&", ";", ">", ">>", "<", "2>", "&"}


def fenced_lines(text: str) -> list[str]:
    """The lines inside fenced code blocks, with backslash continuations joined."""
    lines, inside, pending = [], False, ""
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        if not inside:
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return lines


def openstamp_commands(text: str) -> list[list[str]]:
    """Each `openstamp ...` line of the fenced blocks, as words after `openstamp`, up to a shell operator."""
    commands = []
    for line in fenced_lines(text):
        words = shlex.split(line, comments=True)
        if not words or Path(words[0]).name != "openstamp":
            continue
        words = words[1:]
        cut = next((i for i, word in enumerate(words) if word in SHELL_OPERATORS), len(words))
        commands.append(words[:cut])
    return commands


def subcommand_path(words: list[str]) -> list[str]:
    """The words before the first option: the subcommand path (and any positional arguments)."""
    return words[: next((i for i, word in enumerate(words) if word.startswith("-")), len(words))]


def is_group(command) -> bool:
    return hasattr(command, "list_commands")  # typer ships its own click: no isinstance against click.Group


def resolve(words: list[str]):
    """The (click) command that `openstamp WORDS` runs: groups walked while a word names a subcommand."""
    command = typer.main.get_command(app)
    ctx = command.context_class(command)
    for word in subcommand_path(words):
        if not is_group(command):
            break
        sub = command.get_command(ctx, word)
        assert sub is not None, f"openstamp has no command {' '.join(words[: words.index(word) + 1])!r}"
        command, ctx = sub, sub.context_class(sub, parent=ctx)
    return command


USAGE_COMMANDS = openstamp_commands((DOCS / "usage.md").read_text())


def test_readme_is_short_and_keeps_its_markers():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert TEST_COMMAND in text  # .ci/run reads this block
    assert "bash scripts/setup.sh && .venv/bin/openstamp demo" in text
    start, end = (text.count(marker) for marker in GLANCE)
    assert start == end == 1 and text.index(GLANCE[0]) < text.index(GLANCE[1])
    assert "](docs/results.md)" in text


def test_usage_documents_every_command():
    """Every subcommand the `openstamp` command has appears in docs/usage.md."""
    documented = {tuple(subcommand_path(words)[:2]) for words in USAGE_COMMANDS}
    documented |= {path[:1] for path in documented}
    root = typer.main.get_command(app)
    ctx = root.context_class(root)
    for name in root.list_commands(ctx):
        command = root.get_command(ctx, name)
        subs = command.list_commands(ctx) if is_group(command) else [None]
        for sub in subs:
            path = (name,) if sub is None else (name, sub)
            assert path in documented, f"docs/usage.md shows no `openstamp {' '.join(path)}`"


def test_usage_has_commands():
    assert len(USAGE_COMMANDS) >= 20


@pytest.mark.parametrize("words", USAGE_COMMANDS, ids=[" ".join(w)[:60] for w in USAGE_COMMANDS])
def test_usage_command_runs_with_help(words):
    """`openstamp PATH --help` exits 0, and every option the line uses is one of the command's."""
    path = subcommand_path(words)
    result = CliRunner().invoke(app, [*path, "--help"])
    assert result.exit_code == 0, result.output
    command = resolve(words)
    known = {opt for param in command.params for opt in (*param.opts, *param.secondary_opts)}
    used = {word.split("=")[0] for word in words if word.startswith("--")}
    assert used <= known, f"unknown options {sorted(used - known)} for openstamp {' '.join(path)}"


def test_a_command_that_does_not_exist_fails():
    """The check above would catch a documented command that is gone."""
    assert CliRunner().invoke(app, ["no-such-command", "--help"]).exit_code != 0
    with pytest.raises(AssertionError):
        resolve(["attack", "no-such-attack"])


LINK = re.compile(r"\]\(([^)\s]+)\)")
PAGES = [README, *sorted(DOCS.glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_exist(page):
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.DOTALL)  # code blocks hold no links
    missing = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        path = target.split("#")[0]
        if not (page.parent / path).exists():
            missing.append(target)
    assert not missing, f"{page.name} links to missing files: {missing}"


QUOTED_PATH = re.compile(r"`((?:src|tests|benchmarks|scripts)/[^`\s]*)`")


def path_exists(path: str) -> bool:
    """The path is there, or a pattern (`a/*.json`, `runs/<stage>.log`) matches something."""
    pattern = re.sub(r"<[^>]*>", "*", path.split("::")[0])
    if any(char in pattern for char in "*?["):
        return any(ROOT.glob(pattern))
    return (ROOT / pattern).exists()


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_quoted_repository_paths_exist(page):
    """A path such as `benchmarks/speed/ray_detect.py` in running text names a file that is there."""
    missing = [path for path in QUOTED_PATH.findall(page.read_text()) if not path_exists(path)]
    assert not missing, f"{page.name} names missing paths: {missing}"
