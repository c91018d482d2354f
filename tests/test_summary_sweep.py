"""The Pareto sweep's summary (benchmarks/summary_sweep.py): where OpenStamp stands against each baseline's curve,
the variants and shards kept beside the sweep, and how a sweep compares with the one before it."""

from __future__ import annotations

import json
import re
from pathlib import Path
from statistics import fmean

import numpy as np
import pytest

LENGTHS = (16, 32, 64)
HALF = 0.03  # half the width of each synthetic point's 95% interval: 'on' within about 0.04 of a baseline's curve

# method -> (strength, own PPL change, TPR@1%FPR): against kgw's curve (0.1, 0.2) - (0.3, 0.6) - (0.5, 0.8),
# OpenStamp's points lie above (0.9 where kgw reads 0.4), below (0.2 vs 0.5), on (0.7 vs 0.7) and past its costliest
# strength; gaussmark's strengths all cost more than OpenStamp's, and sir has a single strength (no curve).
POINTS = {
    "openstamp": [(0.25, 0.2, 0.9), (0.5, 0.25, 0.2), (0.75, 0.4, 0.7), (1.0, 0.8, 0.95)],
    "kgw": [(0.5, 0.1, 0.2), (1.0, 0.3, 0.6), (1.5, 0.5, 0.8)],
    "gaussmark": [(0.1, 1.0, 0.5), (0.2, 1.2, 0.9)],
    "sir": [(0.5, 0.3, 0.5)],
}


@pytest.fixture
def sw(monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parent.parent / "benchmarks"))
    import summary_sweep

    return summary_sweep


def results(points: dict, seeds=(0, 1, 2), n: int = 200, scores: bool = True, seed: int = 0, **config) -> dict:
    """A sweep's results.json: per point its seeds' TPRs (drawn around the point's TPR, their mean exactly it), the
    summary over seeds with a 95% interval of +-HALF, a length curve, and one run per seed."""
    rng = np.random.default_rng(seed)
    summary, curve, runs = [], [], []
    for method, rows in points.items():
        for strength, cost, tpr in rows:
            noise = rng.normal(0, 0.01, len(seeds))
            per_seed = tpr + noise - noise.mean()
            ppl = 150 * (1 + cost) + rng.normal(0, 5)
            summary.append(
                {
                    "method": method,
                    "strength": strength,
                    "seeds": len(seeds),
                    "tpr_at_1pct_fpr": {"mean": tpr, "sd": float(per_seed.std()), "ci": [tpr - HALF, tpr + HALF]},
                    "own_ppl_change": {"mean": cost, "sd": 0.002},
                    "ppl_mean": {"mean": ppl, "sd": 5.0},
                }
            )
            for tokens in LENGTHS:
                row = {"method": method, "strength": strength, "tokens": tokens, "scored_tokens": float(tokens)}
                curve.append(row | {"tpr_at_1pct_fpr": tpr * tokens / 64})
            for i, s in enumerate(seeds):
                metrics = {"tpr_at_1pct_fpr": float(per_seed[i]), "auroc": 0.9, "flagged_at_p_0.01": float(per_seed[i])}
                metrics |= {"own_ppl_change": cost, "ppl_mean": ppl, "seq_rep_3": 0.01}
                run = {"run": f"{method}@{strength:g}/s{s}", "method": method, "strength": strength, "seed": s}
                run |= {"key_sha256": f"{method}-{s}", "metrics": metrics}
                if scores:
                    run["scores"] = {"watermarked": rng.normal(tpr, 1, 4).tolist(), "human": [0.0] * 4}
                runs.append(run)
    cfg = {"seeds": list(seeds), "n": n, "methods": list(points), "new_tokens": 64, "prompt_tokens": 50}
    cfg |= {"oracle": "gemma3-270m", "grids": {m: [p[0] for p in rows] for m, rows in points.items()}}
    cfg |= {"method_settings": {}, "lengths": [16, 32], "sweep": True, **config}
    return {
        "created": "2026-11-27T00:00:00+00:00",
        "config": cfg,
        "references": {"human": {"own_ppl_original": 25.0}},
        "downstream_original": {},
        "summary": summary,
        "length_curve": curve,
        "runs": runs,
    }


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path


def timings(total: float, stages: dict | None = None) -> dict:
    stages = stages or {"generate": total / 2, "score": total / 2}
    machines = [{"cpu": "Test CPU", "threads": 2}]
    return {"total": total, "stages": stages, "invocations": 1, "machines": machines}


