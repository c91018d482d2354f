"""The README's paraphrase detail: each method with and without the near-copies, per prompt."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from scipy.stats import t as t_dist

from openstamp.evaluation.metrics import clopper_pearson, pooled_tpr_difference_ci, rate_difference_ci
from openstamp.evaluation.results import against

PROMPTS = {
    "paper": "the paper's prompt",
    "strong": "the strong prompt (the paper's, which also forbids copying more than three consecutive words)",
}


# the own perplexity change the at-cost stages aim at unless told another (PARA_COST, ROBUST_COST, DURABILITY_COST)
AT_COST_DEFAULT = 0.3
# where the at-cost stages keep the sweep's evals they attacked when a seed was run again on another machine
RERUN = "benchmarks/results/sweep/rerun"
REDRAWN = (
    "; starred, at their lengths, a bootstrap that redraws each key's kept paraphrases and the human texts cut to "
    "their lengths, and with them the threshold (`pooled_tpr_difference_ci`), where the runs kept those scores"
)


def paraphrase64(folder: Path, shown: str) -> list[str]:
    """The paraphrase64 stage's runs on its own eval (``folder``), then the earlier runs on the main eval's releases.

    ``shown`` is ``folder`` as the README links it.
    """
    out = []
    own, attack = folder / "results.json", _load(folder / "attacks")
    if own.exists() and attack:
        results = json.loads(own.read_text())
        cfg = results["config"]
        lead = (
            "Paraphrase at larger n (`bash benchmarks/reference_runs.sh paraphrase64`), on its own eval "
            f"({cfg['n']} prompts of {cfg['prompt_tokens']} tokens, {cfg['new_tokens']} new tokens, each method at "
            f"its default strength; `{shown}/`; its KGW-distilled key was distilled in float32, before the "
            "distillation's bfloat16 autocast, though its recorded settings say bfloat16: the eval took a field "
            "added since at its new default, which it now refuses)"
        )
        out += paraphrase_detail(
            attack, f"{shown}/attacks", lead, attack_costs(attack, [results], f"{shown}/attacks")
        ) + [""]
        out += _threshold_note(folder.parent / "threshold_lengths.json", attack)
    if (timed := _load(folder / "timed")) and (own := folder.parent / "eval_timed" / "results.json").exists():
        results = json.loads(own.read_text())
        cfg = results["config"]
        lead = (
            "The same on the timed default comparison's eval (`bash benchmarks/reference_runs.sh timed "
            f"paraphrase_timed`; {cfg['n']} prompts of {cfg['prompt_tokens']} tokens, {cfg['new_tokens']} new tokens, "
            f"each method at its default strength; `{shown}/timed/`), whose length curve gives the note above"
        )
        out += paraphrase_detail(timed, f"{shown}/timed", lead, attack_costs(timed, [results], f"{shown}/timed")) + [""]
    kept, rerun = at_cost_evals(folder.parent)
    if (cost := _load(folder / "cost")) and (sweep := kept + rerun):
        by_cost: dict[float, dict[str, dict]] = {}
        for name, a in cost.items():
            by_cost.setdefault(a["settings"]["at_cost"], {})[name] = a
        for at in sorted(by_cost, reverse=True):  # the costliest first, as the robustness at equal cost
            out += _at_cost(by_cost[at], at, (sweep, rerun), f"{shown}/cost")
    if earlier := _load(folder / "main-eval"):
        lead = (
            "Earlier, on the main eval's releases (OpenStamp and no projection only, with keys an earlier session "
            f"built; `{shown}/main-eval/`)"
        )
        out += paraphrase_detail(earlier, f"{shown}/main-eval", lead) + [""]
    return out


def _at_cost(cost: dict[str, dict], at: float, evals: tuple[list, list], shown: str) -> list[str]:
    """The paraphrase runs at equal cost ``at`` (the paraphrase_cost stage's, in ``shown``), on ``evals`` (every sweep
    eval they may have attacked, and of those the ones run again on another machine)."""
    sweep, rerun = evals
    costs = attack_costs(cost, sweep, shown)
    cfg = sweep[0]["config"]
    evals_named = ", ".join(sorted({Path(a["eval"]).name for a in cost.values()}))
    again = sorted(name for name, a in cost.items() if a.get("eval_created") in {ev["created"] for ev in rerun})
    lead = (
        f"At equal cost to the model (`{_para_cost_command(at)}`, with "
        f"`PARA_COST_SEED` for another key; the sweep's evals {evals_named}, {cfg['n']} prompts of "
        f"{cfg['prompt_tokens']} tokens, {cfg['new_tokens']} new tokens, each method at the strength of its grid "
        f"whose own perplexity change is nearest {at:+.0%}; `{shown}/`"
        + (
            f"; {', '.join(again)} attacked the sweep's eval of its seed run again on another machine, kept in "
            f"`{RERUN}/`: another key and other text than the kept seed of that number"
            if again
            else ""
        )
        + ")"
    )
    return paraphrase_detail(cost, shown, lead, costs) + [""] + _pooled_keys(cost, costs, cfg["new_tokens"], shown)


def _para_cost_command(at: float) -> str:
    """The reference command that paraphrased at cost ``at``, naming PARA_COST where it is not the default."""
    command = "bash benchmarks/reference_runs.sh sweep paraphrase_cost"
    return command if at == AT_COST_DEFAULT else f"PARA_COST={at:g} {command}"


def _threshold_note(path: Path, attack: dict) -> list[str]:
    """What each method's full-length threshold flags of human text as short as the paraphrases (from
    ``benchmarks/threshold_lengths.py``), since the TPRs above are read at that threshold."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    ratios = [q["length_ratio_mean"] for a in attack.values() if a.get("quality") for q in a["quality"].values()]
    cuts = [t for t in (128, 64) if all(any(r["tokens"] == t for r in run["lengths"]) for run in data["runs"])]
    if not ratios or not cuts:
        return []

    def at(run: dict, tokens: int, field: str) -> float | None:
        return next(r[field] for r in run["lengths"] if r["tokens"] == tokens)

    cells = []
    for run in data["runs"]:
        over = " / ".join(f"{at(run, t, 'human_over_full_threshold'):.1%}" for t in cuts)
        p_values = [at(run, t, "human_flagged_at_p_0.01") for t in cuts]
        by_p = "" if None in p_values else " (p-value: " + " / ".join(f"{v:.1%}" for v in p_values) + ")"
        cells.append(f"{run['method']} {over}{by_p}")
    settings = data["settings"]
    return [
        f"These TPRs are read at the threshold from human continuations of {settings['new_tokens']} tokens, and the "
        f"paraphrases ran {min(ratios):.2f}-{max(ratios):.2f} of their originals' length. Cut to "
        f"{' and '.join(map(str, cuts))} scored tokens, human text passes each method's full-length threshold this "
        "often (1% at full length; `python benchmarks/threshold_lengths.py`: the length curve of the default "
        f"comparison, `{settings['eval']}`, {settings['n']} human texts, "
        f"seed {', '.join(map(str, settings['seeds']))}): "
        + "; ".join(cells)
        + ". So each method's TPR after paraphrase holds at a false-positive rate of its own, and a difference "
        "between two methods favours the one whose threshold passes more short human text; the p-value's rate "
        "does not depend on the threshold." + _scale_note(data["runs"], min(cuts), settings["new_tokens"]),
        "",
    ]


