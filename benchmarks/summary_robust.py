"""The README's robustness table: every attack's results.json under benchmarks/results/eval/attacks."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from summary_para import AT_COST_DEFAULT, RERUN, _difference, at_cost_evals, eval_of, tally

from openstamp.evaluation.metrics import pooled_tpr_difference_ci
from openstamp.evaluation.results import against

# The commit that re-tied tied models' releases by default and made m exact (e33b98b): attacks and evals
# created before it measured untied OpenStamp releases.
RETIED_FROM = "2026-11-24T05:13:56+00:00"


def _stale(attack: dict) -> str:
    """Name the attacks run before the re-tie: they attacked an earlier eval run's untied releases."""
    old = sorted((name, a["created"][:10]) for name, a in attack.items() if a.get("created", "") < RETIED_FROM)
    if not old:
        return ""
    return (
        " Run before tied models were re-tied, against an earlier eval run's untied OpenStamp releases, and not "
        "re-run since: " + ", ".join(f"{name} ({day})" for name, day in old) + "; where a later run with the same "
        "settings (a folder named like it, with a suffix) shares the column, its methods' rows are current; "
        "methods neither run had are '-'."
    )


def _family(attack: dict, name: str) -> list[tuple[str, dict]]:
    """The results of attack ``name`` and of its ``name-*`` folders, oldest first."""
    names = sorted((k for k in attack if k == name or k.startswith(f"{name}-")), key=lambda k: attack[k]["created"])
    return [(k, attack[k]) for k in names]


def robustness(folder: Path, source: str = "`bash benchmarks/reference_runs.sh`") -> list[str]:
    """TPR@1%FPR of every method after each attack (one table), then the head re-training and S inversion.

    Each column states its n; where TPR saturates at 1.000 and the attack recorded it, the mean
    detector score follows in brackets, so a weakening that TPR cannot show still shows.
    """
    attack = {f.stem: json.loads(f.read_text()) for f in sorted((folder / "attacks").glob("*.json"))}
    if not attack:
        return []

    def cell(s: dict, key: str = "tpr_at_1pct_fpr") -> tuple:
        score = s.get("mean_score")
        return s[key]["mean"], (score or {}).get("mean") if isinstance(score, dict) else score

    columns: list[tuple[str, object, dict]] = []  # (label, n, {method: (tpr, mean score)})
    if "edit" in attack:
        e, rows = attack["edit"]["settings"], attack["edit"]["summary"]
        n = attack["edit"].get("n") or json.loads((folder / "results.json").read_text())["config"]["n"]
        columns.append(("none", n, {s["method"]: cell(s, "tpr_at_1pct_fpr_before") for s in rows}))
        label = f"{e['delete']:.0%} deleted, {e['substitute']:.0%} substituted tokens"
        columns.append((label, n, {s["method"]: cell(s, "tpr_at_1pct_fpr_after") for s in rows}))
    # quant, para and ft, each with its <name>-* folders (quant-head; methods attacked later with the same settings):
    # one column per setting, a method's newest result where two folders hold it
    merged: dict[tuple, dict] = {}  # (label, n) -> {method: cell}
    for name, quant in _family(attack, "quant"):
        how = quant.get("quantization", {})  # per label: backend, head quantized (newer runs)
        for label in dict.fromkeys(s["scheme"] for s in quant["summary"] if s["scheme"] != "unquantized"):
            if label in how:
                head = "lm_head quantized" if how[label]["head_quantized"] else "float lm_head"
                title = f"{label.upper()} ({how[label]['backend']}, {head})"
            else:
                title = f"{label.upper()}{' incl. lm_head' if name == 'quant-head' else ''} (simulated)"
            values = {s["method"]: cell(s) for s in quant["summary"] if s["scheme"] == label}
            merged.setdefault((title, quant.get("n")), {}).update(values)
    for _, para in _family(attack, "para"):
        prompt = para["settings"].get("prompt", "paper")
        label = f"paraphrased ({para['settings']['paraphraser']}{'' if prompt == 'paper' else f', {prompt} prompt'})"
        values = {s["method"]: cell(s, "tpr_at_1pct_fpr_after") for s in para["summary"]}
        merged.setdefault((label, para["settings"]["n"]), {}).update(values)
    for _, ft in _family(attack, "ft"):
        last = max(s["step"] for s in ft["summary"])
        label = f"{ft['settings']['mode']} fine-tuning, {last} steps"
        values = {s["method"]: cell(s) for s in ft["summary"] if s["step"] == last}
        merged.setdefault((label, ft["n"]), {}).update(values)
    columns += [(label, n, values) for (label, n), values in merged.items()]
    columns += _weight_attack_columns(attack)
    methods = list(dict.fromkeys(m for _, _, values in columns for m in values))
    rows = [
        f"Robustness ({source}): TPR@1%FPR against the eval's human continuations after "
        "each attack, n watermarked texts per column in the header; [mean detector score] beside a saturated "
        "1.000 where the attack recorded it; '-' where an attack does not apply or was not run (weight attacks "
        "and fine-tuning do not apply to decode-time KGW)." + _stale(attack),
        "",
        "| method | " + " | ".join(f"{name} (n {n})" for name, n, _ in columns) + " |",
        "|---|" + "---:|" * len(columns),
    ]
    for m in methods:
        cells = []
        for _, _, values in columns:
            tpr, score = values.get(m, (None, None))
            text = "-" if tpr is None else f"{tpr:.3f}"
            if tpr is not None and tpr >= 1.0 and score is not None:
                text += f" [{score:.3f}]"
            cells.append(text)
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
    rows += _quality(attack)
    if "reinit" in attack:
        rows += reinit_line(attack["reinit"])
    if "inversion" in attack:
        conditions = "; ".join(
            f"{c['condition'].lower()}: ARI {c['ari']:.2f}, NMI {c['nmi']:.2f}"
            for c in attack["inversion"]["conditions"]
        )
        rows += ["", f"Rebuilding the selector S without the owner's corpus or seed: {conditions}."]
    if "ft-distilled" in attack:
        rows += fade_table(attack["ft-distilled"])
    return rows


