"""docs/results.md stays short and answers by question: at most 400 lines, one provenance line per section; every
relative link of the README and docs/ (notebook included) resolves; every benchmark's output is rendered."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS_MD = ROOT / "docs" / "results.md"
BENCHMARKS = ROOT / "benchmarks"
MAX_LINES = 400
# Provenance: `command`; commit(s) `abc1234`; data `benchmarks/results/...`
PROVENANCE = re.compile(r"^Provenance: `[^`]+`.*\bcommits? `[0-9a-f]{7,40}`.*\bdata `benchmarks/results/[^`]+`", re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def sections(text: str) -> dict[str, str]:
    """Each ``## `` heading of a page and the text up to the next one."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_results_is_at_most_400_lines():
    n = len(RESULTS_MD.read_text(encoding="utf-8").splitlines())
    assert n <= MAX_LINES, f"docs/results.md has {n} lines; move studies to docs/notebook/"


def test_every_section_has_one_provenance_line():
    found = sections(RESULTS_MD.read_text(encoding="utf-8"))
    assert len(found) >= 8  # one section per question
    bad = {title: len(PROVENANCE.findall(body)) for title, body in found.items()}
    assert all(n == 1 for n in bad.values()), f"sections without exactly one provenance line: {bad}"
    assert "Commit:" not in RESULTS_MD.read_text(encoding="utf-8")  # the old per-block format is gone


def test_a_section_without_provenance_is_caught():
    page = "# R\n\n## Q one?\n\nAnswer.\n\nProvenance: `x`; commit `abcdef1`; data `benchmarks/results/a.json`\n"
    assert all(len(PROVENANCE.findall(b)) == 1 for b in sections(page).values())
    page += "\n## Q two?\n\nAnswer, no source.\n"
    assert [len(PROVENANCE.findall(b)) for b in sections(page).values()] == [1, 0]


def dead_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.DOTALL)
    dead = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor on the same page
        if not (page.parent / target.split("#")[0]).exists():
            dead.append(target)
    return dead


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_resolve(page):
    assert not dead_links(page), f"{page.relative_to(ROOT)} links to missing files: {dead_links(page)}"


def test_a_dead_link_is_caught(tmp_path):
    (tmp_path / "there.md").write_text("x")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md) [web](https://example.org) [gone](RESULTS.md#x)\n```\n[code](nope.md)\n```\n")
    assert dead_links(page) == ["RESULTS.md#x"]


def write_result_names(path: Path) -> list[str]:
    """The names a script passes to ``write_result``: a string literal, or the default of ``--name``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "write_result" and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.append(first.value)
            else:  # args.name: the default of add_argument("--name", default=...)
                names += [
                    kw.value.value
                    for call in ast.walk(tree)
                    if isinstance(call, ast.Call) and call.args and getattr(call.args[0], "value", None) == "--name"
                    for kw in call.keywords
                    if kw.arg == "default" and isinstance(kw.value, ast.Constant)
                ]
    return names


def renderer_source() -> str:
    """benchmarks/render.py and the table modules it imports from benchmarks/."""
    render = (BENCHMARKS / "render.py").read_text(encoding="utf-8")
    modules = re.findall(r"^from (\w+) import", render, re.M)
    return render + "".join(
        (BENCHMARKS / f"{m}.py").read_text(encoding="utf-8") for m in modules if (BENCHMARKS / f"{m}.py").exists()
    )


def test_every_benchmark_output_is_rendered():
    scripts = [p for p in BENCHMARKS.rglob("*.py") if "write_result(" in p.read_text(encoding="utf-8")]
    names = {name: p.relative_to(ROOT).as_posix() for p in scripts for name in write_result_names(p)}
    assert len(names) >= 10  # the parse found the scripts' outputs
    source = renderer_source()
    unrendered = {n: p for n, p in names.items() if f'"{n}' not in source}
    assert not unrendered, f"outputs no table of render.py reads (render them or delete the script): {unrendered}"
