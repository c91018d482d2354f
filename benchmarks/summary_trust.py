"""README renderers for the per-key false-positive rate and the tail p-value check (used by summary.py)."""

from __future__ import annotations

SOURCE_NAMES = {
    "base_pure": "original model, pure sampling",
    "base_t0.7_p0.9": "original model, T 0.7 / top-p 0.9",
    "human": "human continuations",
    "gemma3_pure": "Gemma-3-270M, pure sampling",
}


def fpr_per_key(r: dict) -> list[str]:
    s = r["settings"]
    first = next(iter(r["sources"].values()))["exact_m"]["0.01"]
    rows = [
        f"False-positive rate per key (`python benchmarks/fpr_per_key.py`): {first['n_keys']} keys (the key "
        f"of `embed --profile {s['profile']}` and variants with their own secret), {first['n_texts']} texts per "
        f"source of {s['new_tokens']} new tokens after held-out {s['prompt_tokens']}-token prompts, scored as "
        f"decoded text without the prompt; public models sampled in {s['gen_dtype']}. Per source and alpha: "
        "median and max over keys of each key's FPR, keys whose FPR lies in [alpha/2, 2 alpha], keys whose 95% "
        "Clopper-Pearson interval lies wholly above 2 alpha, and the chi-square p-value of the spread across keys "
        "against the binomial spread:",
        "",
        "| source | centring | alpha | median FPR | max FPR | keys in [a/2, 2a] | keys significantly above 2a "
        "| spread p |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, src in r["sources"].items():
        for variant, label in (("top32_m", "top-32 m (before)"), ("exact_m", "exact m")):
            for alpha, f in src[variant].items():
                rows.append(
                    f"| {SOURCE_NAMES.get(name, name)} | {label} | {alpha} | {f['median_fpr']:.4f} | "
                    f"{f['max_fpr']:.4f} | {f['keys_with_estimate_in_band']}/{f['n_keys']} | "
                    f"{f['keys_above_band_significantly']} | {f['dispersion_p']:.3f} |"
                )
    return rows


def tail_check(r: dict) -> list[str]:
    rows = [
        f"Tail p-value against {r['mc_permutations']:,} permutations (`python benchmarks/tail_check.py`): "
        f"{r['n_texts']} watermarked completions (delta {r['delta']}) cut to each length; the p-value `detect` "
        "reports, the Monte-Carlo one, and how many texts are flagged:",
        "",
        "| scored tokens | median p reported | median p, 10^5 permutations | flagged at p <= 0.01 | p < 1e-6 |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n, s in r["per_length"].items():
        rows.append(
            f"| {n} | {s['median_p_reported']:.2g} | {s['median_p_mc_1e5']:.2g} | {s['flagged_at_0.01']:.2f} | "
            f"{s['below_1e-6']:.2f} |"
        )
    ratio = r["median_ratio_tail_over_mc"]
    rows += [
        "",
        f"Where both resolve ({r['tail_and_mc_both_resolved']} texts), the bound is below the 10^5-permutation "
        f"p-value beyond 3 standard errors for {r['tail_below_mc_beyond_error']}; median ratio bound / Monte-Carlo "
        f"{ratio:.3g}."
        if ratio is not None
        else "No text fell where both resolve.",
    ]
    return rows
