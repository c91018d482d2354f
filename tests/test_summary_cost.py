"""What a strength costs and buys (benchmarks/summary_cost.py): the strength `openstamp tune` chose and whether it
meets the issue's target, and the cost sweep's table read off each run's own figures."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

DELTAS = (0.25, 0.5, 1.0, 2.0)
TASKS = ("cloze", "lastword")


@pytest.fixture
def cost(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "benchmarks"))
    import summary_cost

    monkeypatch.setattr(summary_cost, "RESULTS", tmp_path)  # the plots it looks for: none unless a test keeps one
    return summary_cost


def table(rows: list[str], first: str) -> list[list[str]]:
    """The cells of the table whose header starts with ``first``, one list per row."""
    start = next(i for i, line in enumerate(rows) if line.startswith(first))
    end = rows.index("", start) if "" in rows[start:] else len(rows)
    return [line[2:-2].split(" | ") for line in rows[start + 2 : end]]


def tune_result(chosen: int, reached: bool = True, shrinkage: float | None = None, seed: int = 0) -> dict:
    """`openstamp tune`'s tune.json: each probed delta's TPR and own perplexity; the chosen one is probe ``chosen``."""
    rng = np.random.default_rng(seed)
    original = float(rng.uniform(20, 25))
    probes = []
    for i, delta in enumerate(DELTAS):
        tpr, change = min(1.0, 0.2 + 0.3 * i + float(rng.uniform(0, 0.05))), 0.03 * 2**i + float(rng.uniform(0, 0.01))
        probes.append(
            {
                "delta": delta,
                "tpr": tpr,
                "tpr_ci": [max(0.0, tpr - 0.15), min(1.0, tpr + 0.1)],
                "own_ppl": original * (1 + change),
                "own_ppl_change": change,
            }
        )
    pick = probes[chosen]
    settings = {"target_tpr": 0.95, "tokens": 64, "fpr": 0.01, "n": 32, "prompt_tokens": 50}
    r = {"settings": settings, "reached": reached, "delta": pick["delta"], "own_ppl_original": original}
    r |= {"own_ppl_change": pick["own_ppl_change"], "tpr": pick["tpr"], "probes": probes}
    return r | ({"selector_shrinkage": shrinkage} if shrinkage is not None else {})


def test_tune_marks_the_chosen_delta_and_shows_each_probes_figures(cost):
    r = tune_result(chosen=2)
    rows = table(cost.tune(r), "| delta |")
    assert [row[0].endswith("(chosen)") for row in rows] == [p["delta"] == r["delta"] for p in r["probes"]]
    for row, p in zip(rows, r["probes"], strict=True):
        assert float(row[0].split()[0]) == pytest.approx(p["delta"])
        assert row[1] == f"{p['tpr']:.3f} [{p['tpr_ci'][0]:.3f}, {p['tpr_ci'][1]:.3f}]"
        assert float(row[2]) == pytest.approx(p["own_ppl"], abs=0.005)
        assert float(row[3].rstrip("%")) == pytest.approx(100 * p["own_ppl_change"], abs=0.05)
    assert f"({r['own_ppl_original']:.2f} unwatermarked)" in cost.tune(r)[0]


@pytest.mark.parametrize("reached", [True, False])
@pytest.mark.parametrize("chosen", [0, 2])  # probe 0 costs about +3% own perplexity, probe 2 about +12%
def test_tune_meets_the_target_only_when_it_reaches_the_tpr_within_ten_percent(cost, chosen, reached):
    r = tune_result(chosen, reached)
    within = r["own_ppl_change"] <= 0.10
    assert within is (chosen == 0)
    verdict = cost.tune(r)[-1]
    assert verdict.startswith(f"delta {r['delta']:.3g} {'reaches' if reached else 'does not reach'} TPR 0.95")
    assert f"{r['own_ppl_change']:+.1%}" in verdict
    assert ("**not met**" in verdict) is not (reached and within)


def test_tune_at_exactly_ten_percent_meets_the_target(cost):
    r = tune_result(0) | {"own_ppl_change": 0.10}
    assert "**not met**" not in cost.tune(r)[-1]


@pytest.mark.parametrize("shrinkage", [None, 0.0, 4.0])
def test_tune_names_the_shrinkage_stage_and_option_only_when_a_shrinkage_was_set(cost, shrinkage):
    intro = cost.tune(tune_result(1, shrinkage=shrinkage))[0]
    shrunk = bool(shrinkage)
    assert ("reference_runs.sh tune_shrinkage`" in intro) is shrunk
    assert ("reference_runs.sh tune`" in intro) is not shrunk
    assert (f"--set selector.shrinkage={shrinkage:g}" in intro) if shrunk else ("--set" not in intro)


def sweep_result(seed: int = 0, lengths=(16, 32, 64), missing: dict | None = None) -> dict:
    """The cost sweep's results.json: per delta a run with its own length curve, own PPL change and downstream
    changes; ``missing``: run index -> a length or task that run lacks."""
    rng = np.random.default_rng(seed)
    missing = missing or {}
    runs, curve = [], []
    for i, delta in enumerate(DELTAS):
        rows = []
        for tokens in lengths:
            tpr = float(min(1.0, delta * tokens / 64 + rng.uniform(0, 0.1)))
            row = {"tokens": tokens, "scored_tokens": float(tokens), "tpr_at_1pct_fpr": tpr}
            rows.append(row | {"flagged_at_p_0.01": float(tpr * rng.uniform(0.5, 1))})
        change = 0.05 * delta + float(rng.uniform(0, 0.02))
        downstream = {}
        for task in TASKS:
            d = float(rng.normal(0, 0.02))
            downstream[task] = {"acc": 0.5 + d, "change": d, "ci": [d - 0.03, d + 0.03], "n": 100}
        metrics = {"own_ppl_change": change, "own_ppl_change_ci": [change - 0.01, change + 0.012]}
        metrics |= {"tpr_at_1pct_fpr": rows[-1]["tpr_at_1pct_fpr"] if rows else 0.0, "downstream": downstream}
        rows = [row for row in rows if row["tokens"] != missing.get(i)]
        downstream.pop(missing.get(i), None)
        runs.append({"method": "openstamp", "strength": delta, "seed": 0, "metrics": metrics, "length_curve": rows})
        curve += [row | {"method": "openstamp", "strength": delta} for row in rows]
    config = {"methods": ["openstamp"], "grids": {"openstamp": list(DELTAS)}, "n": 32, "prompt_tokens": 50}
    config |= {"new_tokens": 64, "downstream_limit": 100, "seeds": [0]}
    return {
        "config": config,
        "references": {"human": {"own_ppl_original": 21.5}},
        "downstream_original": {task: 0.5 for task in TASKS},
        "length_curve": curve,
        "runs": runs,
    }


def test_strength_sweep_reads_each_cell_off_its_runs_own_figures(cost):
    r = sweep_result(missing={1: 16, 2: "cloze"})  # delta 0.5 was not scored at 16 tokens; delta 1 has no cloze
    out = cost.strength_sweep(r)
    header = next(line for line in out if line.startswith("| delta |"))
    assert [f"TPR {t} tok" in header for t in (16, 32, 64)] == [True] * 3 and "flagged p<=0.01 at 64 tok" in header
    rows = table(out, "| delta |")
    assert [float(row[0]) for row in rows] == list(DELTAS)
    for i, (row, run) in enumerate(zip(rows, r["runs"], strict=True)):
        at = {c["tokens"]: c for c in run["length_curve"]}
        expected = [f"{at[t]['tpr_at_1pct_fpr']:.3f}" if t in at else "-" for t in (16, 32, 64)]
        assert row[1:4] == expected
        assert row[4] == f"{at[64]['flagged_at_p_0.01']:.3f}"  # flagged at the longest length
        m = run["metrics"]
        low, high = m["own_ppl_change_ci"]
        assert row[5] == f"{m['own_ppl_change']:+.1%} [{low:+.1%}, {high:+.1%}]"
        for task, shown in zip(TASKS, row[6:], strict=True):
            d = m["downstream"].get(task)
            assert shown == ("-" if d is None else f"{d['change']:+.3f} [{d['ci'][0]:+.3f}, {d['ci'][1]:+.3f}]")
        assert (row[1] == "-") is (i == 1) and (row[6] == "-") is (i == 2)


def test_strength_sweep_without_a_length_curve_shows_dashes(cost):
    r = sweep_result(lengths=())
    out = cost.strength_sweep(r)
    assert "flagged p<=0.01 at - tok" in next(line for line in out if line.startswith("| delta |"))
    rows = table(out, "| delta |")
    assert len(rows) == len(DELTAS) and all(row[1] == "-" for row in rows)  # the flagged share: no length to read


def test_strength_sweep_shows_only_the_plots_kept(cost, tmp_path):
    r = sweep_result()
    assert not any("![" in line for line in cost.strength_sweep(r))
    (tmp_path / "cost").mkdir()
    (tmp_path / "cost" / "length_curve.png").write_bytes(b"")
    assert cost.strength_sweep(r)[-1] == "![length_curve.png](benchmarks/results/cost/length_curve.png)"


def test_cell_marks_a_length_the_detector_refused(cost):
    assert cost.cell(None) == "-"
    assert cost.cell(0.0) == "0.000" and cost.cell(0.12345) == "0.123"