def _scale_note(runs: list[dict], tokens: int, full: int) -> str:
    """Which methods' scores are per-token means, whose spread on human text widens on shorter text, and which are
    standardised for length (``score_scale`` and ``human_sd_ratio`` of ``benchmarks/threshold_lengths.py``)."""
    if any("score_scale" not in run for run in runs):
        return ""  # written before the script recorded it
    groups = {}
    for run in runs:
        ratio = next(r["human_sd_ratio"] for r in run["lengths"] if r["tokens"] == tokens)
        groups.setdefault(run["score_scale"], []).append((run["method"], ratio))
    parts = [
        f"{scale} ({', '.join(m for m, _ in members)}: {min(r for _, r in members):.2f}-"
        f"{max(r for _, r in members):.2f})"
        for scale, members in groups.items()
    ]
    return (
        f" Why: a method's human scores spread at {tokens} tokens this many times as at {full}, by the kind of score: "
        + "; ".join(parts)
        + f". A per-token mean (a length-normalised LLR) spreads as 1/sqrt(tokens), {(full / tokens) ** 0.5:.2f} "
        "times here, so its full-length threshold passes more short text; a standardised score (a z-score) spreads "
        "alike at every length." + _loose_note(runs)
    )


def _loose_note(runs: list[dict]) -> str:
    """Why a standardised score may still pass more than 1%: its threshold's own p-value (``full_threshold_p_value``
    of ``benchmarks/threshold_lengths.py``), where the script recorded it."""
    at = {r["method"]: r.get("full_threshold_p_value") for r in runs if r["score_scale"] == "standardised"}
    at = {m: p for m, p in at.items() if p is not None}
    if not at:
        return ""
    return (
        " One that still passes more than 1% has a threshold that is loose by chance: the 1% FPR threshold of the "
        "human texts rests on their few highest scores, and the detector's own p-value at it is "
        + ", ".join(f"{p:.3f} ({m})" for m, p in at.items())
        + "; text of any length passes a threshold at about its p-value where that p-value is exact, and less where "
        "it is conservative (larger than the rate it promises; compare its p <= 0.01 rate above)."
    )


def _load(folder: Path) -> dict:
    # by name without the suffix: "x.json" sorts after "x-s1.json", and a seed-0 run should lead its other seeds
    return {f.stem: json.loads(f.read_text()) for f in sorted(folder.glob("*.json"), key=lambda f: f.stem)}


def _costs(results: dict) -> dict[str, float]:
    """Each run of an eval's results: its own perplexity change, what its strength costs the model."""
    runs = results["runs"]
    return {r["run"]: r["metrics"]["own_ppl_change"] for r in runs if r["metrics"].get("own_ppl_change") is not None}


def _by_cost(attack: dict) -> bool:
    """Whether a paraphrase run chose each method's strength by its cost (``--at-cost``), not its default."""
    return attack["settings"].get("at_cost") is not None


