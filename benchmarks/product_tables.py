"""docs/results.md's tables of what users check first: chat text, several keys, per-length calibration, and the
key variants of the frontier work. Each is a function from the results folder to markdown lines (render.py)."""

from __future__ import annotations

from pathlib import Path

from common import pct, rate, read, table


def interval(r: dict) -> str:
    """``rate [low, high]`` of a ``{rate, ci95}`` record."""
    low, high = r["ci95"]
    return f"{rate(r['rate'])} [{low:.3f}, {high:.3f}]"


def chat(root: Path) -> list[str]:
    """Flag rates on chat-formatted assistant turns and human answers (chat_detect.json)."""
    r = read(root / "chat_detect.json")
    rows = [
        [label, f"{s['hits']}/{s['n']}", interval(s), str(s["median_tokens_scored"])]
        for label, s in (
            ("watermarked release's turns (TPR)", r["tpr_watermarked"]),
            ("base model's turns (FPR)", r["fpr_base"]),
            ("human answers (FPR)", r["fpr_human"]),
        )
    ]
    return table(["texts", "flagged", "rate [95% CI]", "median tokens scored"], rows)


def multikey(root: Path) -> list[str]:
    """Human text flagged under any of several keys, with and without Holm's correction (multikey_fpr.json)."""
    r = read(root / "multikey_fpr.json")
    m = len(r["key_ids"])
    rows = [
        [f"any of {m} keys, Holm-adjusted", interval(r["family_wise_fpr_holm"])],
        [f"any of {m} keys, uncorrected", interval(r["family_wise_fpr_uncorrected"])],
    ]
    rows += [[f"key {k} alone", interval(v)] for k, v in r["per_key_fpr"].items()]
    return table([f"human texts ({r['texts_scored']}) flagged at p <= {r['alpha']:g}", "rate [95% CI]"], rows)


def calibration_lengths(root: Path) -> list[str]:
    """Per-length thresholds and their measured FPR (calibration_lengths/calibration.json: calibrate --report)."""
    r = read(root / "calibration_lengths" / "calibration.json")
    rows = []
    for length, c in sorted(r["by_length"].items(), key=lambda kv: int(kv[0])):
        tau = c["llr_thresholds"].get("0.01")
        fpr = c["llr_threshold_fpr"].get("0.01")
        p_fpr = c["p_value_fpr"].get("0.01")
        rows.append(
            [
                length,
                str(c["n_texts"]),
                "-" if tau is None else f"{tau:+.4f}",
                "-" if fpr is None else f"{rate(fpr['rate'])} [{fpr['low']:.3f}, {fpr['high']:.3f}]",
                "-" if p_fpr is None else f"{rate(p_fpr['rate'])} [{p_fpr['low']:.3f}, {p_fpr['high']:.3f}]",
            ]
        )
    header = ["tokens", "human texts", "LLR threshold (1%)", "its FPR, held out [95% CI]", "FPR of p <= 0.01"]
    return table(header, rows)


def tune_split_points(root: Path) -> list[dict]:
    """Every point of the tune split's key 0 in key_variants*.json (one file per run of
    benchmarks/frontier/key_variants.py); fresh keys (the test split) are fresh_keys' table. Variants are named
    against 0.1.0's default key (the projected profile); a run on the default profile of 0.2.0 (raw-centred-f4 in
    those terms) names its variants 'default', as ``centred`` there is that key."""
    points = []
    for path in sorted(root.glob("key_variants*.json")):
        r = read(path)
        on_default = r["settings"].get("profile") == "default" and r["versions"]["openstamp"] != "0.1.0"
        for p in r["points"].values():
            if on_default:
                parts = p["variant"].split("-")
                rest = [x for x in parts if x not in ("centred", "plain")]
                p = {**p, "variant": "-".join(["default" if "centred" in parts else "default-uncentred", *rest])}
            points.append(p)
    return [p for p in points if not p.get("key", 0)]


def key_variants(root: Path) -> list[str]:
    """Each key variant at each strength: TPR, own-PPL change, and the seen / signal / spread split."""
    rows = []
    for p in tune_split_points(root):
        low, high = p["tpr_ci"]
        split = [rate(p.get(k)) if p.get(k) is not None else "-" for k in ("seen", "signal", "spread", "efficiency")]
        rows.append([p["variant"], f"{p['delta']:g}", f"{rate(p['tpr'])} [{low:.2f}, {high:.2f}]",
                     pct(p["own_ppl_change"]), *split])  # fmt: skip
    header = ["variant", "delta", "TPR at p <= 0.01 [95% CI]", "own PPL change"]
    header += ["seen", "signal", "spread", "efficiency"]
    return table(header, rows)


