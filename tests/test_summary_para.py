"""The paraphrase summary's verdicts (benchmarks/summary_para.py): which intervals redraw the threshold, and which
fall back to Newcombe's interval over texts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from openstamp.evaluation.metrics import rate_difference_ci


@pytest.fixture
def para(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "benchmarks"))
    import summary_para

    return summary_para


def run(method: str, paraphrases, human, kept_scores: bool = True) -> dict:
    """One key's paraphrase run as the attack writes it: the kept paraphrases' scores, and the human texts cut to
    their lengths."""
    paraphrases, human = np.asarray(paraphrases, dtype=float), np.asarray(human, dtype=float)
    threshold = np.quantile(human, 0.99)
    real = {
        "n": len(paraphrases),
        "tpr_at_1pct_fpr_after": float(np.mean(paraphrases > threshold)),
        "human_cut": {"tpr_at_1pct_fpr": float(np.mean(paraphrases > threshold))},
    }
    if kept_scores:
        real["scores"] = paraphrases.tolist()
        real["human_cut"]["scores"] = human.tolist()
    return {"method": method, "real": real}


def keys(method: str, shift: float, kept_scores: bool = True, n_keys: int = 3) -> list[dict]:
    rng = np.random.default_rng(len(method))
    return [run(method, rng.normal(shift, 1, 64), rng.normal(0, 1, 200), kept_scores) for _ in range(n_keys)]


def test_verdict_redraws_the_threshold_only_where_every_key_kept_its_scores(para):
    ours, other = keys("openstamp", 3.0), keys("kgw", 0.5)
    redraw = para._both(ours, other)
    assert redraw is not None and len(redraw[0]) == len(redraw[1]) == 3
    assert para._starred("at their lengths", redraw) == "at their lengths*"
    assert para._starred("at p <= 0.01", redraw) == "at p <= 0.01"
    gap, low, high = para._gap("at their lengths", (0, 1), (0, 1), redraw)
    assert low > 0 and low <= gap <= high  # a shift of 2.5 standard deviations is resolved

    older = ours[:2] + keys("openstamp", 3.0, kept_scores=False, n_keys=1)
    assert para._both(older, other) is None
    assert para._starred("at their lengths", None) == "at their lengths"
    counts = (150, 192), (40, 192)
    gap, low, high = para._gap("at their lengths", *counts, None)
    assert (low, high) == rate_difference_ci(*counts[0], *counts[1])
    assert gap == pytest.approx(150 / 192 - 40 / 192)


def test_redrawn_skips_keys_without_kept_paraphrases(para):
    ours = keys("openstamp", 3.0)
    ours[1]["real"]["n"] = 0  # every paraphrase of this key was a near-copy
    assert len(para._redrawn(ours)) == 2
    for r in ours:
        r["real"]["n"] = 0
    assert para._redrawn(ours) is None


def test_said_names_the_projections_effect(para):
    assert para._said(0.1, 0.02, 0.2).endswith("(the projection helps)")
    assert para._said(-0.1, -0.2, -0.01).endswith("(the projection hurts)")
    assert para._said(0.1, -0.02, 0.2).endswith("(not resolved)")
    assert para._said(-0.1, -0.2, -0.01, plain=True, mark="*") == "-0.100* [-0.200, -0.010] (resolved)"


def projection_folder(root: Path, kept_scores: bool) -> Path:
    """The projection stage's kept results: an eval of OpenStamp and no projection on 3 seeds, and the paper
    prompt's paraphrases of each, OpenStamp's far above human text after paraphrase and no projection's near it."""
    rng = np.random.default_rng(0)
    settings = {"delta": 0.5, "shrinkage": 4}
    config = {"method_settings": dict.fromkeys(("openstamp", "openstamp-nosem"), settings), "n": 200}
    config |= {"prompt_tokens": 32, "new_tokens": 64, "seeds": [0, 1, 2]}
    runs, attacked = [], []
    for method, shift in (("openstamp", 3.0), ("openstamp-nosem", 0.5)):
        for seed in range(3):
            human, marked = rng.normal(0, 1, 200), rng.normal(4, 1, 200)
            metrics = {"tpr_at_1pct_fpr": float(np.mean(marked > np.quantile(human, 0.99))), "own_ppl_change": 0.2}
            metrics |= {"human_flagged_at_p_0.01": 0.01, "unwatermarked_flagged_at_p_0.01": 0.01}
            scores = {"watermarked": marked.tolist(), "human": human.tolist(), "unwatermarked": human.tolist()}
            runs.append({"method": method, "seed": seed, "metrics": metrics, "scores": scores})
            one = run(method, rng.normal(shift, 1, 64), rng.normal(0, 1, 200), kept_scores)
            one["real"]["human_cut"] |= {"n": 200, "over_threshold": 0.02, "flagged_at_p_0.01": 0.01}
            one["real"] |= {"flagged_at_p_0.01": 0.5, "mean_score_before": 4.0, "mean_score_after": shift}
            attacked.append({**one, "seed": seed, "generations": f"{method}/s{seed}"})
    quality = {r["generations"]: {"n": 64, "near_copy_fraction": 0.0, "cosine_mean": 0.8} for r in attacked}
    settings = {"prompt": "paper", "n": 64, "paraphraser": "qwen2.5-coder-0.5b", "near_copy": 0.8}
    attack = {"attack": "paraphrase", "settings": settings, "quality": quality, "runs": attacked}
    (root / "attacks").mkdir(parents=True)
    (root / "results.json").write_text(json.dumps({"config": config, "runs": runs}))
    (root / "attacks" / "para-paper.json").write_text(json.dumps(attack))
    return root