def counts(line: str, baseline: str) -> tuple[dict[str, int], int]:
    """From a verdict line: how many strengths lie above / on / below ``baseline``'s curve, and how many outside."""
    part = line.split(f" {baseline}: ", 1)[1].split(";")[0]
    said = {verdict: int(k) for k, verdict in re.findall(r"(\d+) (above|on|below)\b", part)}
    outside = re.search(r"(\d+) outside", part)
    return said, int(outside[1]) if outside else 0


def test_verdicts_count_each_strength_above_on_or_below_each_baselines_curve(sw):
    [line] = sw._verdicts(results(POINTS))
    assert counts(line, "kgw") == ({"above": 1, "on": 1, "below": 1}, 1)
    # every OpenStamp strength costs less than gaussmark's cheapest: no verdict, all four outside its range
    assert counts(line, "gaussmark") == ({}, 4) and "none inside" in line.split(" gaussmark: ")[1]
    assert " sir:" not in line  # a single strength draws no curve


def test_verdicts_flip_when_openstamp_and_the_baseline_swap_places(sw):
    """The same points read from the other side: kgw's strengths inside OpenStamp's cost range."""
    points = {"openstamp": [(0.5, 0.1, 0.2), (1.0, 0.3, 0.9)], "kgw": [(0.5, 0.1, 0.2), (1.0, 0.3, 0.3)]}
    ours = sw._verdicts(results(points))[0]
    theirs = sw._verdicts(results(points), method="kgw")[0]
    assert counts(ours, "kgw")[0] == {"on": 1, "above": 1}
    assert counts(theirs, "openstamp")[0] == {"on": 1, "below": 1}


def test_verdicts_need_a_baseline_with_two_strengths(sw):
    assert sw._verdicts(results({"openstamp": POINTS["openstamp"], "sir": POINTS["sir"]})) == []


def test_readme_section_has_the_equal_cost_table_the_verdicts_and_only_kept_plots(sw, tmp_path):
    r = results(POINTS)
    text = "\n".join(sw.sweep(r, tmp_path, whole=False))
    table = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| method")]
    assert {line.split(" | ")[0][2:] for line in table} == {"openstamp", "kgw", "gaussmark"}  # sir: one point
    verdict = next(line for line in text.splitlines() if line.startswith("Where openstamp stands"))
    assert counts(verdict, "kgw") == ({"above": 1, "on": 1, "below": 1}, 1)
    assert "![" not in text and "Per strength" not in text  # no plots kept; the per-strength table is RESULTS.md's
    (tmp_path / "pareto.png").write_bytes(b"")
    shown = sw.sweep(r, tmp_path, whole=False)
    assert [line for line in shown if "![" in line] == ["![pareto.png](benchmarks/results/sweep/pareto.png)"]


@pytest.mark.parametrize(
    ("seeds", "scores", "partial"), [((0,), False, True), ((0,), True, False), ((0, 1, 2), False, False)]
)
def test_the_stands_until_merged_note_only_for_fewer_than_three_seeds_without_scores(
    sw, tmp_path, seeds, scores, partial
):
    intro = sw.sweep(results(POINTS, seeds=seeds, scores=scores), tmp_path, whole=False)[0]
    assert ("stands until then" in intro) is partial
    assert ("a key and a sample per seed" in intro) is (len(seeds) > 1)


def test_per_strength_table_reads_each_length_off_the_length_curve(sw, tmp_path):
    r = results(POINTS)
    r["length_curve"] = [row for row in r["length_curve"] if (row["method"], row["tokens"]) != ("sir", 16)]
    rows = sw.sweep(r, tmp_path, whole=True)
    start = next(i for i, line in enumerate(rows) if line.startswith("| method | strength |"))
    header, table = rows[start], rows[start + 2 : rows.index("", start)]
    assert "TPR 16 tok" in header and "TPR 32 tok" in header and "TPR full (64 tok)" in header
    per_point = {(line.split(" | ")[0][2:], float(line.split(" | ")[1])): line.split(" | ")[2:4] for line in table}
    assert len(per_point) == sum(map(len, POINTS.values()))
    for method, points in POINTS.items():
        for strength, _, tpr in points:
            expected = [f"{tpr * 16 / 64:.3f}", f"{tpr * 32 / 64:.3f}"]
            assert per_point[method, strength] == (["-", expected[1]] if method == "sir" else expected)


