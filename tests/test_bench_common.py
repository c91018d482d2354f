"""benchmarks/common.py: a run directory records its settings and refuses a re-run with other ones."""

import pytest


@pytest.fixture
def common(benchmark):
    return benchmark("common")


def test_claim_run_resumes_with_free_fields_changed_and_refuses_others(common, tmp_path):
    out = tmp_path / "run"
    first = common.claim_run(out, {"out": out, "keys": 10, "sources": ["human"]}, free=("sources",))
    assert first == {"out": str(out), "keys": 10, "sources": ["human"]}  # JSON-able: the path as text
    again = common.claim_run(out, {"out": out, "keys": 10, "sources": ["human", "code"]}, free=("sources",))
    assert (out / "settings.json").read_text().count("code") == 1 and again["sources"] == ["human", "code"]
    with pytest.raises(SystemExit, match=r"holds a run with other settings \(keys\)"):
        common.claim_run(out, {"out": out, "keys": 5, "sources": ["human"]}, free=("sources",))
    with pytest.raises(SystemExit, match=r"other settings \(seed\)"):  # a field the first run did not have
        common.claim_run(out, {"out": out, "keys": 10, "sources": [], "seed": 1}, free=("sources",))


@pytest.mark.parametrize(("version", "shown"), [("0.1.0", "openstamp-projected"), ("0.3.1", "openstamp")])
def test_tables_rename_methods_only_in_results_recorded_before_the_renaming(common, version, shown):
    # before 0.3.0 the projected method was recorded as "openstamp"; since then "openstamp" is the default
    common.READ.clear()
    common.READ.append({"versions": {"openstamp": version}})
    try:
        rows = common.table(["method", "TPR"], [["openstamp", "0.9"]])
    finally:
        common.READ.clear()
    assert rows[2] == f"| {shown} | 0.9 |"