@pytest.mark.parametrize("kept_scores", [True, False])
def test_projection_stage_redraws_the_threshold_at_their_lengths_where_its_runs_kept_scores(
    para, tmp_path, kept_scores
):
    text = "\n".join(para.projection_test(projection_folder(tmp_path, kept_scores), "shown"))
    verdict = next(line for line in text.splitlines() if line.startswith("The projection's effect at this cost"))
    after = verdict.split("; after paraphrase", 1)[1]
    assert ("at their lengths*" in after) is kept_scores
    assert ("keep no per-text scores" in after) is not kept_scores
    assert ("redraws each key's kept paraphrases" in after) is kept_scores
    # a 2.5 standard deviation lead on every key is resolved either way, bootstrap or Newcombe's interval
    assert after.split("and at their lengths", 1)[1].split(")")[0].endswith("(the projection helps")


def test_paraphrase_at_cost_gives_each_cost_its_own_section(para, tmp_path, monkeypatch):
    """Paraphrases at +30% and at +12% are not pooled: each cost has its lead (naming PARA_COST where it is not the
    default), its table and its keys pooled, the costliest first."""
    config = {"n": 200, "prompt_tokens": 50, "new_tokens": 64, "seeds": [0]}
    (tmp_path / "sweep" / "rerun" / "s0").mkdir(parents=True)
    (tmp_path / "sweep" / "rerun" / "s0" / "results.json").write_text(
        json.dumps({"created": "t0", "config": config, "runs": []})
    )
    (tmp_path / "paraphrase64" / "cost").mkdir(parents=True)
    for cost in (0.12, 0.3):
        attack = {"attack": "paraphrase", "eval": "runs/sweep-s0", "eval_created": "t0", "settings": {"at_cost": cost}}
        (tmp_path / "paraphrase64" / "cost" / f"para64-cost{cost}-paper.json").write_text(json.dumps(attack))
    monkeypatch.setattr(para, "attack_costs", lambda attacks, evals, shown: dict.fromkeys(attacks, {}))
    monkeypatch.setattr(para, "paraphrase_detail", lambda attacks, shown, lead, costs: [lead, *attacks])
    monkeypatch.setattr(para, "_pooled_keys", lambda attacks, costs, tokens, shown: [f"pooled {[*attacks]}"])

    out = [line for line in para.paraphrase64(tmp_path / "paraphrase64", "shown") if line]
    command = "bash benchmarks/reference_runs.sh sweep paraphrase_cost"
    assert out[0].startswith(f"At equal cost to the model (`{command}`") and "nearest +30%;" in out[0]
    assert out[1:3] == ["para64-cost0.3-paper", "pooled ['para64-cost0.3-paper']"]
    assert out[3].startswith(f"At equal cost to the model (`PARA_COST=0.12 {command}`") and "nearest +12%;" in out[3]
    assert out[4:6] == ["para64-cost0.12-paper", "pooled ['para64-cost0.12-paper']"]
    assert all("run again on another machine" in line for line in (out[0], out[3]))


def test_a_rerun_that_reproduces_a_kept_seed_is_that_seed(para, tmp_path):
    """A seed's eval run again on a CPU like the sweep's (the same scores to 1e-5) goes with the kept seeds; one whose
    scores moved (another CPU: another key and other text) stays a rerun."""
    rng = np.random.default_rng(0)
    scores = {part: rng.normal(0, 1, 50).tolist() for part in ("watermarked", "human")}

    def ev(created: str, human: list) -> dict:
        return {"created": created, "runs": [{"run": "openstamp@0.5/s0", "scores": scores | {"human": human}}]}

    kept = ev("a", scores["human"])
    again, elsewhere = (ev(c, [v + eps for v in scores["human"]]) for c, eps in (("b", 1e-6), ("c", 1e-3)))
    for folder, results in (("seeds/s0", kept), ("rerun/s0", elsewhere), ("rerun/s0-2", again)):
        (tmp_path / "sweep" / folder).mkdir(parents=True)
        (tmp_path / "sweep" / folder / "results.json").write_text(json.dumps(results))
    same, other = para.at_cost_evals(tmp_path)
    assert [e["created"] for e in same] == ["a", "b"] and [e["created"] for e in other] == ["c"]
    assert not para._reproduces(ev("d", scores["human"][:-1]), kept) and para._reproduces(again, kept)
