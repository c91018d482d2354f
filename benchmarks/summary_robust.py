"""The README's robustness table: every attack's results.json under benchmarks/results/eval/attacks."""

from __future__ import annotations

import json
from pathlib import Path


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
    for name, suffix in (("quant", ""), ("quant-head", " incl. lm_head")):
        quant = attack.get(name, {})
        how = quant.get("quantization", {})  # per label: backend, head quantized (newer runs)
        for label in dict.fromkeys(s["scheme"] for s in quant.get("summary", []) if s["scheme"] != "unquantized"):
            values = {s["method"]: cell(s) for s in quant["summary"] if s["scheme"] == label}
            if label in how:
                head = "lm_head quantized" if how[label]["head_quantized"] else "float lm_head"
                title = f"{label.upper()} ({how[label]['backend']}, {head})"
            else:
                title = f"{label.upper()}{suffix} (simulated)"
            columns.append((title, quant.get("n"), values))
    if "para" in attack:
        para = attack["para"]
        label = f"paraphrased ({para['settings']['paraphraser']})"
        columns.append(
            (label, para["settings"]["n"], {s["method"]: cell(s, "tpr_at_1pct_fpr_after") for s in para["summary"]})
        )
    if "ft" in attack:
        ft = attack["ft"]
        last = max(s["step"] for s in ft["summary"])
        label = f"{ft['settings']['mode']} fine-tuning, {last} steps"
        columns.append((label, ft["n"], {s["method"]: cell(s) for s in ft["summary"] if s["step"] == last}))
    columns += _weight_attack_columns(attack)
    methods = list(dict.fromkeys(m for _, _, values in columns for m in values))
    rows = [
        f"Robustness ({source}): TPR@1%FPR against the eval's human continuations after "
        "each attack, n watermarked texts per column in the header; [mean detector score] beside a saturated "
        "1.000 where the attack recorded it; '-' where an attack does not apply or was not run (weight attacks "
        "and fine-tuning do not apply to decode-time KGW).",
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
        r = attack["reinit"]
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
        rows += ["", text + "."]
    if "inversion" in attack:
        conditions = "; ".join(
            f"{c['condition'].lower()}: ARI {c['ari']:.2f}, NMI {c['nmi']:.2f}"
            for c in attack["inversion"]["conditions"]
        )
        rows += ["", f"Rebuilding the selector S without the owner's corpus or seed: {conditions}."]
    return rows


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
