"""The tables of docs/results.md and of the docs pages that quote a benchmark (scaling, security, detection, design,
evaluation), and the README's results-at-a-glance table, rendered from benchmarks/results/.

    python benchmarks/render.py            # rewrite every marked block, each page atomically
    python benchmarks/render.py --check    # exit 1 naming each stale or missing table; write nothing

A block is ``<!-- table: NAME -->`` ... ``<!-- /table -->``. Each NAME is registered once in TABLES: a function from
the results folder to the table's markdown lines. Tables only: the prose around them is written by hand.
"""

from __future__ import annotations

import argparse
import re
import sys
from functools import partial
from pathlib import Path

from attack_tables import durability, durability_cost, paraphrase
from common import (
    COST,
    READ,
    RESULTS,
    TPR,
    default_method,
    on_current_default,
    pct,
    rate,
    read,
    shown_row,
    sweep,
    table,
    with_caption,
)
from model_tables import both_models, qwen_frontier, qwen_paraphrase
from product_tables import (
    calibration_lengths,
    chat,
    fresh_keys,
    key_variants,
    multikey,
    never_green,
    offset_size,
    skipped_tokens,
    speed_by_model,
)
from provenance_tables import (
    pool_reference,
    pooled_cost,
    pooled_cost_grid,
    radioactivity,
    verify_null,
    verify_robustness,
)
from speed_tables import (
    embed_stages,
    generate_speed,
    key_memory,
    key_rebuild,
    kmeans_backends,
    ray_detect,
    serve_bad_inputs,
    serve_load,
)

from openstamp.lab.evaluation.pareto import at_equal_cost
from openstamp.lab.evaluation.report import equal_cost_table

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("results", "scaling", "security", "detection", "design", "evaluation")
PAGES = (ROOT / "docs" / "results.md", ROOT / "README.md", *(ROOT / "docs" / f"{p}.md" for p in DOCS[1:]))
REQUIRED = {"README.md": ("glance",)}  # blocks a page must hold, by file name
# a block measured on another profile or package than today's default key is marked historical in the page source
BLOCK = re.compile(r"(<!-- table: ([\w-]+) -->(?: <!-- historical -->)?\n)(.*?)(<!-- /table -->)", re.S)
HISTORICAL = "<!-- historical -->"


# -- what it costs and what it buys: the Pareto sweep (and its shrinkage variants), the second-order ceiling


def equal_cost(root: Path) -> list[str]:
    """Each method's TPR at +5/+10/+20% own PPL and the cost of TPR 0.95 (report.equal_cost_table's table)."""
    return [shown_row(line) for line in equal_cost_table(sweep(root)) if line.startswith("|")]


def interpolations(root: Path, methods: tuple[str, ...] = ("kgw-llr", "kgw")) -> list[str]:
    """The default key and ``methods`` at +5/+10/+20% own PPL, read off their grids two ways (``paired.py``):
    linear in the cost, and under the budget model (separation linear in sqrt(cost)); the grid shows the gaps."""
    from openstamp.lab.evaluation.paired import interpolate_tpr
    from openstamp.lab.evaluation.pareto import points

    r = sweep(root)
    default = default_method(list(dict.fromkeys(s["method"] for s in r["summary"])))
    n = r["config"].get("n", 0) * len(r["config"].get("seeds", []))  # texts per grid point
    rows = []
    for method in (default, *methods):
        curve = points(r["summary"], method, COST, TPR)
        costs, tprs = [c for c, _, _ in curve], [y for _, y, _ in curve]
        cells = []
        for level in (0.05, 0.10, 0.20):
            read_ = [interpolate_tpr(costs, tprs, level, how, n=n) for how in ("linear", "budget")]
            cells.append(" / ".join("-" if y is None else rate(y) for y in read_))
        rows.append([method, ", ".join(pct(c) for c in costs), *cells])
    header = ["method", "grid: own PPL change", "at +5%: linear / budget", "at +10%", "at +20%"]
    return table(header, rows)


def glance(root: Path) -> list[str]:
    """The README's table: per method of the sweep, TPR at +10% own PPL and the own PPL change for TPR 0.95."""
    r = sweep(root)
    methods = list(dict.fromkeys(s["method"] for s in r["summary"]))
    default = default_method(methods)
    labels = {default: "**the default key**: openstamp", "openstamp": "openstamp-projected (0.1.0's default)"}
    rows = []
    for method in methods:
        if "(" in method and method != default:  # of the kept variants, only the default's
            continue
        read_ = at_equal_cost(r["summary"], method, COST, (0.10,), 0.95)
        reach, curve = read_["cost"][0], read_["curve"]
        needed = pct(reach) if reach is not None else f"above {pct(curve[-1][0])}"
        name = labels.get(method, method)
        rows.append((reach if reach is not None else float("inf"), [name, rate(read_["tpr"][0][0]), needed]))
    header = ["method", f"TPR@1%FPR at +10% own PPL ({r['config']['new_tokens']} tokens)", "own PPL change for 0.95"]
    return table(header, [row for _, row in sorted(rows, key=lambda x: x[0])])


