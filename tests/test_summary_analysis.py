"""The paper's analyses as the README's sections (benchmarks/summary_analysis.py): each table laid out from its
results, cell by cell, and only the analyses whose results are kept rendered."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

GAMMAS, LISTS, DELTAS = (0.1, 0.25), (16, 64, 254), (0.35, 0.5, 1.0)


@pytest.fixture
def an(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "benchmarks"))
    import summary_analysis

    return summary_analysis


def cells(rows: list[str], first: str) -> list[list[str]]:
    """The cells of the table whose header starts with ``first``, one list per row."""
    start = next(i for i, line in enumerate(rows) if line.startswith(first))
    end = rows.index("", start) if "" in rows[start:] else len(rows)
    return [line[2:-2].split(" | ") for line in rows[start + 2 : end]]


def settings() -> dict:
    return {"n": 32, "tokens": 64, "fpr": 0.01, "prompt_tokens": 50}


def lists_result(rng) -> dict:
    rows = [
        {"lists": n, "gamma": g, "overlap": float(rng.uniform()), "jaccard": float(rng.uniform()), "states": 100}
        | {"selector_heldout_accuracy": float(rng.uniform()) if g == GAMMAS[0] else -1.0}  # read at the first gamma
        for n in LISTS
        for g in GAMMAS
    ]
    return {"rows": rows, "states": {"train": 900, "heldout": 100}, "pairs": 500}


def prompt_result(rng, positions: int = 64) -> dict:
    rows = []
    for text in ("watermarked", "human"):
        row = {"run": "openstamp@1/s0", "text": text, "correlation": float(rng.uniform(0.5, 1))}
        row |= {"mean_score_with_prompt": float(rng.normal()), "mean_score_without": float(rng.normal())}
        row |= {"flagged_with_prompt": float(rng.uniform()), "flagged_without": float(rng.uniform())}
        rows.append(row | {"gap_by_position": rng.uniform(0, 2, positions).tolist()})
    return {"eval": "runs/eval", "n": 32, "rows": rows}


def llr_result(rng) -> dict:
    def figures():
        return {k: float(rng.uniform()) for k in ("auroc", "tpr_at_1pct_fpr", "tpr_at_1pct_fpr_vs_unwatermarked")}

    rows = [{"run": f"{m}@1/s0", "method": m, "native": figures(), "llr": figures()} for m in ("unremovable", "gm")]
    return {"eval": "runs/eval-baselines", "n": 64, "rows": rows}


def gamma_delta_result(rng) -> dict:
    rows = [
        {"gamma": g, "delta": d, "tpr": float(rng.uniform()), "own_ppl_change": float(rng.uniform(0, 0.5))}
        for g in GAMMAS
        for d in DELTAS
    ]
    return {"settings": settings(), "own_ppl_original": 21.7, "rows": rows}


def low_strength_result(rng, deltas: tuple | None = (0.35, 0.5)) -> dict:
    rows = []
    for delta in deltas or (0.5,):
        for variant, acc in (("the key's own S", 0.4), ("L = 254, shrinkage 4", None)):
            tpr = float(rng.uniform())
            row = {"variant": variant, "delta": delta, "lists": 254, "selector_heldout_accuracy": acc, "tpr": tpr}
            rows.append(row | {"tpr_ci": [tpr / 2, (1 + tpr) / 2], "own_ppl_change": float(rng.uniform(0, 0.3))})
    return {"settings": settings(), "rows": rows} | ({"deltas": list(deltas)} if deltas else {"delta": 0.5})


def weighting_result(rng) -> dict:
    def test():
        tpr = float(rng.uniform())
        flagged = {"human_flagged": float(rng.uniform(0, 0.1)), "original_flagged": float(rng.uniform(0, 0.1))}
        return {"tpr": tpr, "tpr_ci": [tpr / 2, (1 + tpr) / 2], "auroc": float(rng.uniform(0.5, 1))} | flagged

    rows = [
        {"delta": d, "detector": test(), "z_unit": test(), "z_optimal": test(), "mean_llr": {"auroc": 0.9}}
        for d in DELTAS[:2]
    ]
    return {"settings": settings(), "rows": rows}


def test_lists_lays_out_overlap_and_jaccard_per_list_count_and_gamma(an):
    r = lists_result(np.random.default_rng(0))
    rows = cells(an.lists(r), "| L |")
    at = {(row["lists"], row["gamma"]): row for row in r["rows"]}
    assert [int(row[0]) for row in rows] == list(LISTS)
    for row, n in zip(rows, LISTS, strict=True):
        expected = [f"{at[n, g][k]:.3f}" for g in GAMMAS for k in ("overlap", "jaccard")]
        assert row[1:-1] == expected
        assert row[-1] == f"{at[n, GAMMAS[0]]['selector_heldout_accuracy']:.3f}"


@pytest.mark.parametrize("positions", [64, 4])
def test_prompt_gaps_are_the_first_token_and_the_mean_over_the_last_ten(an, positions):
    r = prompt_result(np.random.default_rng(1), positions)
    rows = cells(an.prompt(r), "| run |")
    assert [row[1] for row in rows] == ["watermarked", "human"]
    for row, data in zip(rows, r["rows"], strict=True):
        gap = data["gap_by_position"]
        assert row[-2] == f"{gap[0]:.3f}"
        assert row[-1] == f"{np.mean(gap[-10:]):.3f}"  # fewer than 10 positions: all of them
        assert row[2:4] == [f"{data['mean_score_with_prompt']:.3f}", f"{data['mean_score_without']:.3f}"]


def test_llr_sets_each_baselines_native_detector_beside_the_llr(an):
    r = llr_result(np.random.default_rng(2))
    rows = cells(an.llr(r), "| run |")
    for row, data in zip(rows, r["rows"], strict=True):
        n, m = data["native"], data["llr"]
        assert row[0] == data["run"]
        assert [float(x) for x in row[1:]] == pytest.approx(
            [n["auroc"], m["auroc"], n["tpr_at_1pct_fpr"], m["tpr_at_1pct_fpr"]]
            + [n["tpr_at_1pct_fpr_vs_unwatermarked"], m["tpr_at_1pct_fpr_vs_unwatermarked"]],
            abs=5e-4,
        )
        # the direction the section shows: the LLR column is above the native one exactly where the data says so
        assert (float(row[2]) > float(row[1])) is (m["auroc"] > n["auroc"])


def test_gamma_delta_puts_each_gamma_in_a_row_and_each_delta_in_a_column(an):
    r = gamma_delta_result(np.random.default_rng(3))
    out = an.gamma_delta(r)
    assert out[2] == "| gamma | " + " | ".join(f"delta {d:g}" for d in DELTAS) + " |"
    rows = cells(out, "| gamma |")
    at = {(row["gamma"], row["delta"]): row for row in r["rows"]}
    assert [float(row[0]) for row in rows] == list(GAMMAS)
    for row, g in zip(rows, GAMMAS, strict=True):
        assert row[1:] == [f"{at[g, d]['tpr']:.2f} / {at[g, d]['own_ppl_change']:+.0%}" for d in DELTAS]


@pytest.mark.parametrize("deltas", [(0.35, 0.5), None])
def test_low_strength_names_its_deltas_and_dashes_a_variant_without_a_held_out_accuracy(an, deltas):
    r = low_strength_result(np.random.default_rng(4), deltas)
    out = an.low_strength(r, "my command")
    assert out[0].startswith("What helps at low strength (`my command`")
    assert f"delta {', '.join(f'{d:g}' for d in deltas or (0.5,))}, 32 held-out prompts" in out[0]
    rows = cells(out, "| variant |")
    for row, data in zip(rows, r["rows"], strict=True):
        acc = data["selector_heldout_accuracy"]
        assert row[3] == ("-" if acc is None else f"{acc:.3f}")
        low, high = data["tpr_ci"]
        assert row[4] == f"{data['tpr']:.3f} [{low:.2f}, {high:.2f}]"
        assert row[5] == f"{data['own_ppl_change']:+.1%}"


def test_low_strength_without_a_delta_names_its_rows_deltas(an):
    r = low_strength_result(np.random.default_rng(4), (0.35, 0.5))
    del r["deltas"]
    assert "delta 0.35, 0.5, 32 held-out prompts" in an.low_strength(r)[0]


def test_weighting_shows_each_test_and_the_aurocs(an):
    r = weighting_result(np.random.default_rng(5))
    rows = cells(an.weighting(r), "| delta |")
    for row, data in zip(rows, r["rows"], strict=True):
        for shown, name in zip(row[1:4], ("detector", "z_unit", "z_optimal"), strict=True):
            c = data[name]
            assert shown == (
                f"{c['tpr']:.3f} [{c['tpr_ci'][0]:.2f}, {c['tpr_ci'][1]:.2f}] / "
                f"{c['human_flagged']:.3f} / {c['original_flagged']:.3f}"
            )
        assert row[4] == " / ".join(f"{data[k]['auroc']:.3f}" for k in ("mean_llr", "z_unit", "z_optimal"))


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_analyses_renders_only_the_kept_results_in_order_with_their_plots(an, tmp_path):
    assert an.analyses(tmp_path) == []
    rng = np.random.default_rng(6)
    write(tmp_path / "analysis" / "lists" / "results.json", lists_result(rng))
    write(tmp_path / "low_strength_shrinkage.json", low_strength_result(rng))
    out = an.analyses(tmp_path)
    starts = [line.split(" (")[0] for line in out if line and not line.startswith(("|", "!"))]
    assert starts == ["Green lists against L", "What helps at low strength"]
    low = next(line for line in out if line.startswith("What helps at low strength"))
    assert f"(`{an.SHRINKAGE}`" in low  # the shrinkage run names its own command
    assert not any(line.startswith("![") for line in out)

    (tmp_path / "analysis" / "lists" / "lists.png").write_bytes(b"")
    write(tmp_path / "analysis" / "gamma-delta" / "results.json", gamma_delta_result(rng))
    write(tmp_path / "analysis" / "prompt" / "results.json", prompt_result(rng))
    write(tmp_path / "analysis" / "llr" / "results.json", llr_result(rng))
    write(tmp_path / "low_strength.json", low_strength_result(rng))
    write(tmp_path / "weighting.json", weighting_result(rng))
    out = an.analyses(tmp_path)
    starts = [line.split(" (")[0] for line in out if line and not line.startswith(("|", "!"))]
    assert starts == [
        "Green lists against L",
        "Prompt independence",
        "The LLR detector on the weight-level baselines",
        "The effect of gamma and delta",
        "What helps at low strength",
        "What helps at low strength",
        "Per-token weighting",
    ]
    plots = [line for line in out if line.startswith("![")]
    assert plots == ["![lists.png](benchmarks/results/analysis/lists/lists.png)"]
    assert out.index(plots[0]) < out.index(next(line for line in out if line.startswith("Prompt independence")))
    assert out[-1] == ""  # each section ends with a blank line