def fade_table(r: dict) -> list[str]:
    """Further fine-tuning of KGW-distilled beside OpenStamp: TPR@1%FPR [mean score] at each checkpoint."""
    cfg = r["settings"]
    steps = sorted({s["step"] for s in r["summary"]})
    by = {(s["method"], s["step"]): s for s in r["summary"]}
    rows = [
        "",
        f"Fine-tuning after distillation (`bash benchmarks/reference_runs.sh fade`): Gu et al. find that a "
        f"distilled watermark fades when the model is fine-tuned further. The same {cfg['mode']} fine-tuning "
        f"({cfg['optimizer']}, lr {cfg['lr']:g}, {cfg['batch_size']} x {cfg['seq_len']} tokens a step, "
        f"{cfg['corpus']}) on both releases; TPR@1%FPR against the eval's human continuations [mean detector "
        f"score; the scores of different methods are on different scales] after each number of steps, n {r['n']}, "
        "and the training loss:",
        "",
        "| method | " + " | ".join(f"step {t}" for t in steps) + " |",
        "|---|" + "---:|" * len(steps),
    ]
    for m in dict.fromkeys(s["method"] for s in r["summary"]):
        cells = []
        for t in steps:
            s = by.get((m, t))
            if s is None:
                cells.append("-")
                continue
            loss = (s.get("train_loss") or {}).get("mean")
            text = f"{s['tpr_at_1pct_fpr']['mean']:.3f} [{s['mean_score']['mean']:.3f}]"
            cells.append(text + (f", loss {loss:.2f}" if loss is not None else ""))
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
    return rows


def reinit_line(r: dict) -> list[str]:
    """The head re-training attack in one sentence: perplexity before, right after re-initialisation, after."""
    last = r["history"][-1]
    seen = r.get("train_tokens_distinct")
    distinct = f", {seen:,} distinct tokens of {r['settings']['corpus']}" if seen else ""
    text = (
        f"Re-initialising lm_head and retraining only it ({last['step']} steps, {last['tokens']:,} tokens"
        f"{distinct}): held-out perplexity {r['baseline_ppl']:.1f} with the watermarked head, "
        f"{r['history'][0]['ppl']:,.0f} right after re-initialisation, {last['ppl']:.1f} after training"
    )
    if "plateau_step" in r:
        gain = r["last_interval_gain"]
        text += (
            f" ({r['final_over_baseline']:.2f}x the watermarked model's; within {r['plateau_tolerance']:.0%} of "
            f"that from step {r['plateau_step']:,}; the last interval still gained {gain:.1%})"
        )
    return ["", text + "."]