@pytest.mark.parametrize("hours", [2.5, 3.75])
def test_timings_say_under_or_over_the_three_hour_goal(sw, tmp_path, hours):
    r = results(POINTS) | {"timings_s": timings(hours * 3600)}
    text = "\n".join(sw.sweep(r, tmp_path, whole=True))
    word = "under" if hours * 3600 <= sw.GOAL_S else "over"
    assert f"{word} it by {abs(hours * 3600 - sw.GOAL_S) / 60:.0f} min" in text
    one = results(POINTS, seeds=(0,)) | {"timings_s": timings(hours * 3600)}
    assert "goal for the whole sweep" not in "\n".join(sw.sweep(one, tmp_path, whole=True))


def test_variants_of_the_same_sweep_are_added_and_others_say_why_not(sw, tmp_path):
    r = results(POINTS)
    variant = [(0.125, 0.05, 0.6), (0.25, 0.15, 0.95)]
    same = {"grids": {"openstamp": [0.125, 0.25]}, "method_settings": {"openstamp": {"shrinkage": 4}}}
    write(tmp_path / "shrinkage" / "openstamp-f4" / "results.json", results({"openstamp": variant}, **same))
    other_seeds = same | {"method_settings": {"openstamp": {"shrinkage": 8}}}
    write(
        tmp_path / "shrinkage" / "openstamp-f8" / "results.json", results({"openstamp": variant}, (0,), **other_seeds)
    )
    other_n = same | {"method_settings": {"openstamp": {"shrinkage": 2}}}
    write(tmp_path / "shrinkage" / "openstamp-f2" / "results.json", results({"openstamp": variant}, n=100, **other_n))

    shown, said = sw.with_variants(r, tmp_path / "sweep")
    added = [(s["strength"], s["own_ppl_change"]["mean"]) for s in shown["summary"] if " (shrinkage " in s["method"]]
    assert {s["method"] for s in shown["summary"]} - set(POINTS) == {"openstamp (shrinkage 4)"}
    assert added == [(strength, cost) for strength, cost, _ in variant]
    assert sum(row["method"] == "openstamp (shrinkage 4)" for row in shown["length_curve"]) == 2 * len(LENGTHS)
    assert len(r["summary"]) == sum(map(len, POINTS.values()))  # the sweep itself is left as it was
    why = {line.split("`")[1].rsplit("/", 1)[1]: line for line in said if "not shown" in line}
    assert set(why) == {"openstamp-f8", "openstamp-f2"}
    assert "other seeds" in why["openstamp-f8"] and "other settings" in why["openstamp-f2"]

    text = sw.sweep(r, tmp_path / "sweep", whole=False)
    assert any(line.startswith("Where openstamp (shrinkage 4) stands") for line in text)


def test_a_later_seed_is_set_beside_the_sweep_with_how_many_tprs_fall_inside_its_intervals(sw, tmp_path):
    r = results(POINTS)
    shard = results(POINTS, seeds=(3,), seed=3)
    offsets = np.random.default_rng(1).uniform(-2 * HALF, 2 * HALF, len(shard["summary"]))
    for s, offset in zip(shard["summary"], offsets, strict=True):
        s["tpr_at_1pct_fpr"]["mean"] += float(offset)
    write(tmp_path / "seeds" / "s3" / "results.json", shard)
    [part] = sw.later_seeds(r, tmp_path)
    held = {(s["method"], s["strength"]): s["tpr_at_1pct_fpr"]["ci"] for s in r["summary"]}
    inside = sum(
        held[s["method"], s["strength"]][0] <= s["tpr_at_1pct_fpr"]["mean"] <= held[s["method"], s["strength"]][1]
        for s in shard["summary"]
    )
    assert 0 < inside < len(shard["summary"])  # the draw puts some points inside and some outside
    assert f"at {inside} of {len(shard['summary'])} points" in part[-1]
    assert "on seed 3 alone" in part[-1].lower() and "where openstamp stands" in part[-1]
    assert sum(line.startswith("| ") and line.split(" | ")[0][2:] in POINTS for line in part) == len(shard["summary"])


def test_a_later_seed_run_with_other_settings_is_refused(sw, tmp_path):
    write(tmp_path / "seeds" / "s3" / "results.json", results(POINTS, seeds=(3,), n=100))
    with pytest.raises(SystemExit, match="is not a seed of the sweep"):
        sw.later_seeds(results(POINTS), tmp_path)