def budget(root: Path) -> list[str]:
    """Each method's median efficiency d'/d* and what it needs for TPR 0.95, below the ceiling's own needs."""
    b = read(root / "detection_budget.json")
    t = b["target"]
    rows = [["second-order ceiling", "1.00", pct(t["ceiling_own_ppl_change"]), f"{t['ceiling_tokens']:.0f}", "-"]]
    for name, m in sorted(b["methods"].items(), key=lambda kv: -kv[1]["efficiency"]):
        by = " / ".join("-" if e is None else f"{e:.2f}" for e in m["by_length"].values())
        rows.append(
            [name, f"{m['efficiency']:.2f}", pct(m["own_ppl_change_for_target"]), f"{m['tokens_for_target']:.0f}", by]
        )
    tokens = "/".join(next(iter(b["methods"].values()))["by_length"])
    header = [
        "method",
        f"efficiency at {t['tokens']} tokens",
        f"own PPL change for TPR {t['tpr']:g} at {t['tokens']} tokens",
        f"tokens for TPR {t['tpr']:g} at {pct(t['own_ppl_change'])}",
        f"efficiency at {tokens} tokens",
    ]
    return table(header, rows)


def llr_split(root: Path) -> list[str]:
    """Where a mean-LLR score's separation goes, per method and strength (detection_budget.json): the sweep's
    methods and, of the kept variants, the default key's."""
    points = read(root / "detection_budget.json")["points"]
    default = default_method(list(dict.fromkeys(p["method"] for p in points)))
    rows = [
        [p["method"], f"{p['strength']:g}", pct(p["own_ppl_change"])]
        + [f"{p['llr_budget'][k]:.2f}" for k in ("seen", "signal", "spread", "efficiency")]
        for p in points
        if (p.get("llr_budget") or {}).get("seen") is not None
        and ("(shrinkage" not in p["method"] or p["method"] == default)
    ]
    return table(["method", "strength", "own PPL change", "seen", "signal", "spread", "efficiency"], rows)


# -- how short a text can be


def lengths(root: Path, cost: float = 0.10) -> list[str]:
    """Each method's TPR@1%FPR at +10% own PPL, read off its curve at each length of the sweep's length curve."""
    r = sweep(root)
    curve = r["length_curve"]
    tokens = sorted({row["tokens"] for row in curve})
    costs = {(s["method"], s["strength"]): s[COST] for s in r["summary"]}
    rows = []
    for method in dict.fromkeys(s["method"] for s in r["summary"]):
        cells = []
        for t in tokens:
            at = [
                {"method": method, "strength": row["strength"], COST: costs[method, row["strength"]]}
                | {TPR: {"mean": row[TPR]}}
                for row in curve
                if row["method"] == method and row["tokens"] == t
            ]
            cells.append(rate(at_equal_cost(at, method, COST, (cost,), 0.95)["tpr"][0][0]))
        rows.append([method, *cells])
    return table(["method", *(f"{t} tokens" for t in tokens)], rows)


# -- is the false-positive rate right for one key


def label(source: str) -> str:
    """A source of unwatermarked text as the tables name it: its label in ``fpr/fpr_per_key.py``'s SOURCES."""
    if (folder := str(Path(__file__).resolve().parent / "fpr")) not in sys.path:
        sys.path.insert(0, folder)
    from fpr_per_key import SOURCES

    return SOURCES[source].label if source in SOURCES else source


def fpr_per_key(root: Path, name: str = "fpr_per_key") -> list[str]:
    rows = []
    for source, src in read(root / f"{name}.json")["sources"].items():
        for alpha, f in src["exact_m"].items():
            rows.append(
                [label(source), alpha, f"{f['median_fpr']:.4f}", f"{f['max_fpr']:.4f}"]
                + [f"{f['keys_with_estimate_in_band']}/{f['n_keys']}", str(f["keys_above_band_significantly"])]
                + [f"{f['dispersion_p']:.3f}"]
            )
    header = ["source", "alpha", "median FPR", "max FPR", "keys in [a/2, 2a]", "keys surely above 2a", "spread p"]
    return table(header, rows)


