"""Print the results in benchmarks/results/*.json as the Markdown that the README shows.

python benchmarks/summary.py
"""

from __future__ import annotations

import json
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def detect_speed(r: dict) -> list[str]:
    t, x = r["tokens_per_second"], r["ratio_to_plain_forward"]
    rows = [
        f"Detection speed (`python benchmarks/detect_speed.py`; batch {r['batch']} x {r['length']} tokens):",
        "",
        "| pass | tokens/s | x plain forward |",
        "|---|---:|---:|",
    ]
    rows += [f"| {k.replace('_', ' ')} | {t[k]:.0f} | {x[k]:.2f} |" for k in t]
    b, m = r["head_breakdown_ms_per_token"], r["memory"]
    rows += [
        "",
        "Per scored token: " + ", ".join(f"{k.replace('_', ' ')} {v:.3f} ms" for k, v in b.items()) + ".",
        f"Peak memory of detection at {m['batch']} x {m['length']}: {m['peak_rss_mb']:.0f} MB "
        f"({m['peak_increase_mb']:+.0f} MB over the loaded model).",
    ]
    return rows


def detect_quality(r: dict) -> list[str]:
    rows = [
        f"Detection quality (`python benchmarks/detect_quality.py`): {r['n']} watermarked completions of "
        f"{r['new_tokens']} tokens (held-out news/Wikipedia prompts of {r['prompt_tokens']} tokens) against the "
        f"human continuations of the same prompts; delta {r['delta']}, gamma {r['gamma']}, L {r['n_lists']}; "
        "scored as decoded text:",
        "",
        "| detector | AUROC | TPR@1%FPR | AUROC (generated ids) | TPR@1%FPR (generated ids) |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, m in r["on_decoded_text"]["detectors"].items():
        i = r["on_generated_ids"]["detectors"][name]
        rows.append(
            f"| {name} | {m['auroc']:.3f} | {m['tpr_at_1pct_fpr']['tpr']:.3f} | {i['auroc']:.3f} | "
            f"{i['tpr_at_1pct_fpr']['tpr']:.3f} |"
        )
    f, t = r["on_decoded_text"]["flagged_at_p_0.01"], r["retokenisation"]
    rows += [
        "",
        f"At p <= 0.01 the permutation test flags {f['positives']:.1%} of watermarked and "
        f"{f['negatives']:.1%} of human texts. Decoding the generated ids and encoding them again gives "
        f"back the same ids for {t['fraction_identical_ids']:.0%} of completions; mean LLR "
        f"{t['mean_llr_text']:.3f} on text against {t['mean_llr_ids']:.3f} on the generated ids.",
    ]
    return rows


def calibration(r: dict) -> list[str]:
    observed = r["p_value_observed_fpr"]
    return [
        f"Calibration (`openstamp calibrate`, {r['n_texts']} held-out {'+'.join(r['corpora'])} texts of "
        f"{r['length']} tokens): observed false-positive rate of the permutation p-values "
        + ", ".join(f"{observed[a]:.3f} at alpha {a}" for a in observed)
        + f"; KS test against uniform p = {r['p_value_ks_uniform']:.2f}; raw LLR on this human text "
        f"{r['llr_null_mean']:+.3f} +- {r['llr_null_sd']:.3f}. QQ plot: "
        "`benchmarks/results/calibration/pvalues_qq.png`."
    ]


def embed_stages(r: dict) -> list[str]:
    rows = [
        f"Embedding (`python benchmarks/embed_stages.py`, profile {r['profile']}, {r['n_states']} states):",
        "",
        "| stage | seconds | peak RSS (MB) |",
        "|---|---:|---:|",
    ]
    rows += [
        f"| {k.replace('_', ' ')} | {v:.1f} | {r['stage_peak_rss_mb'].get(k, float('nan')):.0f} |"
        for k, v in r["stage_seconds"].items()
    ]
    g = r["generation"]
    rows += [
        "",
        f"Generation, batch {g['batch']} x {g['new_tokens']} tokens: original "
        f"{g['tokens_per_second']['original']:.1f} tok/s, watermarked {g['tokens_per_second']['watermarked']:.1f}"
        f" tok/s, ratio {g['ratio_watermarked_to_original']:.3f}.",
    ]
    return rows


def selector_variants(r: dict) -> list[str]:
    rows = [
        f"Selector variants (`python benchmarks/selector_variants.py`, {r['n_states']} {r['corpus']} states, "
        f"L {r['n_lists']}): argmax accuracy of S",
        "",
        "| variant | train | held-out documents | lists kept |",
        "|---|---:|---:|---:|",
    ]
    rows += [
        f"| {name} | {v['train_accuracy']:.3f} | {v['heldout_accuracy']:.3f} | {v['n_lists']} |"
        for name, v in r["variants"].items()
    ]
    return rows


def serve_load(r: dict) -> list[str]:
    rows = [
        f"Service load (`python benchmarks/serve_load.py`, loopback, {r['clients']} clients for {r['duration_s']} s, "
        f"texts of {r['text_tokens']} tokens):",
        "",
        "| server | texts/s | tokens/s | p50 latency (s) | p99 latency (s) | errors | peak RSS (MB) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name in ("batched", "max_batch_1"):
        v = r[name]
        rows.append(
            f"| max batch {v['max_batch']} | {v['texts_per_second']:.2f} | {v['tokens_per_second']:.0f} | "
            f"{v['latency_p50_s']:.2f} | {v['latency_p99_s']:.2f} | {v['errors']} | "
            f"{v['server_memory_mb']['VmHWM']:.0f} |"
        )
    rows += ["", f"Micro-batching gain (same run): {r['batching_gain']:.2f}x throughput."]
    return rows


def main() -> None:
    sections = [
        ("embed_stages", embed_stages),
        ("selector_variants", selector_variants),
        ("detect_speed", detect_speed),
        ("detect_quality", detect_quality),
    ]
    out: list[str] = []
    for name, render in sections:
        result = load(name)
        if result is not None:
            out += render(result) + [""]
    cal = RESULTS / "calibration" / "calibration.json"
    if cal.exists():
        out += calibration(json.loads(cal.read_text())) + [""]
    result = load("serve_load")
    if result is not None:
        out += serve_load(result) + [""]
    print("\n".join(out))


if __name__ == "__main__":
    main()