def paraphrase_detail(attack: dict, figures: str, lead: str, costs: dict[str, dict] | None = None) -> list[str]:
    """Every paraphrase run that recorded detection without its near-copies (``real``), one row per prompt and method.

    ``lead`` says which eval's releases were paraphrased; ``figures`` is the folder of the runs' plots; ``costs``
    (:func:`attack_costs`), where given, the own perplexity change of each run in the eval each result attacked,
    shown beside it.

    The projection's effect is OpenStamp against openstamp-nosem on the same paraphraser and prompt:
    with near-copies left out, neither is credited for text the paraphraser did not rewrite.
    """
    runs = {name: a for name, a in attack.items() if a.get("attack") == "paraphrase" and _has_real(a)}
    if not runs:
        return []
    first = next(iter(runs.values()))["settings"]
    prompts = sorted({a["settings"].get("prompt", "paper") for a in runs.values()})
    cut = any("human_cut" in r["real"] for a in runs.values() for r in a["runs"])
    more = (
        " | at p <= 0.01 (kept) | human at their lengths: over the threshold / at p <= 0.01 "
        "| TPR at their lengths [95% CI]"
        if cut
        else ""
    )
    rows = [
        f"{lead}: `{first['paraphraser']}`, {' and '.join(PROMPTS[p] for p in prompts)}. "
        f"TPR@1%FPR against the eval's human continuations (AUROC), first on every paraphrase, "
        f"then on those that are not near-copies (keeping less than {first['near_copy']:g} of the original's "
        "token 3-grams), with an exact 95% interval, and the mean detector score of those texts before and after; "
        "MiniLM cosine of original and paraphrase"
        + (
            "; own PPL: what the method's strength costs the model's own perplexity on human text, from the eval"
            if costs
            else ""
        )
        + (
            "; then the kept paraphrases flagged at p <= 0.01, and against the human continuations cut to their "
            "lengths: how many of those the threshold and the p-value flag (1% if length did not matter), and the "
            "TPR with the threshold at 1% FPR of the cut texts"
            if cut
            else ""
        )
        + ":",
        "",
        f"| prompt | method{' | own PPL' if costs else ''} | n | near-copies | cosine | length ratio "
        f"| TPR after paraphrase (AUROC) | TPR, near-copies excluded [95% CI] | kept | mean score before / after (kept)"
        f"{more} |",
        "|---|---|" + ("---:|" * (8 + (1 if costs else 0) + (3 if cut else 0))),
    ]
    for name, a in sorted(runs.items(), key=lambda item: item[1]["settings"].get("prompt", "paper")):
        prompt = a["settings"].get("prompt", "paper")
        for run in a["runs"]:
            q = a["quality"][run["generations"]]
            real = run["real"]
            after = f"{run['tpr_at_1pct_fpr_after']:.3f} ({run['auroc_after']:.3f})"
            if real["n"]:
                low, high = real["tpr_at_1pct_fpr_after_ci"]
                kept = f"{real['tpr_at_1pct_fpr_after']:.3f} [{low:.2f}, {high:.2f}]"
                scores = f"{real['mean_score_before']:.3f} / {real['mean_score_after']:.3f}"
            else:
                kept = scores = "-"
            extra = _cut_cells(real) if cut else ""
            mine = {} if costs is None else costs[name]
            cost = "" if costs is None else " | " + ("-" if run["run"] not in mine else f"{mine[run['run']]:+.1%}")
            rows.append(
                f"| {prompt} | {_name(a, run)}{cost} | {q['n']} | {q['near_copy_fraction']:.0%} "
                f"| {q['cosine_mean']:.2f} | {q['length_ratio_mean']:.2f} "
                f"| {after} | {kept} | {real['n']} | {scores}{extra} |"
            )
    plots = [f"![{name} similarity]({figures}/{name}_paraphrase_similarity.png)" for name in runs]
    strength = "Paraphrase strength (MiniLM cosine of each paraphrase with its original): " + " ".join(plots)
    return rows + _projection(runs) + ["", strength]


def _name(attack: dict, run: dict) -> str:
    """A run as the paraphrase tables name it: its method, or its run (strength and seed) where the attack chose the
    strength by cost."""
    return run["run"] if _by_cost(attack) else run["method"]


def _cut_cells(real: dict) -> str:
    """The table cells of a run's kept paraphrases at p <= 0.01 and against human text cut to their lengths."""
    at_p, cut = real.get("flagged_at_p_0.01"), real.get("human_cut")
    cells = ["-" if at_p is None else f"{at_p:.3f}", "-", "-"]
    if cut:
        p_cut = "-" if cut["flagged_at_p_0.01"] is None else f"{cut['flagged_at_p_0.01']:.1%}"
        cells[1:] = f"{cut['over_threshold']:.1%} / {p_cut}", _rate(*_measures(real)["at their lengths"])
    return "".join(f" | {c}" for c in cells)


def _measures(real: dict) -> dict[str, tuple[int, int]]:
    """(flagged, kept) of a run's kept paraphrases by each decision it recorded: the full-length threshold, the
    threshold of human text cut to their lengths, and p <= 0.01."""
    out = {"": _kept(real)}
    if cut := real.get("human_cut"):
        out["at their lengths"] = round(cut["tpr_at_1pct_fpr"] * real["n"]), real["n"]
    if real.get("flagged_at_p_0.01") is not None:
        out["at p <= 0.01"] = _at_p(real), real["n"]
    return out


def _runs_of(attack: dict, method: str) -> list[dict]:
    return [r for r in attack["runs"] if r["method"] == method]


def _starred(decision: str, redraw: tuple | None) -> str:
    """A decision as a verdict names it: at their lengths, starred where its interval redraws the threshold."""
    return f"{decision}*" if decision == "at their lengths" and redraw is not None else decision


def _cut_scores(real: dict) -> tuple | None:
    """A run's kept paraphrases' scores and those of the human texts cut to their lengths, as
    ``pooled_tpr_difference_ci`` takes a key (an unscorable paraphrase a miss); None for results that did not keep
    them (those written before f7a3d50)."""
    cut = real.get("human_cut") or {}
    if real.get("scores") is None or cut.get("scores") is None:
        return None
    return against({"watermarked": real["scores"], "human": cut["scores"]})


def _gap(decision: str, ours: tuple[int, int], other: tuple[int, int], redraw: tuple | None) -> tuple:
    """OpenStamp minus another method by ``decision``: (gap, low, high). At their lengths, where ``redraw`` gives
    both methods' keys (:func:`_cut_scores`, a list each), a bootstrap that redraws each key's paraphrases and cut
    human texts, and with them its threshold; otherwise Newcombe's interval over the texts."""
    if decision == "at their lengths" and redraw is not None:
        return pooled_tpr_difference_ci(*redraw, 0.01)
    return _difference(ours, other)


def _redrawn(runs: list[dict]) -> list[tuple] | None:
    """:func:`_cut_scores` of each run with kept paraphrases, or None where any lacks them."""
    keys = [_cut_scores(r["real"]) for r in runs if r["real"]["n"]]
    return keys if keys and all(k is not None for k in keys) else None