def fpr_product_path(root: Path, name: str) -> list[str]:
    """Per-key FPR of re-tied releases scored as ``openstamp detect`` scores, on the release's backbone and the
    base's (``benchmarks/fpr/product_path_fpr.py``); the pooled rate with its exact interval."""
    rows = [
        fpr_row(f"{label(source)}, {path} backbone", alpha, f)
        for path, by_source in read(root / f"{name}.json")["paths"].items()
        for source, by_alpha in by_source.items()
        for alpha, f in by_alpha.items()
    ]
    return table(["source, path", *FPR_COLUMNS], rows)


PRODUCT_PATH_RUNS = {  # results file of a product_path_fpr.py run -> (model, in the release-path summary)
    "fpr_product_path_1000": ("SmolLM2-135M", True),
    "fpr_product_path_corpora": ("SmolLM2-135M", True),
    "fpr_product_path_qwen05": ("Qwen2.5-Coder-0.5B", False),  # 300 texts a key, superseded by _1000
    "fpr_product_path_qwen05_1000": ("Qwen2.5-Coder-0.5B", True),
    "fpr_product_path_qwen05_corpora": ("Qwen2.5-Coder-0.5B", True),
    "fpr_product_path_qwen05_tempered": ("Qwen2.5-Coder-0.5B", True),
    "fpr_product_path_qwen05_gemma": ("Qwen2.5-Coder-0.5B", True),
}


def fpr_release_path(root: Path) -> list[str]:
    """Each model's sources on the release path (``openstamp detect`` without ``--base``): at each alpha the pooled
    rate over every key's texts with its exact interval, the highest key, and the keys significantly above 2 alpha."""
    rows = []
    for name, (model, summarised) in PRODUCT_PATH_RUNS.items():
        if not summarised:
            continue
        for source, by_alpha in read(root / f"{name}.json")["paths"]["release"].items():
            at = {
                alpha: dict(zip(["source", *FPR_COLUMNS], fpr_row("", alpha, f), strict=True))
                for alpha, f in by_alpha.items()
            }
            rows.append([f"{model}, {label(source)}", at["0.01"]["keys x texts"]])
            picked = ("pooled FPR [95% CI]", "max per key", "keys surely above 2a")
            rows[-1] += [at[alpha][column] for alpha in ("0.01", "0.001") for column in picked]
    header = ["model, source", "keys x texts"]
    for alpha in ("0.01", "0.001"):
        header += [f"FPR at {alpha} [95% CI]", "max key", "keys surely above 2a"]
    return table(header, rows)


FPR_COLUMNS = [
    "alpha",
    "pooled FPR [95% CI]",
    "median per key",
    "max per key",
    "keys surely above 2a",
    "keys x texts",
    "spread p",
]


def fpr_row(label: str, alpha: str, f: dict) -> list[str]:
    """One row of FPR_COLUMNS from an ``fpr_scoring.fpr_summary`` record: the pooled rate with its exact interval."""
    from openstamp.detect.rates import clopper_pearson

    n = f["n_texts"] * f["n_keys"]
    hits = round(f["pooled_fpr"] * n)
    low, high = clopper_pearson(hits, n)
    return [
        label,
        alpha,
        f"{hits / n:.4f} [{low:.4f}, {high:.4f}]",
        f"{f['median_fpr']:.4f}",
        f"{f['max_fpr']:.4f}",
        f"{f['keys_above_band_significantly']}",
        f"{f['n_keys']} x {f['n_texts']}",
        f"{f['dispersion_p']:.3f}",
    ]


def key_spread(root: Path) -> list[str]:
    """Per-key FPR of each (keys, texts) pair of the key-spread study, original backbone (key_spread.json)."""
    rows = [
        fpr_row(f"{r['keys']} on {r['texts']}", alpha, f)
        for r in read(root / "key_spread.json")["pairs"].values()
        for alpha, f in r["by_alpha"].items()
    ]
    return table(["keys, texts", *FPR_COLUMNS], rows)


def fpr_calibrated(root: Path) -> list[str]:
    """Per-key FPR on a domain's held-out half (cross-fitted): the permutation p-value, and each key flagging with
    thresholds calibrated on the domain's other half (fpr_calibrated.json)."""
    rules = {"p_value": "p <= alpha", "calibrated": "calibrated on the domain"}
    rows = [
        fpr_row(f"{domain}, {label}", alpha, by_alpha[alpha][rule])
        for domain, by_alpha in read(root / "fpr_calibrated.json")["domains"].items()
        for rule, label in rules.items()
        for alpha in by_alpha
        if alpha != "n_texts_per_half"
    ]
    return table(["domain, rule", *FPR_COLUMNS], rows)