def _weight_attack_columns(attack: dict) -> list[tuple[str, object, dict]]:
    """Merging (SLERP and linear at t 0.5, TIES/DARE), pruning (50%) and instruction tuning (last checkpoint)."""

    def cell(s: dict) -> tuple:
        score = s.get("mean_score") or {}
        return s["tpr_at_1pct_fpr"]["mean"], score.get("mean") if isinstance(score, dict) else score

    columns = []
    merge = attack.get("merge")
    if merge:
        for how in dict.fromkeys(s["merge"] for s in merge["summary"]):
            ts = [s["t"] for s in merge["summary"] if s["merge"] == how and s["t"] > 0]
            t = min(ts, key=lambda v: abs(v - 0.5)) if ts else None
            values = {s["method"]: cell(s) for s in merge["summary"] if s["merge"] == how and s["t"] == t}
            if values:
                columns.append((f"{how} merge with the base, t {t:g}", merge["n"], values))
    for name in ("prune-magnitude", "prune", "prune-head"):
        prune = attack.get(name)
        if prune:
            top = max(s["sparsity"] for s in prune["summary"])
            head = " incl. lm_head" if prune["settings"].get("include_head") else ""
            label = f"{prune['settings'].get('pruner', name)} pruning {top:.0%}{head}"
            columns.append(
                (label, prune["n"], {s["method"]: cell(s) for s in prune["summary"] if s["sparsity"] == top})
            )
    instruct = attack.get("instruct")
    if instruct:
        last = max(s["step"] for s in instruct["summary"])
        label = f"{instruct['settings'].get('mode', '')} instruction tuning, {last} steps"
        values = {s["method"]: cell(s) for s in instruct["summary"] if s["step"] == last}
        columns.append((label, instruct["n"], values))
    return columns


def _quality(attack: dict) -> list[str]:
    """The attacked models' own held-out perplexity (merge and prune record it), next to the unattacked one."""
    parts = []
    for name in ("merge", "prune", "prune-magnitude", "prune-head"):
        for s in attack.get(name, {}).get("summary", []):
            ppl = s.get("ppl") or {}
            if ppl.get("mean") is None:
                continue
            setting = (
                f"{s['merge']} t {s['t']:g}" if name == "merge" else f"{s.get('pruner', name)} {s['sparsity']:.0%}"
            )
            parts.append(f"{s['method']} {setting}: {ppl['mean']:.1f}")
    if not parts:
        return []
    base = attack.get("merge", {}).get("with_model_ppl")
    tail = f"; the base model itself: {base:.1f}" if base else ""
    return [
        "",
        "Held-out perplexity of the attacked models (t 0 and 0% are the unattacked releases): "
        + "; ".join(parts)
        + tail
        + ".",
    ]


