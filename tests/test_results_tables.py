"""docs/results.md's tables are what benchmarks/render.py makes of the committed JSON under benchmarks/results/, and
a changed result changes its table, so the check can fail."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
RESULTS = ROOT / "benchmarks" / "results"


@pytest.fixture(scope="module")
def render():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import render

        yield render
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_docs_tables_match_the_committed_json(render):
    new, changed, problems = render.stale(ROOT / "docs" / "results.md")
    assert problems == [] and changed == []
    names = [m.group(2) for m in render.BLOCK.finditer(new)]
    assert len(names) == len(set(names)) > 10  # every table once
    assert set(names) <= set(render.TABLES)
    assert all(m.group(3).startswith("| ") for m in render.BLOCK.finditer(new))  # every block filled


def test_headline_figures_are_rendered_from_the_sweep(render):
    rows = {row.split(" | ")[0][2:]: row for row in render.glance(RESULTS)[2:]}
    assert rows["openstamp-projected (0.1.0's default)"].endswith(" | 0.419 | +42.8% |")
    default = [row for name, row in rows.items() if name.startswith("**the default key**")]
    assert len(default) == 1  # the default profile's kept sweep variant, named once
    assert rows["kgw-llr"] == "| kgw-llr | 0.769 | +17.5% |"
    assert render.budget(RESULTS)[2].startswith("| second-order ceiling | 1.00 | +13.1% | 83 |")


def test_a_changed_result_makes_its_table_stale(render, tmp_path):
    shutil.copy(RESULTS / "multikey_fpr.json", tmp_path / "multikey_fpr.json")
    page = tmp_path / "page.md"
    page.write_text("Keys:\n<!-- table: multikey -->\n<!-- /table -->\nEnd.\n", encoding="utf-8")
    filled, changed, problems = render.stale(page, tmp_path)
    assert changed == ["multikey"] and problems == []  # the empty block was stale
    page.write_text(filled, encoding="utf-8")
    assert render.stale(page, tmp_path)[1:] == ([], [])
    data = json.loads((tmp_path / "multikey_fpr.json").read_text())
    data["family_wise_fpr_holm"].update(rate=0.5, ci95=[0.4, 0.6])
    (tmp_path / "multikey_fpr.json").write_text(json.dumps(data))
    new, changed, _ = render.stale(page, tmp_path)
    assert changed == ["multikey"] and "| any of 5 keys, Holm-adjusted | 0.500 [0.400, 0.600] |" in new
    assert new.startswith("Keys:\n") and new.endswith("<!-- /table -->\nEnd.\n")  # the prose is left alone


def test_missing_data_and_markers_are_named(render, tmp_path):
    page = tmp_path / "page.md"
    page.write_text("<!-- table: multikey -->\n<!-- /table -->\n<!-- table: nonsense -->\n<!-- /table -->\n")
    _, _, problems = render.stale(page, tmp_path, required=("glance",))
    assert [p.split(":")[0] for p in problems] == ["multikey", "nonsense", "glance"]
    assert "no <!-- table: glance --> block" in problems[-1]


def test_check_exits_1_on_a_stale_page(render, tmp_path, monkeypatch):
    page = tmp_path / "results.md"
    page.write_text("<!-- table: multikey -->\n| stale |\n<!-- /table -->\n", encoding="utf-8")
    readme = tmp_path / "README.md"
    readme.write_text("# Tool\n", encoding="utf-8")
    monkeypatch.setattr(render, "ROOT", tmp_path)
    monkeypatch.setattr(render, "PAGES", (page, readme))
    monkeypatch.setattr(sys, "argv", ["render.py", "--check"])
    with pytest.raises(SystemExit) as stop:
        render.main()
    assert stop.value.code == 1 and "| stale |" in page.read_text()  # --check writes nothing
    monkeypatch.setattr(sys, "argv", ["render.py"])
    render.main()
    holm = render.multikey(RESULTS)[2]  # the kept file's Holm row, as the registered table renders it
    assert holm.startswith("| any of 5 keys, Holm-adjusted |")
    assert holm in page.read_text() and readme.read_text() == "# Tool\n"


def test_render_check_runs_as_a_script():
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "render.py"), "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert run.returncode == 0, run.stderr[-2000:]


def test_no_page_names_a_method_as_it_was_recorded_before_0_3(render):
    """Results keep the names they were recorded with; pages show the names a reader knows (``shown``)."""
    from common import shown

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert not [p.name for p in pages if "nosem" in p.read_text(encoding="utf-8")]
    assert shown("openstamp-nosem (shrinkage 4, centred)") == "openstamp"
    assert shown("openstamp") == "openstamp-projected" and shown("kgw-llr") == "kgw-llr"
    assert shown("openstamp-nosem") == "openstamp (shrinkage 0, uncentred)"


def test_every_table_off_the_default_key_is_marked_historical(render):
    """A table measured on another profile or package than today's default key says so: its block is marked."""
    page = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert render.unmarked_history(page) == []
    assert "<!-- historical -->" in page  # most kept tables predate the default (the check has work to do)
    # the check fails on a table of 0.1.0's default profile without the mark, and its header names both
    old = "Per key:\n<!-- table: fpr_per_key -->\n<!-- /table -->\n"
    assert render.unmarked_history(old) == ["fpr_per_key"]
    rendered, problems = render.render_page(old)
    assert problems == [] and "openstamp 0.1.0; profile default of 0.1.0" in rendered
    marked = old.replace("fpr_per_key -->", "fpr_per_key --> <!-- historical -->")
    assert render.unmarked_history(marked) == [] and "; historical)" in render.render_page(marked)[0]