def tail_check(root: Path) -> list[str]:
    """The tail bound against 10^5 permutations and against fresh keys, per key checked (tail_check*.json)."""
    rows = []
    for name, label in (("tail_check", "0.1.0's default"), ("tail_check_default", "0.2.0's default")):
        r = read(root / f"{name}.json")
        keys = "-"
        if "mc_keys" in r:
            keys = (f"{r['tail_below_keys_mc_beyond_error']} of {r['tail_and_keys_mc_both_resolved']} "
                    f"({r['median_ratio_tail_over_keys_mc']:.2f})")  # fmt: skip
        below = f"{r['tail_below_mc_beyond_error']} of {r['tail_and_mc_both_resolved']}"
        rows.append([label, r["key_id"], str(r["n_texts"]), f"{below} ({r['median_ratio_tail_over_mc']:.2f})", keys])
    header = ["key", "key id", "texts (x 4 lengths)", "below 10^5 permutations (median ratio)",
              "below fresh keys (median ratio)"]  # fmt: skip
    return table(header, rows, 2)


# -- how fast


# -- detection quality of one key


def detect_quality(root: Path) -> list[str]:
    """Each detector of one key on 200 watermarked and 200 human texts, from decoded text and from the generated ids
    (detect_quality.json)."""
    r = read(root / "detect_quality.json")
    text, ids = r["on_decoded_text"]["detectors"], r["on_generated_ids"]["detectors"]
    rows = [
        [
            name,
            f"{d['auroc']:.3f}",
            rate(d["tpr_at_1pct_fpr"]["tpr"]),
            f"{ids[name]['auroc']:.3f}",
            rate(ids[name]["tpr_at_1pct_fpr"]["tpr"]),
        ]
        for name, d in text.items()
    ]
    return table(["detector", "AUROC, decoded text", "TPR@1%FPR", "AUROC, generated ids", "TPR@1%FPR"], rows)


def threshold_lengths(root: Path) -> list[str]:
    """Human text over each method's full-length 1% threshold, and flagged at p <= 0.01, by length
    (threshold_lengths.json)."""
    runs = read(root / "threshold_lengths.json")["runs"]
    tokens = [x["tokens"] for x in runs[0]["lengths"]]
    rows = [
        [f"{r['method']} ({r['score_scale']})"]
        + [f"{rate(x['human_over_full_threshold'])} / {rate(x['human_flagged_at_p_0.01'])}" for x in r["lengths"]]
        for r in runs
    ]
    return table(["method (score)", *(f"{t} tokens" for t in tokens)], rows)


def retie(root: Path) -> list[str]:
    """The untied export against the re-tied release of one key (retie.json)."""
    r = read(root / "retie.json")["results"]
    rows = [["original", f"{r['original']['perplexity']['ppl']:.1f}", "-", "-", f"{r['original']['size_mb']:.0f}"]]
    rows += [
        [
            mode,
            f"{m['perplexity']['ppl']:.1f}",
            rate(m["flagged_completions"]),
            rate(m["flagged_human"]),
            f"{m['size_mb']:.0f}",
        ]
        for mode, m in r.items()
        if mode != "original"
    ]
    return table(["release", "perplexity", "completions flagged", "human flagged", "size (MB)"], rows)


# -- which strength and settings


def tune(root: Path, name: str) -> list[str]:
    r = read(root / f"{name}.json")
    rows = [
        [
            f"{p['delta']:.3g}" + (" (chosen)" if p["delta"] == r["delta"] else ""),
            f"{p['tpr']:.3f} [{p['tpr_ci'][0]:.3f}, {p['tpr_ci'][1]:.3f}]",
        ]
        + [f"{p['own_ppl']:.2f}", pct(p["own_ppl_change"])]
        for p in r["probes"]
    ]
    return table(["delta", "TPR [95% CI]", "own perplexity", "change"], rows, 0)