def durability(folder: Path, source: str) -> list[str]:
    """One long table of every attack setting under ``folder/attacks`` (a row each), methods side by side.

    Rows are grouped by the attack recorded in each results.json (not by file name), so several
    runs of one attack (merge with the base and with a fine-tune; pruning with and without
    lm_head) each add their settings. A cell is TPR@1%FPR, with the mean detector score in
    brackets, then the attacked model's own held-out perplexity where the attack measured it.
    """
    attack = {f.stem: json.loads(f.read_text()) for f in sorted((folder / "attacks").glob("*.json"))}
    if not attack:
        return []
    rows: list[tuple[str, str, object, dict]] = []  # (attack, setting, n, {method: (tpr, score, ppl)})

    def cell(s: dict, key: str = "tpr_at_1pct_fpr") -> tuple:
        score, ppl = s.get("mean_score") or {}, s.get("ppl") or {}
        return s[key]["mean"], score.get("mean"), ppl.get("mean")

    order = ("edit", "quantize", "merge", "prune", "instruct")
    results = sorted((r for r in attack.values() if r.get("attack") in order), key=lambda r: order.index(r["attack"]))
    unattacked = [  # the unattacked releases as the attacks that measure perplexity recorded them
        s
        for r in results
        if r["attack"] in ("merge", "prune")
        for s in r["summary"]
        if not s.get("t", s.get("sparsity"))
    ]
    none = {s["method"]: cell(s) for s in unattacked}
    for r in results:
        kind, summary, n = r["attack"], r.get("summary", []), r.get("n")
        if kind == "edit":
            n = n or json.loads((folder / "results.json").read_text())["config"]["n"]
            none = none or {s["method"]: cell(s, "tpr_at_1pct_fpr_before") for s in summary}
            e = r["settings"]
            setting = f"{e['delete']:.0%} of tokens deleted, {e['substitute']:.0%} substituted"
            rows.append(("edit", setting, n, {s["method"]: cell(s, "tpr_at_1pct_fpr_after") for s in summary}))
        elif kind == "quantize":
            how = r.get("quantization", {})
            for label in dict.fromkeys(s["scheme"] for s in summary if s["scheme"] != "unquantized"):
                info = how.get(label, {})
                head = "lm_head quantized" if info.get("head_quantized") else "float lm_head"
                setting = f"{label.split('+')[0].upper()} ({info.get('backend', 'simulated')}, {head})"
                rows.append(("quantize", setting, n, {s["method"]: cell(s) for s in summary if s["scheme"] == label}))
        elif kind == "merge":
            other = "the base" if r["settings"].get("with_model") is None else f"a fine-tune ({r['with_model']})"
            for how in dict.fromkeys(s["merge"] for s in summary):
                for t in sorted({s["t"] for s in summary if s["merge"] == how and s["t"] > 0}):
                    extra = f", density {r['settings']['density']:g}" if how in ("ties", "dare_ties") else ""
                    values = {s["method"]: cell(s) for s in summary if s["merge"] == how and s["t"] == t}
                    rows.append((f"merge with {other}", f"{how}, t {t:g}{extra}", n, values))
        elif kind == "prune":
            head = ", lm_head too" if r["settings"].get("include_head") else ""
            for sparsity in sorted({s["sparsity"] for s in summary if s["sparsity"] > 0}):
                values = {s["method"]: cell(s) for s in summary if s["sparsity"] == sparsity}
                rows.append(("prune", f"{r['settings']['pruner']} {sparsity:.0%}{head}", n, values))
        elif kind == "instruct":
            mode = r["settings"]["mode"]
            for step in sorted({s["step"] for s in summary if s["step"] > 0}):
                values = {s["method"]: cell(s) for s in summary if s["step"] == step}
                rows.append(("instruction tuning", f"{mode}, step {step}", n, values))
    n = next((r["n"] for r in results if r.get("n")), None)
    rows.insert(0, ("none", "the releases", n, none))
    methods = list(dict.fromkeys(m for *_, values in rows for m in values))
    out = [
        f"Robustness ({source}): one row per attack setting; each cell is TPR@1%FPR against the eval's human "
        "continuations, [the mean detector score], and the attacked model's own held-out perplexity where the "
        "attack measures it ('-' where it does not: quantization, editing and instruction tuning). With n "
        "negatives below 100 the 1% threshold is the largest human score, so TPR is resolution-limited to 1/n; "
        "the mean score shows a weakening that a saturated TPR cannot.",
        "",
        "| attack | setting | n | " + " | ".join(f"{m}: TPR [score] | {m}: ppl" for m in methods) + " |",
        "|---|---|---:|" + "---:|---:|" * len(methods),
    ]
    for kind, setting, n, values in rows:
        cells = []
        for m in methods:
            tpr, score, ppl = values.get(m, (None, None, None))
            text = "-" if tpr is None else f"{tpr:.3f}" + ("" if score is None else f" [{score:.3f}]")
            cells += [text, "-" if ppl is None else f"{ppl:.1f}"]
        out.append(f"| {kind} | {setting} | {n} | " + " | ".join(cells) + " |")
    others = {  # the merges' other endpoint (t 1)
        ("the base" if r["settings"].get("with_model") is None else r["with_model"]): r["with_model_ppl"]
        for r in results
        if r["attack"] == "merge" and r.get("with_model_ppl")
    }
    if others:
        parts = "; ".join(f"{name} {ppl:.1f}" for name, ppl in others.items())
        out += ["", f"Held-out perplexity of the models merged in (t 1): {parts}."]
    if "reinit" in attack:
        out += reinit_line(attack["reinit"])
    return out


