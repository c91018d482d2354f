"""Tables of provenance beyond one text: is this checkpoint a derivative (verify-model), what a strength for pooled
detection of a source costs, and whether a student carries the mark (radioactivity). Each is a function from the
results folder to markdown lines (render.py)."""

from __future__ import annotations

from pathlib import Path

from common import pct, rate, read, table


def pooled_cost_table(data: dict) -> list[str]:
    """Per source size N (benchmarks/provenance/pooled_cost.py): the delta the tune split chose, its TPR there, and on
    the test split (a fresh key, fresh prompts) the sources detected with their exact interval, the own perplexity
    change with its paired bootstrap interval, and the median pooled p."""
    s = data["settings"]
    chosen = data["tune"]["chosen"]
    rows = []
    for t in data["test"]:
        c = chosen[str(t["texts"])]
        low, high = t["tpr_ci"]
        cost_low, cost_high = t["own_ppl_change_ci"]
        rows.append(
            [
                str(t["texts"]),
                f"{c['delta']:.3g}" + ("" if c["reached"] else " (target not reached)"),
                rate(c["tpr"]),
                f"{t['detected']}/{t['sources']} [{low:.2f}, {high:.2f}]",
                f"{pct(t['own_ppl_change'])} [{pct(cost_low)}, {pct(cost_high)}]",
                f"{t['median_p']:.2g}",
            ]
        )
    header = [
        f"texts per source ({s['tokens']} tokens each)",
        f"delta chosen (tune: {s['target_tpr']:g} of sources at p <= {s['p']:g})",
        "tune TPR",
        "test: sources detected [95% CI]",
        "test: own PPL change [95% CI]",
        "test: median pooled p",
    ]
    return table(header, rows)


def pooled_cost(root: Path, name: str = "pooled_cost") -> list[str]:
    """``pooled_cost_table`` of benchmarks/results/<name>.json."""
    return pooled_cost_table(read(root / f"{name}.json"))


def pooled_cost_grid(root: Path, name: str = "pooled_cost") -> list[str]:
    """The tune split's whole grid (benchmarks/provenance/pooled_cost.py): per delta, the own perplexity change and
    the sources detected at each N, where the chosen rows' 1.000 comes from."""
    data = read(root / f"{name}.json")
    sizes = [str(n) for n in data["settings"]["texts"]]
    rows = [
        [f"{g['delta']:.3g}", pct(g["own_ppl_change"])]
        + [f"{g['by_texts'][n]['detected']}/{g['by_texts'][n]['sources']}" for n in sizes]
        for g in data["tune"]["grid"]
    ]
    return table(["delta", "tune: own PPL change", *(f"detected, {n} texts" for n in sizes)], rows)


COLUMNS = (1, 8, 16, 32, 128)  # texts pooled, where the run has them
LABELS = {
    "wm100": "student, 100% watermarked training text",
    "wm10": "student, 10% watermarked training text",
    "wm0": "student, human training text (null)",
    "teacher": "the release itself (reference)",
    "base": "the base model, not fine-tuned (null)",
}


def radioactivity_table(data: dict) -> list[str]:
    """Rows: each student and reference; columns: the tokens scored when k of its texts are pooled (a few k), and
    the largest k with ``dedupe``; cells: the pooled p-value (%.1e), '-' where not measured."""
    sources = data["sources"]
    found = sorted({r["k"] for s in sources.values() for r in s["rows"]})
    ks = [k for k in found if k in COLUMNS] or found
    if found and found[-1] not in ks:
        ks.append(found[-1])

    def tokens(k: int) -> int:  # the column's tokens: the first source that pooled k texts
        return next(r["n_tokens"] for s in sources.values() for r in s["rows"] if r["k"] == k)

    def cell(row: dict | None) -> str:
        if row is None or row.get("p_value") is None:
            return "-"
        return f"{row['p_value']:.1e}"

    header = ["source", *(f"{k} texts ({tokens(k)} tokens)" for k in ks), "largest set, deduplicated"]
    rows = []
    for name, s in sources.items():
        by_k = {r["k"]: r for r in s["rows"]}
        dedupe = s.get("dedupe")
        last = "-" if dedupe is None else f"{cell(dedupe)} ({dedupe['n_tokens']} tokens)"
        rows.append([LABELS.get(name, name), *(cell(by_k.get(k)) for k in ks), last])
    return table(header, rows)