def _both(ours: list[dict], other: list[dict]) -> tuple | None:
    """Both methods' keys for the bootstrap (:func:`_redrawn`), or None where either lacks them."""
    pair = _redrawn(ours), _redrawn(other)
    return pair if all(p is not None for p in pair) else None


def _projection(runs: dict) -> list[str]:
    """OpenStamp against no projection, then against each baseline, near-copies excluded, per prompt: the
    difference with Newcombe's 95% interval, resolved where the interval leaves out 0; by the full-length threshold,
    and also at the paraphrases' lengths and at p <= 0.01 where both runs recorded them."""
    projection, baselines = [], []
    for a in runs.values():
        real = {r["method"]: _measures(r["real"]) for r in a["runs"] if r["real"]["n"]}
        if "openstamp" not in real:
            continue
        label = f"{a['settings'].get('prompt', 'paper')} prompt"
        if _by_cost(a):  # one comparison per cost and key
            seeds = "/".join(f"s{seed}" for seed in sorted({r["seed"] for r in a["runs"]}))
            label += f" at {a['settings']['at_cost']:+.0%} own PPL, {seeds}"
        gaps = {}  # method -> decision (starred where redrawn) -> (gap, low, high)
        for m, r in real.items():
            if m == "openstamp":
                continue
            redraw = _both(_runs_of(a, "openstamp"), _runs_of(a, m))
            gaps[m] = {
                _starred(k, redraw): _gap(k, real["openstamp"][k], v, redraw)
                for k, v in r.items()
                if k in real["openstamp"]
            }
        if "openstamp-nosem" in gaps:
            said = [f"{k} {_said(*gap)}".strip() for k, gap in gaps.pop("openstamp-nosem").items()]
            projection.append(f"{label}: " + ", ".join(said))
        if gaps:
            cells = [
                f"{m} " + ", ".join(f"{k} {_said(*gap, plain=True)}".strip() for k, gap in by.items())
                for m, by in gaps.items()
            ]
            baselines.append(f"With the {label}: " + "; ".join(cells) + ".")
    lines, starred = [], REDRAWN if any("*" in line for line in projection + baselines) else ""
    if projection:
        lead = (
            "The projection's effect (OpenStamp minus no projection, near-copies excluded, Newcombe's 95% interval "
            f"for a difference of two rates{starred}): "
        )
        lines += ["", lead + "; ".join(projection) + "."]
    if baselines:
        strength = (
            "each at the strength nearest the cost (own PPL column above)"
            if any(_by_cost(a) for a in runs.values())
            else "each at its default strength (their costs differ: the own PPL column above, and the sweep)"
        )
        lead = (
            f"OpenStamp minus each baseline, near-copies excluded, {strength}, with Newcombe's 95% interval"
            f"{starred}; '(resolved)' where it leaves out 0. "
        )
        lines += ["", lead + " ".join(baselines)]
    return lines


def paraphrase_baselines(folder: Path, shown: str) -> list[str]:
    """Every method after paraphrase at equal cost, each key's kept paraphrases counted together (the cost stage,
    ``folder/cost``, on the sweep's seeds): one table per prompt and cost run on two keys or more."""
    cost, sweep = _load(folder / "cost"), sum(at_cost_evals(folder.parent), [])
    if not cost or not sweep:
        return []
    return _pooled_keys(
        cost, attack_costs(cost, sweep, f"{shown}/cost"), sweep[0]["config"]["new_tokens"], f"{shown}/cost"
    )


def at_cost_evals(results_root: Path) -> tuple[list[dict], list[dict]]:
    """The evals the at-cost stages attacked (``results_root``: benchmarks/results): the sweep's kept seeds (which the
    first results attacked, and which a result without ``eval_created`` is paired with), and those the stages kept in
    sweep/rerun (:data:`RERUN`), each a seed's eval run again on another machine. A rerun that reproduces a kept seed
    (on a CPU like the sweep's: :func:`_reproduces`) is that seed, and goes with the kept ones."""
    kept = [json.loads(p.read_text()) for p in sorted((results_root / "sweep" / "seeds").glob("s*/results.json"))]
    rerun = [json.loads(p.read_text()) for p in sorted((results_root / "sweep" / "rerun").glob("s*/results.json"))]
    same = [ev for ev in rerun if any(_reproduces(ev, k) for k in kept)]
    return kept + same, [ev for ev in rerun if all(ev is not s for s in same)]


def _reproduces(ev: dict, kept: dict, atol: float = 1e-5) -> bool:
    """Whether eval ``ev`` holds the runs of ``kept``, every score of each (watermarked, human, unwatermarked) within
    ``atol``: the same keys and text, run again."""
    ours, theirs = ({r["run"]: r["scores"] for r in e["runs"]} for e in (ev, kept))
    if ours.keys() != theirs.keys():
        return False
    for run, scores in theirs.items():
        if scores.keys() != ours[run].keys():
            return False
        for part, values in scores.items():
            a, b = (np.asarray(v, dtype=float) for v in (ours[run][part], values))
            if a.shape != b.shape or not np.allclose(a, b, rtol=0, atol=atol, equal_nan=True):
                return False
    return True