# the attacks at equal cost, a table for each group and cost: the reference stages that run them, its variable for
# the key (without _SEED, the one for the cost, whose default is AT_COST_DEFAULT), and what the attacks do
AT_COST = {
    ("edit", "quantize"): (
        "sweep robust_cost",
        "ROBUST_COST_SEED",
        "Token edits re-score every completion; a quantized release completes the first prompts anew (decode-time "
        "methods are left out: quantizing the model leaves their processor alone). Deletions shorten the text, and "
        "the full-length threshold flatters a per-token-mean score on shorter text; the rate at p <= 0.01 holds at "
        "any length.",
    ),
    ("merge", "prune", "finetune"): (
        "sweep_eval durability_cost",
        "DURABILITY_COST_SEED",
        "A release merged linearly with the base (t is the base's weight), pruned with Wanda "
        "in every linear layer of its blocks, or fine-tuned with LoRA on wikipedia completes the first prompts anew "
        "(decode-time methods are left out: their mark is not in the weights); '-' where a key was not attacked.",
    ),
}


def robust_at_cost(
    results_root: Path, per_key: bool = True, attacks: tuple[str, ...] = ("edit", "quantize")
) -> list[str]:
    """The ``attacks`` (a group of :data:`AT_COST`) at equal cost (the robust_cost and durability_cost stages, one
    file per attack, cost and key in ``results_root``/robust_cost; the evals they attacked, a folder per seed, give
    each run's own perplexity change and its clean detection), one section per cost, the costliest first: per run,
    its TPR@1%FPR [95% CI] and the rate at p <= 0.01 before and after each attack, then where OpenStamp is resolved
    above or below a baseline at p <= 0.01 and by TPR@1%FPR (:func:`_verdicts`), each method's keys pooled. Without
    ``per_key`` (the README), one row per method: its mean own PPL change and mean TPR@1%FPR over its keys, and its
    rate at p <= 0.01 over their texts."""
    folder = results_root / "robust_cost"
    by_cost: dict[float, dict[str, dict]] = {}
    for f in sorted(folder.glob("*.json")):
        res = json.loads(f.read_text())
        if res["attack"] in attacks:
            by_cost.setdefault(res["settings"]["at_cost"], {})[f.stem] = res
    kept, rerun = at_cost_evals(results_root) if by_cost else ([], [])
    if not kept + rerun:
        return []
    return [
        line
        for cost in sorted(by_cost, reverse=True)
        for line in _at_cost(by_cost[cost], cost, (kept, rerun), per_key, attacks)
    ]