def test_a_held_seed_run_again_says_which_runs_reproduced(sw, tmp_path):
    r = results(POINTS)  # one folder, not merged from shards
    shard = json.loads(json.dumps(r)) | {"config": {**r["config"], "seeds": [0]}}
    shard["runs"] = [run for run in shard["runs"] if run["seed"] == 0]
    moved = shard["runs"][1]
    close = next(run for run in shard["runs"] if run["method"] == "kgw")
    before = moved["metrics"]["tpr_at_1pct_fpr"]
    moved["metrics"]["tpr_at_1pct_fpr"] = before + 0.1
    close["metrics"]["own_ppl_change"] += 1e-9  # within the 1e-6 a rerun is allowed
    write(tmp_path / "seeds" / "s0" / "results.json", shard)
    [[line]] = sw.later_seeds(r, tmp_path)
    assert f"{len(shard['runs']) - 1} of {len(shard['runs'])} runs give the same" in line
    assert f"{moved['method']} (TPR@1%FPR at {moved['strength']:g}: {before:.3f} -> {before + 0.1:.3f})" in line
    assert "kgw" not in line.split("these moved:")[1]
    # a sweep merged from its shards holds that seed already: nothing to say
    assert sw.later_seeds(r | {"shards": []}, tmp_path) == []


def test_seeds_run_again_with_other_settings_are_timed_against_the_same_seed_before(sw, tmp_path):
    r = results(POINTS, score_dtype="float32") | {"shards": []}
    old_stages = {"generate": 1000.0, "score": 800.0, "own_ppl": 300.0, "load": 10.0}
    new_stages = {"generate": 1200.0, "score": 400.0, "own_ppl": 330.0, "load": 12.0}
    old = results(POINTS, seeds=(0,), score_dtype="float32") | {"timings_s": timings(2110.0, old_stages)}
    new = results(POINTS, seeds=(0,), score_dtype="bfloat16") | {"timings_s": timings(1942.0, new_stages)}
    write(tmp_path / "seeds" / "s0" / "results.json", new)
    write(tmp_path / sw.BEFORE / "seeds" / "s0" / "results.json", old)
    [line] = sw.current_shards(r, tmp_path)
    assert f"**{1942 / 60:.0f} min**" in line
    assert "score did" in line  # only the score stage ran other settings
    ratios = [new_stages[k] / v for k, v in old_stages.items() if k != "score" and v > 60]
    assert f"took {min(ratios):.2f}x to {max(ratios):.2f}x as long" in line
    assert f"about {3 * 1942 / 60:.0f} min of machine time" in line
    # a shard with the sweep's own settings is one of its seeds, not a re-run
    write(tmp_path / "seeds" / "s0" / "results.json", results(POINTS, seeds=(0,), score_dtype="float32"))
    assert sw.current_shards(r, tmp_path) == []


def test_resampled_reports_how_far_the_points_moved_and_which_keys_stayed(sw):
    before = results(POINTS, own_ppl_dtype="float32")
    r = json.loads(json.dumps(before))
    r["config"]["own_ppl_dtype"] = "bfloat16"
    r["created"] = "2026-12-01T00:00:00+00:00"
    rng = np.random.default_rng(2)
    for s in r["summary"]:
        tpr = s["tpr_at_1pct_fpr"]
        tpr["mean"] += float(rng.normal(0, HALF))
        tpr["ci"] = [tpr["mean"] - HALF, tpr["mean"] + HALF]
        s["own_ppl_change"]["mean"] += float(rng.uniform(0, 0.02)) if s["method"] == "openstamp" else 0.001
        s["ppl_mean"]["mean"] *= float(rng.uniform(0.9, 1.1))
    for run in r["runs"]:
        if run["method"] == "openstamp":
            run["key_sha256"] += "-new"
    [line] = sw.resampled(r, before, "`before`")

    pairs = list(zip(r["summary"], before["summary"], strict=True))
    moves = [s["tpr_at_1pct_fpr"]["mean"] - b["tpr_at_1pct_fpr"]["mean"] for s, b in pairs]
    inside = sum(
        s["tpr_at_1pct_fpr"]["ci"][0] <= b["tpr_at_1pct_fpr"]["mean"] <= s["tpr_at_1pct_fpr"]["ci"][1] for s, b in pairs
    )
    assert 0 < inside < len(pairs)
    assert "own_ppl_dtype float32 -> bfloat16" in line
    assert "bit-identical for kgw, gaussmark, sir, not for openstamp" in line
    assert f"moved by {fmean(moves):+.3f} on average" in line
    assert f"at {inside} of {len(pairs)} points" in line
    s, b = max(pairs, key=lambda p: abs(p[0]["tpr_at_1pct_fpr"]["mean"] - p[1]["tpr_at_1pct_fpr"]["mean"]))
    expected = (
        f"{s['method']} {s['strength']:g}: {b['tpr_at_1pct_fpr']['mean']:.3f} -> {s['tpr_at_1pct_fpr']['mean']:.3f}"
    )
    assert f"the largest {expected}" in line
    cost = {
        m: max(abs(s["own_ppl_change"]["mean"] - b["own_ppl_change"]["mean"]) for s, b in pairs if s["method"] == m)
        for m in POINTS
    }
    kept = max(cost[m] for m in POINTS if m != "openstamp")
    assert f"{100 * kept:.2f} points where the key came out the same" in line
    assert f"{100 * cost['openstamp']:.2f} where it did not" in line
    oracle = fmean(s["ppl_mean"]["mean"] / b["ppl_mean"]["mean"] for s, b in pairs)
    assert f"{oracle:.2f}x the earlier one" in line
    assert "That sweep's verdicts" in line  # the earlier sweep's own verdicts, for comparison