def _pooled_keys(attacks: dict, costs: dict[str, dict], new_tokens: int, shown: str) -> list[str]:
    """The table of :func:`paraphrase_baselines`: per method, its runs' mean own PPL change, the paraphrases and the
    kept ones, the kept flagged by each decision with an exact interval, and OpenStamp minus it (Newcombe's interval,
    or at their lengths the bootstrap of :func:`_gap` where every key of both kept the scores)."""
    groups: dict[tuple, list[tuple[str, dict]]] = {}  # (prompt, cost) -> [(name, attack results)]
    for name, a in attacks.items():
        if a.get("attack") == "paraphrase" and _has_real(a) and _by_cost(a):
            groups.setdefault((a["settings"].get("prompt", "paper"), a["settings"]["at_cost"]), []).append((name, a))
    lines = []
    for (prompt, at), group in sorted(groups.items()):
        seeds = sorted({r["seed"] for _, a in group for r in a["runs"]})
        pooled: dict[str, dict] = {}  # method -> paraphrased, costs, and per decision [flagged, kept]
        for name, a in group:
            for run in a["runs"]:
                entry = pooled.setdefault(run["method"], {"n": 0, "costs": [], "by": {}, "runs": []})
                entry["runs"].append(run)
                entry["n"] += a["quality"][run["generations"]]["n"]
                entry["costs"] += [costs[name][run["run"]]] if run["run"] in costs[name] else []
                for decision, (hits, n) in _measures(run["real"]).items() if run["real"]["n"] else ():
                    tally(entry["by"], decision, hits, n)
        if len(seeds) < 2 or "openstamp" not in pooled:
            continue
        ours = pooled["openstamp"]["by"]
        everywhere = _redrawn([run for _, a in group for run in a["runs"]]) is not None
        rows, verdicts = [], {}  # above/below -> method -> the decisions that resolve it
        for m, entry in pooled.items():
            by = entry["by"]
            kept = by[""][1] if "" in by else 0
            cells = [_rate(*by[k]) if k in by else "-" for k in ("at p <= 0.01", "at their lengths", "")]
            gaps, redraw = [], _both(pooled["openstamp"]["runs"], entry["runs"])
            for k in ("at p <= 0.01", "at their lengths"):
                if m == "openstamp" or k not in by or k not in ours:
                    gaps.append("-")
                    continue
                gap = _gap(k, ours[k], by[k], redraw)
                gaps.append(_said(*gap, plain=True, mark="*" if _starred(k, redraw) != k else ""))
                if gap[1] > 0 or gap[2] < 0:
                    where = verdicts.setdefault("above" if gap[1] > 0 else "below", {})
                    where.setdefault(m, []).append(_starred(k, redraw))
            ppl = f"{np.mean(entry['costs']):+.1%}" if entry["costs"] else "-"
            rows.append(f"| {m} | {ppl} | {kept} of {entry['n']} | " + " | ".join(cells + gaps) + " |")
        said = [
            f"{where}: " + ", ".join(f"{m} ({' and '.join(ks)})" for m, ks in by.items())
            for where, by in sorted(verdicts.items())
        ]
        lines += [
            f"Every method after paraphrase at equal cost (`{_para_cost_command(at)}`, "
            f"with `PARA_COST_SEED` for each further key; `{shown}/`): each method at the strength of the sweep's "
            f"grid whose own PPL change is nearest {at:+.0%}, on keys {'/'.join(f's{s}' for s in seeds)}; the first "
            f"{group[0][1]['settings']['n']} completions per key ({new_tokens} new tokens) paraphrased by "
            f"`{group[0][1]['settings']['paraphraser']}` with "
            f"{PROMPTS[prompt]}; near-copies left out, and every key's kept paraphrases counted together, so each "
            "interval is over texts and leaves out how much a rate moves with the key (RESULTS.md has each key)"
            + (
                "; at their lengths (starred) each interval of a difference is a bootstrap that redraws each key's "
                "kept paraphrases and its cut human texts, and with them its threshold (`pooled_tpr_difference_ci`)"
                if everywhere
                else ", and at their lengths the threshold's own error where a run did not keep the scores to redraw "
                "it (unstarred; such an interval calls equal methods different far more often than 5%: "
                "`benchmarks/verdict_coverage.py` in RESULTS.md)"
            )
            + ". At "
            "p <= 0.01 holds at any length; at their lengths takes the threshold at 1% FPR of human text cut to each "
            "paraphrase's length; the full-length threshold flatters methods that score a per-token mean, "
            "OpenStamp among them, on text as short as a paraphrase (RESULTS.md):",
            "",
            "| method | own PPL change | kept of paraphrased | at p <= 0.01 [95% CI] | at their lengths [95% CI] "
            "| at the full-length threshold | OpenStamp minus it, at p <= 0.01 | at their lengths |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Where OpenStamp is resolved above or below a baseline (the interval leaves out 0"
            + (
                ""
                if everywhere
                else "; at their lengths unstarred, an interval without the threshold's own error, which calls equal "
                "methods different far more often than 5%"
            )
            + "): "
            + ("; ".join(said) if said else "nowhere")
            + ".",
            "",
        ]
    return lines


def _kept(real: dict) -> tuple[int, int]:
    """(flagged, kept) of a run's paraphrases that are not near-copies."""
    return round(real["tpr_at_1pct_fpr_after"] * real["n"]), real["n"]


def _at_p(real: dict) -> int:
    """How many of a run's kept paraphrases its detector flags at p <= 0.01 (the p-value holds at every length)."""
    return round(real["flagged_at_p_0.01"] * real["n"])


def tally(counts: dict, key: object, hits: int, n: int) -> None:
    """Add ``hits`` of ``n`` texts to ``counts[key]``, a [hits, texts] pair: a rate pooled over keys counts texts."""
    cell = counts.setdefault(key, [0, 0])
    cell[0] += hits
    cell[1] += n


def eval_of(attack: dict, evals: list[dict], shown: str) -> dict:
    """The eval among ``evals`` that ``attack`` (its results, ``shown`` as the README names the file) attacked: the one
    written at its ``eval_created``, or, for results written before attacks kept it, the first that holds its seeds.
    An eval run again (on another CPU: another key and other text) shares its path and seed, not its numbers, so a
    result that names its eval is never paired with another."""
    wanted, seeds = attack.get("eval_created"), {r["seed"] for r in attack["runs"]}
    for ev in evals:
        if ev["created"] == wanted if wanted else seeds <= set(ev["config"]["seeds"]):
            return ev
    raise ValueError(
        f"{shown} attacked the eval {attack['eval']} "
        + (f"written {wanted}" if wanted else f"of seeds {sorted(seeds)}")
        + ", which is not among the evals kept beside it: keep the eval it attacked (as the at-cost stages do), or run "
        "the attack again"
    )