def _at_cost(
    results: dict[str, dict], cost: float, sweeps: tuple[list, list], per_key: bool, attacks: tuple[str, ...]
) -> list[str]:
    """:func:`robust_at_cost`'s section for ``results``, the attacks at ``cost``, on ``sweeps`` (the kept and rerun
    evals of :func:`at_cost_evals`, read once for every cost)."""
    stage, variable, what = AT_COST[attacks]
    shown = "benchmarks/results/robust_cost"
    kept, rerun = sweeps
    attacked = {name: eval_of(res, kept + rerun, f"{shown}/{name}.json") for name, res in results.items()}
    evals = _attacked_runs(attacked, shown)
    again = sorted(name for name, ev in attacked.items() if any(ev is r for r in rerun))
    if again:
        which = "Each seed's eval is" if len(again) == len(results) else f"{', '.join(again)} attacked"
        what = (
            f"{which} the sweep's, run again on the machine that attacked it and kept under `{RERUN}/`: trained keys "
            f"and sampled text depend on the CPU, so it is not the sweep's kept seed of that number. {what}"
        )
    columns: dict[str, dict] = {}  # label -> {run: (metrics, n)}, each key's attack adding its runs
    for res in results.values():
        if res["attack"] == "edit":
            e = res["settings"]
            by = columns.setdefault(f"{e['delete']:.0%} deleted, {e['substitute']:.0%} substituted", {})
            by.update({row["run"]: (row["after"], evals[row["run"]][1]) for row in res["runs"]})
        elif res["attack"] == "quantize":
            for row in (r for r in res["runs"] if r["scheme"] != "unquantized"):
                label = f"{row['scheme'].upper()} ({res['quantization'][row['scheme']]['backend']})"
                columns.setdefault(label, {})[row["run"]] = row, res["n"]
        elif res["attack"] == "merge":
            for row in (r for r in res["runs"] if r["t"] > 0):
                columns.setdefault(f"{row['merge']} merge, t {row['t']:g}", {})[row["run"]] = row, res["n"]
        elif res["attack"] == "prune":
            for row in (r for r in res["runs"] if r["sparsity"] > 0):
                columns.setdefault(f"{res['settings']['pruner']} {row['sparsity']:.0%}", {})[row["run"]] = row, res["n"]
        elif res["attack"] == "finetune":
            e = res["settings"]
            for row in (r for r in res["runs"] if r["step"] == e["steps"]):
                columns.setdefault(f"{e['mode']} fine-tune, {e['steps']} steps", {})[row["run"]] = row, res["n"]
    order = {run: i for i, run in enumerate(evals)}  # the methods in each sweep eval's order
    runs = sorted(
        dict.fromkeys(run for by in columns.values() for run in by), key=lambda r: (r.split("/")[-1], order[r])
    )
    clean = {  # each run's own completions, their scores kept for the bootstrap of _verdicts
        run: ({**evals[run][0]["metrics"], "scores": evals[run][0]["scores"]["watermarked"]}, evals[run][1])
        for run in runs
    }
    columns = {"none": clean, **columns}

    def cell(entry: tuple | None) -> str:
        if entry is None:
            return "-"
        m = entry[0]
        low, high = m["tpr_at_1pct_fpr_ci"]
        p = m.get("flagged_at_p_0.01")
        return f"{m['tpr_at_1pct_fpr']:.3f} [{low:.2f}, {high:.2f}]" + ("" if p is None else f" ({p:.3f})")

    rows = [
        f"| {run} | {evals[run][0]['metrics']['own_ppl_change']:+.1%} | "
        + " | ".join(cell(by.get(run)) for by in columns.values())
        + " |"
        for run in runs
    ]
    if not per_key:
        rows = _pooled_rows(runs, evals, columns)
    human = {run: ev["scores"]["human"] for run, (ev, _) in evals.items()}
    tpr_verdicts = _verdicts(columns, "tpr_at_1pct_fpr", human)
    new_tokens = next(iter(attacked.values()))["config"]["new_tokens"]
    seeds = sorted({run.split("/")[-1] for run in runs})
    sizes = {label: sorted({n for _, n in by.values()}) for label, by in columns.items()}
    return [
        f"Robustness at equal cost (`{_command(stage, variable, cost)}`, with `{variable}` for each "
        f"further key; `{shown}/`): the sweep's eval{'s' if len(seeds) > 1 else ''} ({', '.join(seeds)}; "
        f"{sizes['none'][0]} prompts, {new_tokens} new tokens), each method at the strength "
        f"of its grid whose own perplexity change is nearest {cost:+.0%}, where the "
        f"default comparison's robustness tables are saturated. {what} Each cell: "
        + (
            "TPR@1%FPR against the eval's human continuations [95% bootstrap interval]"
            if per_key
            else "the mean over the keys of TPR@1%FPR against the eval's human continuations (per key in RESULTS.md)"
        )
        + ", and in parentheses the rate at p <= 0.01"
        + ("" if per_key else " over the keys' texts")
        + ":",
        "",
        f"| {'run' if per_key else 'method'} | own PPL change | "
        + " | ".join(
            f"{label} (n {'/'.join(map(str, sizes[label]))}{'' if per_key else ' a key'})" for label in columns
        )
        + " |",
        "|---|" + "---:|" * (1 + len(columns)),
        *rows,
        "",
        "OpenStamp against each baseline, each method's texts over its keys counted together (Newcombe's 95% interval "
        "for a difference of two rates; only the resolved ones are named). At p <= 0.01: "
        + "; ".join(text for text, _ in _verdicts(columns, "flagged_at_p_0.01"))
        + ". By TPR@1%FPR, each text against its own key's threshold ("
        + _tpr_intervals({redrawn for _, redrawn in tpr_verdicts})
        + "): "
        + "; ".join(text for text, _ in tpr_verdicts)
        + ".",
        "",
    ]


def _command(stage: str, variable: str, cost: float) -> str:
    """The reference command that ran the attacks at ``cost``, naming the cost where it is not the default."""
    command = f"bash benchmarks/reference_runs.sh {stage}"
    return command if cost == AT_COST_DEFAULT else f"{variable.removesuffix('_SEED')}={cost:g} {command}"