def test_against_needs_shards_and_timings_on_both_sides(sw):
    def merged(minutes):
        shards = [{"seeds": [s], "timings_s": timings(m * 60)} for s, m in enumerate(minutes)]
        return results(POINTS) | {"shards": shards, "timings_s": timings(sum(minutes) * 60)}

    now, then = merged([40, 50, 60]), merged([70, 64, 62])
    [line] = sw.against(now, then, "`before`")
    assert "seed 0 40 min, seed 1 50 min, seed 2 60 min (Test CPU, 2 threads)" in line
    assert "seed 0 70 min, seed 1 64 min, seed 2 62 min" in line
    assert f"{sum([70, 64, 62]):.0f} -> {sum([40, 50, 60]):.0f} min" in line
    assert sw.against(now, {k: v for k, v in then.items() if k != "shards"}, "`before`") == []
    assert sw.against({k: v for k, v in now.items() if k != "timings_s"}, then, "`before`") == []


def test_differences_name_the_changed_settings_but_not_the_seeds(sw):
    now = results(POINTS, seeds=(0, 1, 2), sample_dtype="bfloat16")
    then = results(POINTS, seeds=(0,))  # recorded before sample_dtype was: float32 then
    assert sw.differences(now, then) == {"sample_dtype": ("float32", "bfloat16")}
    assert sw.differences(now, now) == {}


def test_a_later_seed_with_no_baseline_curve_is_still_set_beside_the_sweep(sw, tmp_path):
    # a shard of OpenStamp and a one-strength baseline has no curve to place OpenStamp against: its points are shown,
    # without the sentence on where OpenStamp stands on that seed alone
    points = {"openstamp": POINTS["openstamp"], "sir": POINTS["sir"]}
    write(tmp_path / "seeds" / "s3" / "results.json", results(points, seeds=(3,), seed=3))
    [part] = sw.later_seeds(results(points), tmp_path)
    assert part[-1].startswith("Seed 3's TPR lies inside the interval of seeds 0, 1, 2 at ")
    assert "alone" not in part[-1]
    assert sum(line.startswith("| openstamp | ") for line in part) == len(points["openstamp"])


def test_a_rerun_that_lost_or_gained_a_figure_counts_as_moved(sw, tmp_path):
    r = results(POINTS)
    shard = json.loads(json.dumps(r)) | {"config": {**r["config"], "seeds": [0]}}
    shard["runs"] = [run for run in shard["runs"] if run["seed"] == 0]
    lost, gained = shard["runs"][0], shard["runs"][1]
    lost["metrics"]["tpr_at_1pct_fpr"] = None  # the detector refused on the rerun
    held = next(
        run
        for run in r["runs"]
        if (run["method"], run["strength"], run["seed"]) == (gained["method"], gained["strength"], 0)
    )
    held["metrics"]["own_ppl_change"] = None  # and this figure was missing before
    write(tmp_path / "seeds" / "s0" / "results.json", shard)
    [[line]] = sw.later_seeds(r, tmp_path)
    assert f"{len(shard['runs']) - 2} of {len(shard['runs'])} runs give the same" in line
    assert f"{lost['strength']:g}: " in line and " -> -" in line