TABLES = {
    "glance": glance,
    "equal_cost": equal_cost,
    "interpolations": interpolations,
    "budget": budget,
    "lengths": lengths,
    "fpr_per_key": fpr_per_key,
    "fpr_per_key_default": partial(fpr_per_key, name="fpr_per_key_default"),
    "fpr_per_key_qwen05": partial(fpr_per_key, name="fpr_per_key_qwen05"),
    "fpr_release_path": fpr_release_path,
    **{name: partial(fpr_product_path, name=name) for name in PRODUCT_PATH_RUNS},
    "key_spread": key_spread,
    "fpr_calibrated": fpr_calibrated,
    "tail_check": tail_check,
    "paraphrase_12": partial(paraphrase, cost=0.12),
    "durability": durability,
    "durability_cost_12": partial(durability_cost, cost=0.12),
    "durability_equal": partial(durability_cost, cost=0.12, folder="robust_cost/equal"),
    "tune": partial(tune, name="tune"),
    "tune_default": partial(tune, name="tune_default"),
    "llr_split": llr_split,
    "chat": chat,
    "speed_by_model": speed_by_model,
    "offset_size": offset_size,
    "never_green": never_green,
    "multikey": multikey,
    "calibration_lengths": calibration_lengths,
    "key_variants": key_variants,
    "skipped_tokens": skipped_tokens,
    "fresh_keys": fresh_keys,
    "qwen_frontier": qwen_frontier,
    "both_models": both_models,
    "qwen_paraphrase": qwen_paraphrase,
    "embed_stages": embed_stages,
    "generate_speed": generate_speed,
    "serve_load": serve_load,
    "ray_detect": ray_detect,
    "key_memory": key_memory,
    "kmeans_backends": kmeans_backends,
    "key_rebuild": key_rebuild,
    "serve_bad_inputs": serve_bad_inputs,
    "detect_quality": detect_quality,
    "threshold_lengths": threshold_lengths,
    "retie": retie,
    "verify_robustness": verify_robustness,
    "verify_reinit": partial(verify_robustness, name="verify_reinit"),
    "verify_null": verify_null,
    "verify_robustness_qwen05": partial(verify_robustness, name="verify_robustness_qwen05"),
    "verify_null_qwen05": partial(verify_null, name="verify_robustness_qwen05"),
    "pooled_cost": pooled_cost,
    "pooled_cost_grid": pooled_cost_grid,
    "pool_reference": pool_reference,
    "radioactivity": radioactivity,
}


def render_page(text: str, root: Path = RESULTS) -> tuple[str, list[str]]:
    """``text`` with every marked block filled from ``root``, and the problems: unknown names, failed renders."""
    problems: list[str] = []

    def fill(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            problems.append(f"{name}: no such table in benchmarks/render.py")
            return match.group(0)
        READ.clear()
        try:
            rows = TABLES[name](root)
        except (OSError, KeyError, ValueError) as err:
            problems.append(f"{name}: cannot render it from {root}: {err!r}")
            return match.group(0)
        rows = with_caption(rows, READ, historical=HISTORICAL in match.group(1))
        return match.group(1) + "\n".join(rows) + "\n" + match.group(4)

    return BLOCK.sub(fill, text), problems


def unmarked_history(text: str, root: Path = RESULTS) -> list[str]:
    """The blocks of a page measured on another profile or package than today's default key (``on_current_default``)
    that are not marked historical."""
    found = []
    for match in BLOCK.finditer(text):
        READ.clear()
        TABLES[match.group(2)](root)
        if not on_current_default(list(READ)) and HISTORICAL not in match.group(1):
            found.append(match.group(2))
    return found


def stale(page: Path, root: Path = RESULTS, required: tuple[str, ...] = ()) -> tuple[str, list[str], list[str]]:
    """The page rendered, the tables whose block differs from it, and the problems: unknown names, failed renders,
    and each name of ``required`` without a block."""
    text = page.read_text(encoding="utf-8")
    new, problems = render_page(text, root)
    old_blocks = {m.group(2): m.group(3) for m in BLOCK.finditer(text)}
    new_blocks = {m.group(2): m.group(3) for m in BLOCK.finditer(new)}
    changed = [name for name in old_blocks if old_blocks[name] != new_blocks.get(name)]
    missing = [f"{name}: no <!-- table: {name} --> block to fill" for name in required if name not in old_blocks]
    return new, changed, problems + missing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 naming each stale or missing table; write nothing")
    args = parser.parse_args()
    from openstamp.storage import atomic_write_text

    failed = False
    for page in PAGES:
        required = REQUIRED.get(page.name, ())
        name = page.relative_to(ROOT)
        if not page.exists():
            print(f"{name}: missing", file=sys.stderr)
            failed = True
            continue
        new, changed, problems = stale(page, required=required)
        for problem in problems + ([f"{t}: stale" for t in changed] if args.check else []):
            print(f"{name}: {problem}", file=sys.stderr)
        failed |= bool(problems or changed)
        if not args.check and changed:
            atomic_write_text(page, new)
            print(f"wrote {len(changed)} table(s) into {name}")
    if args.check and failed:
        raise SystemExit(1)
    if args.check:
        print("every table matches benchmarks/results/")


if __name__ == "__main__":
    main()