def radioactivity(root: Path, name: str = "radioactivity") -> list[str]:
    """``radioactivity_table`` of benchmarks/results/<name>.json."""
    return radioactivity_table(read(root / f"{name}.json"))


def verify_robustness(root: Path, name: str = "verify_robustness") -> list[str]:
    """verify-model against each derivative of one re-tied release: the largest p, the share of the offset found,
    and each matrix alone (``benchmarks/provenance/weights_robustness.py``). A merge's row folds its keeps."""
    data = read(root / f"{name}.json")
    groups: dict[str, list[dict]] = {}
    for r in data["rows"]:
        label = r["derivative"].rsplit("-", 1)[0] if r["family"] == "merge" else r["derivative"]
        groups.setdefault(label, []).append(r)
    rows = []
    for label, group in groups.items():
        first = group[0]
        kept = "/".join(f"{r['release_kept']:g}" for r in group) if first["release_kept"] is not None else ""
        rows.append(
            [label, first["family"], kept, f"{max(r['p_value'] for r in group):.1e}"]
            + ["/".join(f"{r['share']:.2f}" for r in group)]
            + [f"{max(r['p_head'] for r in group):.1e}", f"{max(r['p_embed'] for r in group):.1e}"]
        )
    header = ["derivative", "attack", "release kept", "p (largest)", "share", "p, lm_head alone"]
    header += ["p, input embeddings alone"]
    return table(header, rows, text_columns=2)


def verify_null(root: Path, name: str = "verify_robustness") -> list[str]:
    """verify-model's permutation p-value against random secrets on real derivatives: the FPR per alpha."""
    null = read(root / f"{name}.json")["null"]
    rows = []
    for alpha, entry in null["by_alpha"].items():
        low, high = entry["ci"]
        worst = max(entry["per_derivative"].values())
        rows.append(
            [alpha, f"{entry['flagged']} / {entry['tests']}", f"{entry['fpr']:.4f} [{low:.4f}, {high:.4f}]"]
            + [f"{worst} / {null['secrets']}"]
        )
    header = ["alpha", "flagged", "FPR [95% CI]", "most flagged, one derivative"]
    return table(header, rows)


def pool_reference(root: Path, name: str = "pool_reference") -> list[str]:
    """One key's pooled FPR on human text, raw and with a same-domain reference subtracted
    (benchmarks/provenance/pool_reference.py): per pool source and size, the rate over every key's pools at each
    alpha, the lowest and highest key, and the spread's chi-square p across keys."""
    data = read(root / f"{name}.json")
    labels = {"test": "Wikipedia (other articles)", "news": "news (another domain)"}
    rows = []
    for source, by_size in data["pools"].items():
        for size, by_rule in by_size.items():
            for rule in ("raw", "corrected"):
                cells = [labels[source], size, rule]
                for f in by_rule[rule].values():
                    cells += [f"{f['pooled_fpr']:.3f}", f"{f['min_fpr']:.2f}-{f['max_fpr']:.2f}"]
                cells.append(f"{by_rule[rule]['0.05']['dispersion_p']:.3f}")
                rows.append(cells)
    first = next(iter(next(iter(data["pools"].values())).values()))["raw"]
    header = ["pools of", "texts a pool", "rule"]
    for alpha in first:
        header += [f"FPR at {alpha}", "keys"]
    header.append("spread p at 0.05")
    return table(header, rows, text_columns=3)
