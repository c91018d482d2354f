"""docs/results.md's tables of the second model (Qwen2.5-Coder-0.5B) beside the first (SmolLM2-135M): its frontier
point by point, and each method's reading at equal cost on both. Each is a function from the results folder to
markdown lines (render.py)."""

from __future__ import annotations

from pathlib import Path

from attack_tables import pooled_paraphrase
from common import COST, TPR, pct, rate, read, sweep, table, variant_name

from openstamp.lab.evaluation.pareto import at_equal_cost

STRICT = "tpr_at_0.1pct_fpr"
FRONTIER = "qwen05/frontier"  # benchmarks/results/<FRONTIER>/: the qwen_frontier stage's merge, or its kept seeds
PARAPHRASE = "qwen05/paraphrase"  # the qwen_paraphrase stage's attacks, one file a prompt


def second_model(root: Path) -> dict:
    """The qwen_frontier stage's results (the merge of its seeds, else its one kept seed), each OpenStamp method named
    by its settings as the first model's kept variants are (``variant_name``), with Unremovable's LLR rescoring
    (``llr``: (method, strength) -> TPR@1%FPR over the seeds rescored; ``llr_summary``: those points, each as
    '<method> (LLR)')."""
    seeds = sorted((root / FRONTIER / "seeds").glob("s*/results.json"))
    r = frontier_results(root)
    rename = renamer(r["config"]["method_settings"])
    llr, llr_strict = (llr_mean(seeds, metric) for metric in (TPR, STRICT))
    summary = [rename(s) for s in r["summary"]]
    llr_summary = [{**s, "method": f"{s['method']} (LLR)", TPR: {"mean": llr[s["method"], s["strength"]]}}
                   for s in summary if (s["method"], s["strength"]) in llr]  # fmt: skip
    return {**r, "summary": summary, "length_curve": [rename(c) for c in r["length_curve"]], "llr": llr,
            "llr_strict": llr_strict, "llr_summary": llr_summary}  # fmt: skip


def frontier_results(root: Path) -> dict:
    """The qwen_frontier stage's results file: the merge of its seeds, else its first kept seed."""
    merged = root / FRONTIER / "results.json"
    return read(merged if merged.exists() else sorted((root / FRONTIER / "seeds").glob("s*/results.json"))[0])


def renamer(method_settings: dict):
    """A function giving a row each OpenStamp method named by its settings (``variant_name``), as the first model's
    kept variants are; the second model's stages run them with the settings in ``method_settings``."""
    names = {
        m: variant_name(m, s["shrinkage"], s.get("centre", False), s.get("gamma", 0.25))
        for m, s in method_settings.items()
    }
    return lambda row: {**row, "method": names.get(row["method"], row["method"])}


def llr_mean(seeds: list[Path], metric: str) -> dict[tuple, float]:
    """(method, strength) -> the LLR's ``metric`` averaged over the kept seeds' rescorings (llr.json beside each
    results.json) that report it: TPR at 0.1% FPR came to `openstamp analyze llr` after seed 0 was rescored."""
    found: dict[tuple, list[float]] = {}
    for path in (p.parent / "llr.json" for p in seeds):
        for row in read(path)["rows"] if path.exists() else []:
            if metric in row["llr"]:
                found.setdefault((row["method"], row["strength"]), []).append(row["llr"][metric])
    return {point: sum(values) / len(values) for point, values in found.items()}


def curve_at(r: dict, tokens: int) -> dict[tuple, float]:
    """(method, strength) -> TPR@1%FPR of the texts cut to ``tokens`` (the length curve)."""
    return {(c["method"], c["strength"]): c[TPR] for c in r["length_curve"] if c["tokens"] == tokens}


def at_length(r: dict, tokens: int) -> list[dict]:
    """The summary's points with TPR@1%FPR read at ``tokens`` (the length curve) instead of the full length."""
    tprs = curve_at(r, tokens)
    return [{**s, TPR: {"mean": tprs[s["method"], s["strength"]]}} for s in r["summary"]]


def qwen_frontier(root: Path) -> list[str]:
    """Every point of the second model's frontier: cost (own and oracle perplexity) and TPR at 64 and 200 tokens."""
    r = second_model(root)
    tokens, short_tokens = r["config"]["new_tokens"], min(c["tokens"] for c in r["length_curve"])
    cut = curve_at(r, short_tokens)
    rows = []
    for s in r["summary"]:
        point = s["method"], s["strength"]
        rows.append(
            [s["method"], f"{s['strength']:g}", pct(s[COST]["mean"]), f"{s['ppl_median']['mean']:.1f}",
             rate(cut[point]), rate(s[TPR]["mean"]), rate(s[STRICT]["mean"]), rate(r["llr"].get(point)),
             rate(r["llr_strict"].get(point))]
        )  # fmt: skip
    header = ["method", "strength", "own PPL change", "oracle PPL (median)", f"TPR@1%FPR, {short_tokens} tokens",
              f"TPR@1%FPR, {tokens}", f"TPR@0.1%FPR, {tokens}", f"LLR TPR@1%FPR, {tokens}",
              f"LLR TPR@0.1%FPR, {tokens}"]  # fmt: skip
    return table(header, rows)


def both_models(root: Path, cost: float = 0.05, target: float = 0.95) -> list[str]:
    """Each method of the second model's frontier at ``cost`` own PPL, and the own PPL change that buys TPR
    ``target``: on the first model at its sweep's length (from the frontier stage's sweep and kept variants,
    common.sweep), on the second at that length (its length curve) and at its full length."""
    first, second = sweep(root), second_model(root)
    short, full = first["config"]["new_tokens"], second["config"]["new_tokens"]
    readings = [("SmolLM2", first["summary"], short), ("Qwen", at_length(second, short), short),
                ("Qwen", second["summary"] + second["llr_summary"], full)]  # fmt: skip
    rows = []
    for method in dict.fromkeys(s["method"] for s in readings[-1][1]):
        cells = [method]
        for _, summary, _ in readings:
            if not any(s["method"] == method for s in summary):
                cells += ["-", "-"]
                continue
            read_ = at_equal_cost(summary, method, COST, (cost,), target)
            reach, curve = read_["cost"][0], read_["curve"]
            cells += [rate(read_["tpr"][0][0]), pct(reach) if reach is not None else f"above {pct(curve[-1][0])}"]
        rows.append(cells)
    header = ["method"]
    for model, _, tokens in readings:
        header += [f"{model}, {tokens} tokens: TPR@1%FPR at {pct(cost)}", f"own PPL for {target:g}"]
    return table(header, rows)


def qwen_paraphrase(root: Path) -> list[str]:
    """Paraphrase on the second model, pooled over its keys as the first model's table is (attack_tables): the
    OpenStamp methods were keyed with the frontier's settings (reference_runs.sh's QWEN_KEY, shared by both stages)."""
    rename = renamer(frontier_results(root)["config"]["method_settings"])
    attacks = [read(f) for f in sorted((root / PARAPHRASE).glob("*.json"))]
    for a in attacks:
        a["runs"] = [rename(run) for run in a["runs"]]
    return pooled_paraphrase(attacks)