def skipped_tokens(root: Path) -> list[str]:
    """TPR with the first k tokens of each text left unscored (key_variants*.json points that measured skips)."""
    points = [p for p in tune_split_points(root) if len(p.get("by_skip", {})) > 1]
    skips = sorted({int(k) for p in points for k in p["by_skip"]})
    rows = [[p["variant"], f"{p['delta']:g}", pct(p["own_ppl_change"])]
            + [rate(p["by_skip"][str(k)]["tpr"]) if str(k) in p["by_skip"] else "-" for k in skips]
            for p in points]  # fmt: skip
    return table(["variant", "delta", "own PPL change", *(f"TPR, first {k} skipped" for k in skips)], rows)


def fresh_keys(root: Path, cost: float = 0.10) -> list[str]:
    """Each variant on fresh keys (the test split): per key, TPR read at ``cost`` own PPL off its line through its
    strengths, then the mean over keys with a t interval; the decomposition's mean over keys and strengths
    (key_variants_fresh_keys.json)."""
    import numpy as np
    from scipy.stats import t as student

    r = read(root / "key_variants_fresh_keys.json")
    by = {}
    for p in r["points"].values():
        by.setdefault(p["variant"], {}).setdefault(p["key"], []).append(p)
    rows = []
    for variant, keys in by.items():
        at = []
        for points in keys.values():
            (c0, y0), (c1, y1) = sorted((q["own_ppl_change"], q["tpr"]) for q in points)[:2]
            at.append(y0 + (y1 - y0) * (cost - c0) / (c1 - c0))
        n, mean = len(at), float(np.mean(at))
        half = student.ppf(0.975, n - 1) * np.std(at, ddof=1) / n**0.5 if n > 1 else float("nan")
        every = [q for points in keys.values() for q in points]
        split = [rate(sum(q[k] for q in every) / len(every)) for k in ("seen", "signal", "spread", "efficiency")]
        deltas = "/".join(f"{d:g}" for d in sorted({q["delta"] for q in every}))
        rows.append([variant, str(n), deltas, f"{rate(mean)} [{mean - half:.3f}, {mean + half:.3f}]",
                     f"{min(at):.3f}-{max(at):.3f}", *split])  # fmt: skip
    header = ["variant", "keys", "deltas", f"TPR at {pct(cost)} own PPL, mean [95% CI over keys]", "range over keys",
              "seen", "signal", "spread", "efficiency"]  # fmt: skip
    return table(header, rows)


def offset_size(root: Path) -> list[str]:
    """Each model's offset against its unembedding at its key's delta, per version's default key (offset_size*.json:
    offset_size_0.1.0.json kept from before the default changed)."""
    rows = []
    for path in sorted(root.glob("offset_size*.json")):
        r = read(path)
        rows += [
            [model, f"{r['versions']['openstamp']}'s", f"{s['delta']:g}", f"{s['offset_to_head']:.2f}",
             f"{s['head_row_norm']:.3f}", f"{s['offset_row_norm']:.3f}", f"{s['offset_mean_row_norm']:.3f}",
             f"{s['centred_offset_row_norm']:.3f}"]
            for model, s in r["releases"].items()
        ]  # fmt: skip
    header = ["model", "default key", "delta", "dW / U (Frobenius)", "row norm of U", "of dW", "dW's mean row",
              "dW centred, per row"]  # fmt: skip
    return table(header, sorted(rows), 2)


def never_green(root: Path) -> list[str]:
    """Own perplexity of a re-tied release with and without its never-green input rows moved, on chat and plain
    text (never_green.json; the study: docs/notebook/2026-12-06-never-green.md); each change against the base with
    its interval."""
    r = read(root / "never_green.json")

    def cell(row: dict) -> str:
        if row["change"] is None:
            return f"{row['own_ppl']:.2f}"
        low, high = row["ci"]
        return f"{row['own_ppl']:.2f} ({pct(row['change'])} [{pct(low)}, {pct(high)}])"

    by = {(row["model"], row["text"]): row for row in r["rows"]}
    models = list(dict.fromkeys(row["model"] for row in r["rows"]))
    n = r["settings"]["n"]
    rows = [[m, cell(by[m, "chat"]), cell(by[m, "plain"])] for m in models]
    return table(["model", f"chat answers ({n}): own PPL (change)", f"plain windows ({n})"], rows)


def speed_by_model(root: Path) -> list[str]:
    """Detection tokens/s against a plain forward pass, per model (detect_speed*.json)."""
    rows = []
    for path in sorted(root.glob("detect_speed*.json")):
        r = read(path)
        t, x = r["tokens_per_second"], r["ratio_to_plain_forward"]
        release = "/".join(Path(r["model"]).parts[-3:])
        rows.append([release, f"{r['batch']} x {r['length']}", f"{t['plain_forward']:.0f}",
                     f"{t['openstamp_detect']:.0f}", f"{x['openstamp_detect']:.2f}",
                     f"{r['memory']['peak_rss_mb']:.0f}"])  # fmt: skip
    header = ["release", "batch", "plain forward tok/s", "detect tok/s", "x forward", "peak RSS at memory batch (MB)"]
    return table(header, rows)