def attack_costs(attacks: dict[str, dict], evals: list[dict], shown: str) -> dict[str, dict[str, float]]:
    """Per attack (by name), each run's own perplexity change in the eval it attacked (:func:`eval_of`)."""
    return {name: _costs(eval_of(a, evals, f"{shown}/{name}.json")) for name, a in attacks.items()}


def _difference(ours: tuple[int, int], other: tuple[int, int]) -> tuple[float, float, float]:
    """The difference of two rates given as (hits, n), with Newcombe's 95% interval: (gap, low, high)."""
    low, high = rate_difference_ci(*ours, *other)
    return ours[0] / ours[1] - other[0] / other[1], low, high


def _said(gap: float, low: float, high: float, plain: bool = False, mark: str = "") -> str:
    """A difference as the summary writes it (``mark`` after the gap); OpenStamp minus no projection says what the
    projection does."""
    resolved = low > 0 or high < 0
    if plain:
        return f"{gap:+.3f}{mark} [{low:+.3f}, {high:+.3f}]{' (resolved)' if resolved else ''}"
    word = "the projection helps" if low > 0 else "the projection hurts" if high < 0 else "not resolved"
    return f"{gap:+.3f}{mark} [{low:+.3f}, {high:+.3f}] ({word})"


def _has_real(a: dict) -> bool:
    return bool(a.get("runs")) and all("real" in r and "generations" in r for r in a["runs"])