def _attacked_runs(attacked: dict[str, dict], shown: str) -> dict[str, tuple[dict, int]]:
    """Each run of the evals that the results attacked (``attacked``: result name -> its eval), as (its results, the
    eval's n); a run of one name in two evals (one seed run on two machines) would pair texts of two keys."""
    runs: dict[str, tuple[dict, int]] = {}
    made: dict[str, str] = {}  # run -> the created time of the eval that holds it
    for name, ev in attacked.items():
        for r in ev["runs"]:
            if made.setdefault(r["run"], ev["created"]) != ev["created"]:
                raise ValueError(
                    f"{shown}/{name}.json attacked the eval of {r['run']} written {ev['created']}, and another result "
                    f"beside it the one written {made[r['run']]}: run them again on one eval"
                )
            runs[r["run"]] = r, ev["config"]["n"]
    return runs


def _tpr_intervals(redrawn: set[bool]) -> str:
    """What the intervals of the TPR verdicts are, for columns whose threshold was redrawn (True) and others."""
    how = []
    if True in redrawn:
        how.append(
            "* marks a bootstrap interval that redraws each key's attacked texts and the eval's human continuations, "
            "and with them the threshold"
        )
    if False in redrawn:
        how.append(
            f"{'unmarked' if True in redrawn else 'the interval'}: Newcombe's, over the texts alone, which leaves out "
            "the threshold's own error, as not every key's results of those attacks keep per-text scores; such an "
            "interval calls equal methods different far more often than 5%, as `benchmarks/verdict_coverage.py` finds"
        )
    return "; ".join(how)


def _verdicts(columns: dict[str, dict], metric: str, human: dict[str, list] | None = None) -> list[tuple[str, bool]]:
    """Per column of :func:`robust_at_cost`, where OpenStamp is resolved above or below a baseline by ``metric`` (a
    rate over texts: the rate at p <= 0.01, or TPR@1%FPR with each key's own threshold), each method's hits and texts
    added over its keys. Newcombe's interval counts the texts alone; for TPR@1%FPR, where ``human`` gives each run's
    human scores and every run of the column kept its texts' scores, the interval is a bootstrap that redraws the
    human texts too, and with them the threshold (``pooled_tpr_difference_ci``). Each verdict comes with whether its
    column was redrawn so."""
    verdicts = []
    for label, by in columns.items():
        pooled: dict[str, list[int]] = {}  # method -> [hits, texts] over its keys
        runs: dict[str, list[tuple]] = {}  # method -> [(positives, negatives)] over its keys, for the bootstrap
        for run, (m, n) in by.items():
            if m.get(metric) is not None:
                tally(pooled, run.split("@")[0], round(m[metric] * n), n)
            if human is not None and m.get("scores") is not None:
                values = {"watermarked": m["scores"], "human": human[run]}
                runs.setdefault(run.split("@")[0], []).append(against(values))
        if "openstamp" not in pooled:
            continue
        redraw = metric == "tpr_at_1pct_fpr" and sum(map(len, runs.values())) == len(by)
        ours = pooled.pop("openstamp")
        said = []
        for method, other in pooled.items():
            if redraw:
                gap, low, high = pooled_tpr_difference_ci(runs["openstamp"], runs[method], 0.01)
            else:
                gap, low, high = _difference(tuple(ours), tuple(other))
            if low > 0 or high < 0:
                said.append(f"{'above' if low > 0 else 'below'} {method} ({gap:+.3f} [{low:+.3f}, {high:+.3f}])")
        verdicts.append(
            (f"{label}{'*' if redraw else ''}: {', '.join(said) if said else 'resolved against none'}", redraw)
        )
    return verdicts


def _pooled_rows(runs: list[str], evals: dict, columns: dict[str, dict]) -> list[str]:
    """One table row per method of ``runs``: its mean own PPL change over its keys, then per column its mean
    TPR@1%FPR over the keys and, in parentheses, its rate at p <= 0.01 over the keys' texts."""
    rows = []
    for method in dict.fromkeys(run.split("@")[0] for run in runs):
        mine = [run for run in runs if run.split("@")[0] == method]
        cost = np.mean([evals[run][0]["metrics"]["own_ppl_change"] for run in mine])
        cells = []
        for by in columns.values():
            entries = [by[run] for run in mine if run in by]
            if not entries:
                cells.append("-")
                continue
            tpr = np.mean([m["tpr_at_1pct_fpr"] for m, _ in entries])
            with_p = [(m["flagged_at_p_0.01"], n) for m, n in entries if m.get("flagged_at_p_0.01") is not None]
            rate = sum(round(p * n) for p, n in with_p) / sum(n for _, n in with_p) if with_p else None
            cells.append(f"{tpr:.3f}" + ("" if rate is None else f" ({rate:.3f})"))
        keys = f"{len(mine)} key{'s' if len(mine) > 1 else ''}"
        rows.append(f"| {method} ({keys}) | {cost:+.1%} | " + " | ".join(cells) + " |")
    return rows


