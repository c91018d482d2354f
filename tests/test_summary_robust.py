"""The at-cost robustness summary (benchmarks/summary_robust.py): one section per cost, each pairing its attacks with
the runs of the eval they attacked."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

RUNS = {  # run -> (method, own PPL change, how far its scores sit above human text)
    "openstamp@0.5/s0": ("openstamp", 0.13, 1.0),
    "openstamp@0.75/s0": ("openstamp", 0.31, 2.0),
    "unremovable@0.6/s0": ("unremovable", 0.14, 3.0),
    "unremovable@0.8/s0": ("unremovable", 0.28, 4.0),
}


@pytest.fixture
def robust(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "benchmarks"))
    import summary_robust

    return summary_robust


def metrics(scores: np.ndarray, human: np.ndarray) -> dict:
    tpr = float(np.mean(scores > np.quantile(human, 0.99)))
    return {"tpr_at_1pct_fpr": tpr, "tpr_at_1pct_fpr_ci": [tpr / 2, (1 + tpr) / 2], "flagged_at_p_0.01": tpr}


def write(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def keep(root: Path, created: str = "2026-11-27T00:00:00") -> None:
    """An eval of seed 0 kept under sweep/rerun/s0, and token edits of its runs at +30% and at +12%."""
    rng, n = np.random.default_rng(0), 100
    human = rng.normal(0, 1, n)
    runs, edited = [], {}
    for run, (method, cost, shift) in RUNS.items():
        scores = rng.normal(shift, 1, n)
        runs.append(
            {
                "run": run,
                "method": method,
                "seed": 0,
                "metrics": {**metrics(scores, human), "own_ppl_change": cost},
                "scores": {"watermarked": scores.tolist(), "human": human.tolist()},
            }
        )
        after = scores - 1
        edited[run] = {**metrics(after, human), "scores": after.tolist()}
    config = {"seeds": [0], "n": n, "new_tokens": 64}
    write(root / "sweep" / "rerun" / "s0" / "results.json", {"created": created, "config": config, "runs": runs})
    for cost, picked in ((0.3, ["openstamp@0.75/s0", "unremovable@0.8/s0"]), (0.12, ["openstamp@0.5/s0"])):
        write(
            root / "robust_cost" / f"edit0.1-cost{cost}.json",
            {
                "attack": "edit",
                "eval": "runs/sweep-s0",
                "eval_created": created,
                "settings": {"delete": 0.1, "substitute": 0.1, "at_cost": cost},
                "runs": [{"run": run, "seed": 0, "after": edited[run]} for run in picked],
            },
        )


def test_one_section_per_cost_the_costliest_first(robust, tmp_path):
    keep(tmp_path)
    text = "\n".join(robust.robust_at_cost(tmp_path))
    first, second = text.split("Robustness at equal cost (")[1:]
    assert "`bash benchmarks/reference_runs.sh sweep robust_cost`" in first and "nearest +30%" in first
    assert "`ROBUST_COST=0.12 bash benchmarks/reference_runs.sh sweep robust_cost`" in second
    assert "nearest +12%" in second
    rows = [
        {line.split(" | ")[0] for line in part.splitlines() if line.startswith("| ") and "@" in line}
        for part in (first, second)
    ]
    assert rows == [{"| openstamp@0.75/s0", "| unremovable@0.8/s0"}, {"| openstamp@0.5/s0"}]
    assert "below unremovable" in first  # its scores sit 2 standard deviations above OpenStamp's, on 100 texts each


def test_results_that_attacked_two_evals_of_one_seed_are_refused(robust, tmp_path):
    keep(tmp_path)
    attack = json.loads((tmp_path / "robust_cost" / "edit0.1-cost0.3.json").read_text())
    other = json.loads((tmp_path / "sweep" / "rerun" / "s0" / "results.json").read_text())
    write(tmp_path / "sweep" / "seeds" / "s0" / "results.json", {**other, "created": "2026-11-01T00:00:00"})
    write(tmp_path / "robust_cost" / "edit0.25-cost0.3.json", {**attack, "eval_created": "2026-11-01T00:00:00"})
    with pytest.raises(ValueError, match="run them again on one eval"):
        robust.robust_at_cost(tmp_path)


def test_pruned_bias_names_the_cause_only_where_every_figure_shows_it(robust):
    def result(gains: list[float]) -> dict:
        rows = [
            {"sparsity": s, "mean_entropy": 2.0 + s, "mean_gain": g, "mean_hidden_cosine": 1.0 - s}
            for s, g in zip((0.0, 0.3, 0.5), gains, strict=True)
        ]
        quartiles = [
            {"entropy_from": q, "entropy_to": q + 1, "mean_gain": 0.1 * (q + 1), "positions": 10} for q in range(4)
        ]
        settings = {"model": "m", "windows": 4, "seq_len": 16, "seed": 0, "epsilon": 0.6}
        return {"settings": settings, "rows": rows, "unpruned_by_entropy": quartiles}

    shown = robust.pruned_bias(result([0.2, 0.3, 0.4]))[0]
    assert "gains more from Unremovable's fixed bias" in shown
    assert "unpruned 0.2000, 30% 0.3000, 50% 0.4000" in shown
    assert "unpruned 1.000, 30% 0.700, 50% 0.500" in shown
    assert "stays unexplained" in robust.pruned_bias(result([0.2, 0.1, 0.4]))[0]