def projection_test(folder: Path, shown: str) -> list[str]:
    """The projection stage (``folder``): OpenStamp against no projection under paraphrase, at one strength where
    their clean-text costs meet, pooled over seeds, per paraphrase prompt; ``shown`` is ``folder`` as the README
    links it."""
    own = folder / "results.json"
    attacks = list(_attacks(folder).values())
    if not own.exists() or not attacks:
        return []
    ev = json.loads(own.read_text())
    cfg, first = ev["config"], attacks[0]["settings"]
    clean = _pooled_clean(ev["runs"])
    strengths = sorted({f"{s['delta']:g}" for s in cfg["method_settings"].values()})
    shrink = sorted({f"{s.get('shrinkage', 0):g}" for s in cfg["method_settings"].values()})
    prompts = sorted(attacks, key=lambda a: a["settings"].get("prompt", "paper"))
    rows = [
        "The projection under paraphrase, at equal cost (`bash benchmarks/reference_runs.sh projection`; "
        f"`{shown}/`): OpenStamp and the no-projection ablation, both with selector shrinkage {'/'.join(shrink)} "
        f"at delta {'/'.join(strengths)}, where the shrinkage stage's curves meet in cost; {cfg['n']} prompts of "
        f"{cfg['prompt_tokens']} tokens, {cfg['new_tokens']} new tokens, seeds "
        f"{', '.join(map(str, cfg['seeds']))}. The first {first['n']} completions of each seed were paraphrased "
        f"by `{first['paraphraser']}` with "
        f"{' and, separately, '.join(PROMPTS[a['settings'].get('prompt', 'paper')] for a in prompts)}, and the "
        f"near-copies (keeping at least {first['near_copy']:g} of the original's token 3-grams) left out, so "
        "neither method is credited for text the paraphraser did not rewrite. TPR@1%FPR is against the eval's "
        "human continuations at each seed's threshold, pooled over the seeds, with an exact 95% interval (it "
        "counts texts, so it leaves out how much keys differ). That threshold comes from human texts as long as "
        "the completions, and the paraphrases run shorter, which makes its rate generous to both methods alike; "
        "the fraction of kept paraphrases flagged at p <= 0.01 needs no threshold and holds at every length. "
        "'At their lengths' splits the two: the human continuations cut to the kept paraphrases' lengths, how many "
        "the full-length threshold flags (1% if length did not matter) and how many have p <= 0.01, and the TPR "
        "with the threshold at 1% FPR of those cut texts. "
        "Beside them, how many human continuations and unwatermarked completions of the original model each "
        "detector flags at p <= 0.01 (1% expected):",
        "",
        "| prompt | method | own PPL change | TPR clean [95% CI] | human / original's texts at p <= 0.01 "
        "| paraphrased | near-copies | cosine | kept | TPR after paraphrase [95% CI] | after, at p <= 0.01 [95% CI] "
        "| human at their lengths: over the threshold / at p <= 0.01 | after, TPR at their lengths [95% CI] "
        "| mean score before / after (kept) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    verdicts, most, lengths, over, redrawn = [], [], [], [], False
    both = ("openstamp", "openstamp-nosem")
    for attack in prompts:
        prompt, after = attack["settings"].get("prompt", "paper"), _pooled_after(attack)
        if not set(both) <= clean.keys() & after.keys():
            continue
        for method in both:
            c, a = clean[method], after[method]
            rows.append(
                f"| {prompt} | {method} | {100 * c['cost']:+.1f}% | {_rate(c['hits'], c['n'])} "
                f"| {' / '.join(f'{f}/{t}' for f, t in c['false'].values())} | {a['n']} "
                f"| {a['near_copies'] / a['n']:.0%} | {a['cosine']:.2f} | {a['kept']} "
                f"| {_rate(a['hits'], a['kept'])} | {_rate(a['p_hits'], a['kept'])} "
                f"| {_cut(a)} | {_rate(a['m_hits'], a['kept']) if a['cut_n'] else '-'} "
                f"| {a['before']:.3f} / {a['after']:.3f} |"
            )
        gap = _pooled_difference(after, "kept")
        at_p = _pooled_difference(after, "kept", "p_hits")
        verdict = f"{prompt} prompt, " + _said(*gap) + ", at p <= 0.01 " + _said(*at_p)
        at_length = ""
        if all(after[m]["cut_n"] for m in both):
            redraw = _both(*(_runs_of(attack, m) for m in both))
            cut = [(after[m]["m_hits"], after[m]["kept"]) for m in both]
            matched = _gap("at their lengths", *cut, redraw)
            verdict += f", and {_starred('at their lengths', redraw)} " + _said(*matched)
            redrawn = redrawn or redraw is not None
            at_length = f", {matched[2]:+.3f} at their lengths"
            over += [after[m]["cut_over"] / after[m]["cut_n"] for m in both]
            flagged = [
                f"{_cut(after[m], ' and ')} ({name})"
                for m, name in zip(both, ("OpenStamp", "no projection"), strict=True)
            ]
            lengths.append(f"{prompt} prompt: " + ", ".join(flagged))
        verdicts.append(verdict)
        most.append(f"{gap[2]:+.3f} TPR ({at_p[2]:+.3f} at p <= 0.01{at_length}) with the {prompt} prompt")
    lead = (
        "The projection's effect at this cost (OpenStamp minus no projection, TPR@1%FPR; 'not resolved' where the "
        "interval holds 0): on clean text, with a bootstrap that redraws each seed's completions and human "
        "continuations, and with them its threshold (`pooled_tpr_difference_ci`), "
    )
    keys = {m: [against(r["scores"]) for r in ev["runs"] if r["method"] == m] for m in both}
    clean_gap = _said(*pooled_tpr_difference_ci(keys["openstamp"], keys["openstamp-nosem"], 0.01))
    kept = (
        f"at p <= 0.01 there is no threshold to redraw{REDRAWN}"
        if redrawn
        else "these results keep no per-text scores to redraw the threshold; at p <= 0.01 there is none to redraw"
    )
    lead_after = (
        "; after paraphrase, with Newcombe's 95% interval for a difference of two rates over the pooled texts "
        f"({kept}), "
    )
    upshot = f"By these intervals, the most the projection buys after paraphrase is {' and '.join(most)}."
    if lengths:
        upshot += (
            " Of the human continuations cut to the kept paraphrases' lengths, the full-length threshold and the "
            f"p-value flag, in turn: {'; '.join(lengths)}."
        )
        if min(over) > 0.01:
            upshot += (
                " At these lengths the full-length threshold flags more than 1% of human text, so the TPR after "
                "paraphrase at it is not a rate at 1% FPR; the columns 'at p <= 0.01' and 'at their lengths' are."
            )
    return rows + ["", lead + clean_gap + lead_after + "; ".join(verdicts) + ". " + upshot, ""]


def _pooled_difference(pooled: dict, n: str, hits: str = "hits") -> tuple[float, float, float]:
    """OpenStamp minus no projection in pooled rates (``n``: the field that counts the texts, ``hits`` the one that
    counts those flagged)."""
    ours, other = pooled["openstamp"], pooled["openstamp-nosem"]
    return _difference((ours[hits], ours[n]), (other[hits], other[n]))


def _rate(hits: int, n: int) -> str:
    low, high = clopper_pearson(hits, n)
    return f"{hits / n:.3f} [{low:.2f}, {high:.2f}]"


def _pooled_clean(runs: list[dict]) -> dict:
    """Per method, over its seeds: the texts flagged at each seed's 1% FPR threshold, the mean own PPL change, and
    the human and unwatermarked texts its detector flags at p <= 0.01 (flagged, texts)."""
    out: dict[str, dict] = {}
    for run in runs:
        m, n = run["metrics"], len(run["scores"]["watermarked"])
        entry = out.setdefault(run["method"], {"hits": 0, "n": 0, "cost": 0.0, "seeds": 0, "false": {}})
        entry["hits"] += round(m["tpr_at_1pct_fpr"] * n)
        entry["n"] += n
        for source in ("human", "unwatermarked"):
            count = len(run["scores"][source])
            flagged, total = entry["false"].get(source, (0, 0))
            entry["false"][source] = flagged + round(m[f"{source}_flagged_at_p_0.01"] * count), total + count
        entry["cost"] += m["own_ppl_change"]
        entry["seeds"] += 1
    for entry in out.values():
        entry["cost"] /= entry["seeds"]
    return out


def _cut(pooled: dict, between: str = " / ") -> str:
    """The human texts cut to the paraphrases' lengths that the full-length threshold and the p-value flag."""
    n = pooled["cut_n"]
    return f"{pooled['cut_over'] / n:.1%}{between}{pooled['cut_p'] / n:.1%}" if n else "-"


def _pooled_after(attack: dict) -> dict:
    """Per method, over its seeds: paraphrases, near-copies, mean cosine, and of the paraphrases kept (not
    near-copies) the number flagged at each seed's 1% FPR threshold, at p <= 0.01 and at the threshold of human text
    cut to their lengths, and their mean score before and after; of the cut human texts, the number and how many
    the full-length threshold and the p-value flag (where the run recorded them)."""
    out: dict[str, dict] = {}
    for run in attack["runs"]:
        q, real = attack["quality"][run["generations"]], run["real"]
        keys = ("n", "near_copies", "cosine", "kept", "hits", "p_hits", "m_hits", "cut_n", "cut_over", "cut_p")
        entry = out.setdefault(run["method"], dict.fromkeys((*keys, "before", "after"), 0))
        entry["n"] += q["n"]
        entry["near_copies"] += round(q["near_copy_fraction"] * q["n"])
        entry["cosine"] += q["cosine_mean"] * q["n"]
        hits, kept = _kept(real)
        entry["kept"] += kept
        entry["hits"] += hits
        entry["p_hits"] += _at_p(real)
        if cut := real.get("human_cut"):
            entry["m_hits"] += _measures(real)["at their lengths"][0]
            entry["cut_n"] += cut["n"]
            entry["cut_over"] += round(cut["over_threshold"] * cut["n"])
            entry["cut_p"] += round(cut["flagged_at_p_0.01"] * cut["n"])
        entry["before"] += real["mean_score_before"] * real["n"]
        entry["after"] += real["mean_score_after"] * real["n"]
    for entry in out.values():
        entry["cosine"] /= entry["n"]
        entry["before"] /= entry["kept"]
        entry["after"] /= entry["kept"]
    return out


def projection_keys(folder: Path, shown: str) -> list[str]:
    """The projection stage's comparison key by key: its own seeds (``folder``) and the projection_keys stage's
    (``folder/keys``), each key one observation, so the interval over keys says what a key not yet drawn can expect;
    per paraphrase prompt."""
    both = ("openstamp", "openstamp-nosem")
    rows, verdicts = [], []
    for prompt in PROMPTS:
        keys: dict[int, dict] = {}
        for part in (folder, folder / "keys"):
            own, attack = part / "results.json", _attacks(part).get(prompt)
            if own.exists() and attack is not None:
                keys.update(_per_key(json.loads(own.read_text()), attack))
        keys = {seed: k for seed, k in sorted(keys.items()) if all("kept" in k.get(m, {}) for m in both)}
        if len(keys) < 3:
            continue
        rows += [
            f"| {prompt} | {seed} | {k['openstamp']['paraphrased']} | "
            + " | ".join(
                f"{k[m]['clean']:.3f} | {k[m]['kept']} | {k[m]['after']:.3f} | {k[m]['p']:.3f} | {_get(k[m])}"
                for m in both
            )
            + f" | {k['openstamp']['after'] - k['openstamp-nosem']['after']:+.3f} |"
            for seed, k in keys.items()
        ]
        verdict = (
            f"{prompt} prompt, over {len(keys)} keys: TPR clean {_over_keys(keys, 'clean')}; "
            f"TPR after paraphrase {_over_keys(keys, 'after')}; at p <= 0.01 after paraphrase {_over_keys(keys, 'p')}"
        )
        if all("matched" in k[m] for k in keys.values() for m in both):
            verdict += f"; TPR after paraphrase at their lengths {_over_keys(keys, 'matched')}"
        verdicts.append(verdict)
    if not rows:
        return []
    return [
        f"The projection key by key (`bash benchmarks/reference_runs.sh projection projection_keys`; `{shown}/` and "
        f"`{shown}/keys/`): the same eval and paraphraser on more keys (seeds), each key's first completions "
        "paraphrased (how many in its row). A key is one draw of the secret and of the trained selector, so each key "
        "is one observation here, and the interval is Student's t over keys: it includes how much keys differ, which "
        "the pooled intervals above leave out. TPR@1%FPR is at each key's threshold from its human continuations; "
        "'at p' is the fraction of kept paraphrases flagged at p <= 0.01, and 'at length' their TPR with the threshold "
        "at 1% FPR of the human continuations cut to their lengths:",
        "",
        "| prompt | seed | paraphrased | OpenStamp TPR clean | kept | TPR after | at p | at length "
        "| no projection TPR clean | kept | TPR after | at p | at length | OpenStamp minus no projection, TPR after |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "OpenStamp minus no projection (the mean of the per-key differences, with its 95% t interval): "
        + "; ".join(verdicts)
        + ".",
        "",
    ]


def _attacks(folder: Path) -> dict[str, dict]:
    """The paraphrase runs among ``folder``'s results by prompt (the projection stage keeps its runs in attacks/,
    the projection_keys stage beside its eval)."""
    out = {}
    for attack in (*_load(folder / "attacks").values(), *_load(folder).values()):
        if attack.get("attack") == "paraphrase" and _has_real(attack):
            out[attack["settings"].get("prompt", "paper")] = attack
    return out


def _per_key(ev: dict, attack: dict) -> dict[int, dict]:
    """Per seed and method: TPR@1%FPR on clean text, and of the kept paraphrases their number, TPR@1%FPR and the
    fraction flagged at p <= 0.01."""
    out: dict[int, dict] = {}
    for run in ev["runs"]:
        out.setdefault(run["seed"], {})[run["method"]] = {"clean": run["metrics"]["tpr_at_1pct_fpr"]}
    for run in attack["runs"]:
        real, entry = run["real"], out[run["seed"]][run["method"]]
        paraphrased = attack["quality"][run["generations"]]["n"]
        if real["n"]:
            entry.update(paraphrased=paraphrased, kept=real["n"], after=real["tpr_at_1pct_fpr_after"])
            entry["p"] = real["flagged_at_p_0.01"]
            if cut := real.get("human_cut"):
                entry.update(matched=cut["tpr_at_1pct_fpr"], over=cut["over_threshold"])
    return out


def _get(entry: dict) -> str:
    """A key's TPR after paraphrase at the threshold of human text cut to the paraphrases' lengths, if recorded."""
    return f"{entry['matched']:.3f}" if "matched" in entry else "-"


def _over_keys(keys: dict[int, dict], field: str) -> str:
    """The mean over keys of OpenStamp minus no projection in ``field``, with Student's t 95% interval."""
    gaps = np.array([k["openstamp"][field] - k["openstamp-nosem"][field] for k in keys.values()])
    low, high = t_dist.interval(0.95, len(gaps) - 1, loc=gaps.mean(), scale=gaps.std(ddof=1) / np.sqrt(len(gaps)))
    return _said(float(gaps.mean()), float(low), float(high))