def verdict_coverage(r: dict) -> list[str]:
    """How often each interval of the TPR verdicts calls equal methods different, and resolves a true gap."""
    s = r["settings"]
    cells = [
        f"TPR {row['tpr']:g} against {row['tpr'] - row['gap']:.1f}: Newcombe {row['newcombe']:.1%}, bootstrap "
        f"{row['bootstrap']:.1%}"
        for row in r["rows"]
    ]
    return [
        f"The intervals of the TPR verdicts (`python benchmarks/verdict_coverage.py`): {s['trials']} simulated "
        f"comparisons per cell, two methods on {s['keys']} keys each, {s['positives']} attacked texts and "
        f"{s['negatives']} human texts a key, normal scores; how often a 95% interval leaves out 0 (Newcombe's, over "
        "the texts alone, and the bootstrap that redraws the human texts and so each key's threshold). Where the "
        "true TPRs are equal that is a false call, which a calibrated 95% interval makes in about 5% of comparisons; "
        "elsewhere it is the power to see a true gap of 0.2: " + "; ".join(cells) + ".",
        "",
    ]


def pruned_bias(r: dict) -> list[str]:
    """benchmarks/pruned_bias.py: how pruning changes the model's entropy, Unremovable's gain and the hidden state."""
    s, rows, quartiles = r["settings"], r["rows"], r["unpruned_by_entropy"]
    pruned = [row for row in rows if row["sparsity"] > 0]

    def each(field: str, digits: int) -> str:
        names = ["unpruned" if row["sparsity"] == 0 else f"{row['sparsity']:.0%}" for row in rows]
        return ", ".join(f"{name} {row[field]:.{digits}f}" for name, row in zip(names, rows, strict=True))

    flatter = all(row["mean_entropy"] > rows[0]["mean_entropy"] for row in pruned)
    gains = all(row["mean_gain"] > rows[0]["mean_gain"] for row in pruned)
    rising = all(a["mean_gain"] < b["mean_gain"] for a, b in zip(quartiles, quartiles[1:], strict=False))
    verdict = (
        "So a pruned release, being less sure of the next token, gains more from Unremovable's fixed bias at each "
        "position, and nothing in that mark depends on the hidden states that pruning moves."
        if flatter and gains and rising
        else "These figures do not show that link, so the rise stays unexplained."
    )
    return [
        f"Why Wanda pruning raises Unremovable's detection (`python benchmarks/pruned_bias.py`: {s['model']}, "
        f"{s['windows']} held-out wikipedia windows of {s['seq_len']} tokens, teacher-forced; Wanda as in the prune "
        f"attack; Unremovable's key of seed {s['seed']} at epsilon {s['epsilon']:g}). Unremovable's mark is a fixed "
        "logit bias. At each position its detector gains E_q[n], the keyed noise of the next token expected under "
        "the marked distribution. For a small bias that gain grows as the model's own next-token distribution "
        f"flattens. Mean entropy of that distribution, in nats: {each('mean_entropy', 3)}. Mean E_q[n]: "
        f"{each('mean_gain', 4)}. Within the unpruned model, by quartile of entropy: "
        + ", ".join(f"{q['entropy_from']:.2f}-{q['entropy_to']:.2f} nats {q['mean_gain']:.4f}" for q in quartiles)
        + f". {verdict} OpenStamp's selector reads the final hidden state, and its detector runs the original model. "
        f"The mean cosine of each position's hidden state with the unpruned model's: {each('mean_hidden_cosine', 3)}. "
        "Where it falls, the lists the pruned release favours can differ from the ones the detector looks for; "
        "how often they do is not measured here, nor how much fewer repeated tokens add to the attacked texts' z.",
        "",
    ]
