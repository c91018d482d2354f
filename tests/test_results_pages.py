"""RESULTS.md and the README's results block are rendered from benchmarks/results/ by benchmarks/summary.py, never
edited by hand: a figure there that no kept result produces, or a result whose page was not rendered again, fails."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parent.parent


def test_pages_match_the_kept_results():
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "summary.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert "match" in run.stdout


def test_check_names_the_stale_page(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import summary

    readme, results = tmp_path / "README.md", tmp_path / "RESULTS.md"
    readme.write_text(f"# Tool\n{summary.START}\nold headline\n{summary.END}\nInstall it.\n", encoding="utf-8")
    monkeypatch.setattr(summary, "README", readme)
    monkeypatch.setattr(summary, "RESULTS_PAGE", results)
    assert summary.stale_pages("every figure\n", "old headline\n") == ["RESULTS.md"]
    results.write_text(summary.page("every figure\n"), encoding="utf-8")
    assert summary.stale_pages("every figure\n", "old headline\n") == []
    assert summary.stale_pages("every figure\n", "new headline\n") == ["README.md"]
    summary.write_pages("every figure\n", "new headline\n")
    assert readme.read_text(encoding="utf-8").endswith(f"{summary.START}\nnew headline\n{summary.END}\nInstall it.\n")
    assert summary.stale_pages("every figure\n", "new headline\n") == []
