"""Print the results in benchmarks/results/*.json as Markdown: every measurement (RESULTS.md) and the headline
the README shows (the Pareto sweep, its length curve, the strength `tune` chooses, the false-positive rate per key).

python benchmarks/summary.py            # print every measurement
python benchmarks/summary.py --readme   # and write RESULTS.md, and the headline into README.md between its markers
python benchmarks/summary.py --check    # exit 1 if RESULTS.md or README.md differ from what the results render
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from summary_analysis import analyses
from summary_budget import detection_budget
from summary_cost import strength_sweep, tune
from summary_para import paraphrase64, paraphrase_baselines, projection_keys, projection_test
from summary_robust import (
    AT_COST,
    RETIED_FROM,
    durability,
    pruned_bias,
    robust_at_cost,
    robustness,
    verdict_coverage,
)
from summary_sweep import sweep
from summary_timed import evaluation_retimed, evaluation_timed
from summary_trust import fpr_per_key, tail_check

RESULTS = Path(__file__).parent / "results"
README = Path(__file__).parent.parent / "README.md"
RESULTS_PAGE = README.with_name("RESULTS.md")
START, END = "<!-- results:start -->", "<!-- results:end -->"
OLDER = (  # figures measured before this release of the detector
    "Measured at commit 737d7d7, with the older top-32 estimate of m, an untied release and no tail bound; "
    "not re-run since."
)


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


def score_reuse(r: dict) -> list[str]:
    s, t = r["settings"], r["seconds"]
    cuts, same = s.get("cuts"), f"identical scores: {r['identical_scores']}"
    then = f", then on each cut to {' and '.join(map(str, cuts))} tokens (the length curve)" if cuts else ""
    if cuts:  # the length curve's cut texts, served from the full texts' states
        gap = r["cut_max_score_difference"]
        cut = "scores identical too" if gap == 0 else f"scores within {gap:.1e} (float rounding of a longer pass)"
        same = (
            f"full-length scores identical: {r['identical_scores']}; the cut texts' {cut}; {r['prefix_hits']} "
            "batches of cut texts ran no decoder"
        )
    return [
        f"Scoring the same texts with several detectors (`python benchmarks/score_reuse.py --n {s['n']}`): "
        f"OpenStamp's detector at {len(s['deltas'])} strengths on {s['n']} human texts of {s['length']} tokens"
        f"{then}, as "
        f"a sweep scores its negatives, takes {t['without_reuse']:.1f} s running the decoder for each and "
        f"{t['with_reuse']:.1f} s reusing its hidden states ({r['speedup']:.2f}x; {same}). The eval's score and "
        "length stages reuse them for every detector that runs the decoder (OpenStamp, its ablation, KGW+LLR); KGW, "
        "Unremovable and SIR score without the language model, GaussMark needs its gradients.",
    ]


def retied_lengths(r: dict) -> list[str]:
    s, t, c = r["settings"], r["seconds"], r["cache"]
    return [
        f"The length curve of OpenStamp on a re-tied key, scored from the original model as the eval does "
        f"(`python benchmarks/retied_lengths.py --n {s['n']}`): {s['n']} texts of {s['length'] - 1} scored tokens, "
        f"then each cut to {', '.join(map(str, s['cuts']))} tokens, take {t['method_per_call']:.1f} s with a new "
        f"detector (and watermarked copy of the model) per call, as the eval did before, and {t['one_method']:.1f} s "
        f"with one kept per method and key ({r['speedup']:.2f}x; largest score difference "
        f"{r['max_score_difference']:.1e}): the copy's cached states served {c['one_method']['prefix_hits']} "
        f"batches of cut texts (against {c['method_per_call']['prefix_hits']}), and the decoder ran "
        f"{c['one_method']['misses']} times (against {c['method_per_call']['misses']})."
        + (
            f" The kept detector also took the per-token statistics of {r['statistics_memo_hits']['one_method']} of "
            f"the {s['n'] * len(s['cuts'])} cut texts from their full texts (the tail bound still ran here; the "
            "eval's length stage skips it)."
            if "statistics_memo_hits" in r
            else " (Recorded before the kept detector also kept per-token statistics for cut texts, dec7977: the "
            "eval's figures below include that.)"
        ),
    ]


def _retimed(r: dict) -> tuple[str, str]:
    """An eval_retime result's seconds before -> after per method and stage, and what else changed, in words."""
    parts = "; ".join(
        f"{m}: " + ", ".join(f"{stage} {v['before']:.0f} -> {v['after']:.0f} s" for stage, v in stages.items())
        for m, stages in r["seconds"].items()
    )
    changed = r.get("changed_besides_the_oracle")
    if changed is None:
        return parts, ""
    return parts, (
        " Every other figure of the results (each run's metrics and length curve) is the same."
        if not changed
        else f" Other figures that differ: {', '.join(changed)}."
    )


def eval_retime(r: dict) -> list[str]:
    o = r["oracle"]
    parts, changed = _retimed(r)
    return [
        "The same in the eval itself (`python benchmarks/eval_retime.py`: the timed comparison's folder, scored "
        "again with the current code after deleting OpenStamp's and no-projection's score and length files; "
        "keys and completions are kept): before, with the kept detector alone (b9ac730), and after, with "
        f"each detector keeping its texts' per-token statistics for their cut texts: {parts}. The same invocation "
        f"scored the oracle's {o['sets']} sets ({o['texts']} texts) again ({', '.join(o['dtypes'])}) in "
        f"{o['seconds_after']:.0f} s; each text's perplexity moved by at most {o['max_abs_relative_difference']:.2%}."
        + changed,
    ]


def score_retime(r: dict) -> list[str]:
    machine = r["machines"][-1]
    parts, changed = _retimed(r)
    return [
        "OpenStamp's detector in the eval, timed on one machine in one session (`python benchmarks/eval_retime.py "
        "--name score_retime`: the timed comparison's folder scored twice, with the code before and after, "
        f"{machine['cpu']}, {machine['threads']} threads): {r['settings']['change']}: {parts}." + changed,
    ]


def own_ppl_reuse(r: dict) -> list[str]:
    s, t = r["settings"], r["seconds"]
    grids = "; ".join(f"{name} {', '.join(map(str, grid))}" for name, grid in r["methods"].items())
    return [
        f"The own perplexity of watermarks that leave the decoder alone (`python benchmarks/own_ppl_reuse.py "
        f"--n {s['n']}`): the original model and {r['passes'] - 1} variants ({grids}: the sweep's grids) on "
        f"{s['n']} human continuations of 50 + 64 tokens take {t['without_reuse']:.1f} s running the decoder for "
        f"each and {t['with_reuse']:.1f} s starting from the original's hidden states ({r['speedup']:.2f}x; largest "
        f"NLL difference {r['max_nll_difference']:.1e}). The eval's own-perplexity stage does this for every method "
        "whose `keeps_hidden` holds (KGW, KGW+LLR, SIR, Unremovable); OpenStamp on a tied model re-ties U~ into "
        "its input embeddings and GaussMark perturbs an MLP, so theirs run the decoder. Hugging Face's loss on "
        f"the same windows (one forward pass of the original, every position's logits) took {t['plain_forward']:.1f} "
        f"s in the same run: one own-perplexity pass without reuse is {r['pass_over_plain_forward']:.2f}x that.",
    ]


def own_ppl_dtype(r: dict) -> list[str]:
    s, t, v = r["settings"], r["seconds"], r["variants"]
    moved = max(row["change_moved_over_ci_width"] for row in v.values() if "change_moved_over_ci_width" in row)
    return [
        f"Own perplexity's decoder dtype (`python benchmarks/own_ppl_dtype.py --n {s['n']}`): the original model "
        f"and {r['passes'] - 1} weight-level variants whose own perplexity runs the decoder, on {s['n']} human "
        f"continuations of 50 + 64 tokens, the decoder in float32 {t['float32']:.1f} s and under bfloat16 autocast "
        f"{t['bfloat16']:.1f} s ({r['speedup_bfloat16']:.2f}x), interleaved in one run. The own-PPL change "
        "against the original, float32 -> bfloat16: "
        + "; ".join(
            f"{label} {row['change_float32']:+.2%} -> {row['change_bfloat16']:+.2%}"
            for label, row in v.items()
            if "change_float32" in row
        )
        + f": at most {moved:.1%} of the width of its 95% interval (a window's NLL moved by at most "
        f"{max(row['nll_difference_max'] for row in v.values()):.3f} nats). The eval's `own_ppl_dtype` is `fast` "
        f"by default (here: {r['fast_dtype_here']}); the head, the processor and the NLL stay float32.",
    ]


def generate_speed(r: dict) -> list[str]:
    s, rate, nll = r["settings"], r["sampled_tokens_per_s"], r["completion_nll_float32_model"]
    b, dtype = s["eval_batch"], s["eval_sample_dtype"]
    said = lambda v: f"{v['mean']:.3f} [{v['ci'][0]:.3f}, {v['ci'][1]:.3f}]"  # noqa: E731
    return [
        f"Sampling speed (`python benchmarks/generate_speed.py --n {s['n']} --new-tokens {s['new_tokens']}`), "
        f"{s['n']} prompts of 50 tokens, {s['new_tokens']} new tokens at the eval's batch {b}: the float32 model "
        f"{rate['float32']:.0f} tokens/s, the model loaded in bfloat16 {rate['bfloat16_sdpa']:.0f} (PyTorch's "
        f"scaled-dot-product attention), the eval's sampler (a copy cast to {dtype} with eager attention, "
        f"`sample_dtype` 'fast' here) {rate['eval_sampler']:.0f} ({rate['eval_sampler'] / rate['float32']:.2f}x "
        f"float32); a plain forward pass over the same tokens runs at {r['plain_forward_tokens_per_s']:.0f} "
        "tokens/s. What each samples, scored by the float32 model (NLL per completion token, 95% bootstrap "
        f"interval): float32 {said(nll['float32'])}, bfloat16 {said(nll['bfloat16_sdpa'])}, the eval's sampler "
        f"{said(nll['eval_sampler'])}. The default eval samples {r['default_eval_sets']} completion sets of 200 x 200 "
        f"tokens: {r['default_eval_generation_min']:.0f} min with its sampler for that stage alone, before any key, "
        "score or oracle perplexity.",
    ]


def oracle_dtype(r: dict) -> list[str]:
    s, t, a = r["settings"], r["seconds"], r["agreement"]
    return [
        f"The perplexity oracle's dtype (`python benchmarks/oracle_dtype.py --n {s['n']}`): `{s['oracle']}` over "
        f"{r['texts']} texts of {s['new_tokens']} tokens (human continuations and the packaged model's samples after "
        f"the same prompts), interleaved in one run: float32 {t['float32']:.1f} s, bfloat16 {t['bfloat16']:.1f} s "
        f"({r['speedup_bfloat16']:.2f}x). Per text, bfloat16 against float32: "
        + "; ".join(
            f"{name} median {v['median_ppl_float32']:.2f} -> {v['median_ppl_bfloat16']:.2f}, mean "
            f"{v['mean_relative_difference']:+.2%}, largest difference {v['max_abs_relative_difference']:.2%}"
            for name, v in a.items()
        )
        + f". The eval's `oracle_dtype` is `fast` by default: bfloat16 where the processor computes it natively "
        f"(here: {r['fast_dtype_here']}), float32 elsewhere; each perplexity file records the dtype it ran in.",
    ]


def score_dtype(r: dict) -> list[str]:
    s, t, a = r["settings"], r["seconds"], r["agreement"]
    return [
        f"The detectors' decoder dtype (`python benchmarks/score_dtype.py --n {s['n']}`): OpenStamp's detector (the "
        f"demo's release and key) on {r['texts']} texts of {s['new_tokens']} tokens ({r['scored_tokens']} scored "
        f"tokens: human continuations, the release's and the original model's completions after the same prompts), "
        f"its decoder in float32 {t['float32']:.1f} s and under bfloat16 autocast {t['bfloat16']:.1f} s "
        f"({r['speedup_bfloat16']:.2f}x). Per text, bfloat16 against float32: "
        + "; ".join(
            f"{name}: score (mean LLR) moved by {v['median_abs_score_difference']:.1e} at the median and "
            f"{v['max_abs_score_difference']:.1e} at most (the set's scores spread with sd "
            f"{v['score_sd_float32']:.3f}), flagged at p <= 0.01 {v['flagged_float32']} -> {v['flagged_bfloat16']} of "
            f"{s['n']}"
            for name, v in a.items()
        )
        + ". The eval's `score_dtype` is `fast` by default (here: "
        f"{r['fast_dtype_here']}); the head statistics stay float32, and a permutation p-value stays exact in either "
        "dtype (the states are a fixed function of the text).",
    ]


def distill_precision(r: dict) -> list[str]:
    s, fp, bf = r["settings"], r["float32"], r["bfloat16"]
    return [
        f"KGW-distilled's distillation in float32 and under bfloat16 autocast (`python benchmarks/distill_precision.py "
        f"--steps {s['steps']}`), the same seed and windows: {fp['seconds_per_step']:.2f} s a step against "
        f"{bf['seconds_per_step']:.2f} s ({r['speedup']:.2f}x); the students' KL to the delta-2 teacher on "
        f"{s['heldout']} held-out windows {fp['heldout_kl']:.4f} and {bf['heldout_kl']:.4f} (the original model's "
        f"{r['heldout_kl_original']:.4f}). The baseline distils under bfloat16 autocast by default.",
    ]


def eval_store(r: dict) -> list[str]:
    s, t, first = r["settings"], r["seconds"], r["stages"]["first"]
    return [
        f"A second eval with the same settings (`python benchmarks/eval_store.py --n {s['n']} --new-tokens "
        f"{s['new_tokens']}`): {s['methods']} on "
        f"{s['n']} prompts, {s['new_tokens']} new tokens, in two run folders sharing one eval store. The first took "
        f"{t['first']:.1f} s (keys {first['keys']:.0f} s, generation {first['generate']:.0f} s); the second "
        f"{t['second']:.1f} s ({r['speedup']:.2f}x), taking {r['taken_from_store']} keys and completion batches "
        f"from the store (same keys: {r['same_keys']}; same metrics: {r['same_metrics']}). Scores and own "
        "perplexities are not kept in the store: each run folder computes its own.",
    ]


def key_rebuild(r: dict) -> list[str]:
    runs = "; ".join(
        f"{row['threads']} thread(s): " + ", ".join(f"{k} {v:.1e}" for k, v in row["max_abs_difference"].items())
        for row in r["rows"]
    )
    return [
        f"Rebuilding a trained key from its seed (`python benchmarks/key_rebuild.py --key {r['settings']['key']}`): "
        f"{r['method']}'s seed-{r['settings']['seed']} key, built by the eval, built again in a new process on the "
        f"same machine ({r['cpu']}); largest absolute difference per tensor: {runs}. On one machine, with the "
        "eval's thread count, the seed rebuilds the key bit for bit; across sessions it did not always (seeds 0 and 1 "
        "of the sweep, run on 2026-11-25 in one folder and again as shards, with no key-building code changed in "
        "between: on seed 0 "
        "OpenStamp's and SIR's runs moved, on seed 1 the no-projection ablation's and SIR's), which points at the "
        "machine's floating-point kernels or thread count: OpenStamp's P and S, the ablation's S and SIR's transform "
        "are trained in floating point (the green lists come from SHAKE-256), so a key is kept by its saved files, "
        "not by its seed.",
    ]


def key_rebuild_from_results(r: dict) -> list[str]:
    runs = "; ".join(
        f"{row['threads']} thread(s), {row['seconds']:.0f} s: {'identical' if row['identical'] else 'different'}"
        for row in r["rows"]
    )
    machines = ", ".join(f"{m['cpu']}, {m['threads']} threads" for m in r["eval"]["machines"] or []) or "unrecorded"
    return [
        f"Rebuilding a key against a kept results.json (`python benchmarks/key_rebuild.py --results "
        f"{r['settings']['results']} --seed {r['settings']['seed']} --method {r['method']}`): the key built as that "
        f"eval built it, on {r['cpu']}, its tensors' sha256 against the run's `key_sha256` (the eval "
        f"{r['eval']['created'][:10]}, on {machines}): {runs}. Run in a later session, the same command checks "
        "whether another machine rebuilds the key.",
    ]


def detect_quality(r: dict) -> list[str]:
    rows = [
        f"Detection quality (`python benchmarks/detect_quality.py`): {r['n']} watermarked completions of "
        f"{r['new_tokens']} tokens (held-out news/Wikipedia prompts of {r['prompt_tokens']} tokens) against the "
        f"human continuations of the same prompts; delta {r['delta']}, gamma {r['gamma']}, L {r['n_lists']}; "
        f"scored as decoded text. {OLDER} At 200 tokens the LLR and the permutation test saturate "
        "(1.000); the tail-check table below shows where detection separates by length:",
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


def retie(r: dict) -> list[str]:
    res = r["results"]
    rows = [
        f"Tied heads (`python benchmarks/retie.py`): one key on {r['model']} (profile {r['profile']}, "
        f"{r['key_corpus']}; delta {r['delta']}, gamma {r['gamma']}, L {r['n_lists']}), written as the old "
        "untied export and as the re-tied default. Perplexity is the model's own on "
        f"{r['ppl_windows']} x {r['ppl_tokens']} tokens of {r['heldout_text']}; {r['n']} completions of "
        f"{r['new_tokens']} tokens from held-out {r['prompt_tokens']}-token prompts are scored as text without "
        f"their prompts, against the {r['n']} human continuations, at p <= {r['alpha']}:",
        "",
        "| release | perplexity | completions flagged | human flagged | safetensors (MB) | audit: copy of U |",
        "|---|---:|---:|---:|---:|---|",
        f"| original | {res['original']['perplexity']['ppl']:.1f} | - | - | {res['original']['size_mb']:.0f} | - |",
    ]
    for mode, label in (("untie", "untie (`--tied-head untie`)"), ("retie", "retie (default)")):
        m = res[mode]
        copy = any("holds the original unembedding" in msg for msg in m["audit_high"])
        rows.append(
            f"| {label} | {m['perplexity']['ppl']:.1f} | {m['flagged_completions']:.0%} | {m['flagged_human']:.0%} "
            f"| {m['size_mb']:.0f} | {'yes' if copy else 'no'} |"
        )
    unwm = res["retie"].get("unwatermarked")
    if unwm:
        rows += [
            "",
            "The re-tied key on unwatermarked text (its released backbone; sources of `fpr_per_key.py`): "
            + "; ".join(
                f"{name} (n {u['n']}): flagged {u['fpr_at_0.01']['rate']:.3f} at p <= 0.01 "
                f"[95% CI {u['fpr_at_0.01']['ci95'][0]:.3f}, {u['fpr_at_0.01']['ci95'][1]:.3f}], "
                f"{u['fpr_at_0.001']['rate']:.3f} at p <= 0.001"
                for name, u in unwm.items()
            )
            + ".",
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
        f"`benchmarks/results/calibration/pvalues_qq.png`. {OLDER} The per-key table below is the "
        "current measurement."
    ]


def embed_stages(r: dict) -> list[str]:
    rows = [
        f"Embedding (`python benchmarks/embed_stages.py"
        f"{' --skip-embed`: stage timings recorded in the reused key' if r['embed_total_s'] is None else '`'}"
        f", profile {r['profile']}, {r['n_states']} states):",
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
        f"Loading the converted packaged model from the cache: {r['cached_model_load_s']:.2f} s.",
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
        f"texts of {r['text_tokens']} tokens; {OLDER}):",
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


def serve_bad_inputs(r: dict) -> list[str]:
    from collections import Counter

    counts = Counter(q["status"] for q in r["requests"])
    alive = all(q["server_alive_after"] for q in r["requests"])
    echoed = any(q["text_echoed"] for q in r["requests"])
    return [
        f"Bad input against a real server (`python benchmarks/serve_bad_inputs.py`): {len(r['requests'])} requests "
        "(no or wrong API key, broken or non-UTF-8 JSON, wrong types, oversize bodies, texts and token counts, "
        "empty and too-short texts) got "
        + ", ".join(f"{n} x {status}" for status, n in sorted(counts.items()))
        + f"; {r['server_errors_5xx']} server errors. /healthz answered after every request: "
        f"{'yes' if alive else 'NO'}. Submitted text echoed back: {'YES' if echoed else 'no'}; "
        f"in the server log: {'YES' if r['texts_in_server_log'] else 'no'}. "
        "The per-request table is in `benchmarks/results/serve_bad_inputs.json`.",
    ]


def evaluation(r: dict) -> list[str]:
    from openstamp.evaluation.report import reference_table, summary_table, timing_lines

    cfg = r["config"]
    return [
        f"The paper's comparison (`bash benchmarks/reference_runs.sh eval`, i.e. `openstamp eval`): {cfg['n']} "
        f"prompts of {cfg['prompt_tokens']} tokens (held-out {cfg['corpus']}), {cfg['new_tokens']} new tokens, "
        f"temperature {cfg['temperature']}, top-p {cfg['top_p']}, seed {', '.join(map(str, cfg['seeds']))}; "
        f"negatives are the human continuations; perplexity under `{cfg['oracle']}`. Full report with plots and "
        "every attack: [`benchmarks/results/eval/report.md`](benchmarks/results/eval/report.md). "
        f"Measured on {r['created'][:10]}{_release_note(r['created'])}.{_saturation_note(r)}",
        "",
        *summary_table(r),
        "",
        *reference_table(r),
        *_flagged(r),
        *_trained(r),
        *_lengths(r),
        *(["", timing_lines(r["timings_s"])[0]] if r.get("timings_s") else []),
    ]


def sweep_memo(r: dict) -> list[str]:
    """What scoring a strength-free detector's negatives once per key saves in the sweep (``sweep_memo.py``)."""
    t = r["total"]
    parts = "; ".join(
        f"{m} " + ", ".join(f"{s} {v['before']:.0f} -> {v['after']:.0f} s" for s, v in stages.items())
        for m, stages in r["seconds"].items()
    )
    moved = "; ".join(
        f"{m}: a text's score by at most {v['largest_score_difference']:.1e}, {v['figures_that_differ']} metrics or "
        f"length-curve figures by at most {v['largest_figure_difference']:.1e}"
        for m, v in r["moved"].items()
    )
    return [
        "The sweep scores the negatives of a detector that reads its key alone, never the strength (GaussMark, KGW, "
        "Unremovable, SIR: `scores_ignore_strength`), once per key (`python benchmarks/sweep_memo.py`: the earlier "
        f"timed seed, which ran without it, those methods' {r['runs']} score and length files deleted and scored "
        f"again): {parts}; "
        f"together **{t['before']:.0f} -> {t['after']:.0f} s** a seed. Against the first run, {moved}. SIR's "
        "differences are its own: it embeds the contexts its cache lacks in one batch, so what it generated and "
        "scored before (the timed run sampled right before scoring) changes the batches and the rounding; its "
        "score stage was also slower here for that reason (nothing of its cache was warm).",
    ]


def _trained(r: dict) -> list[str]:
    """The training budget of the methods whose key is trained (KGW-distilled's student, SIR's network)."""
    cells = []
    for run in r["runs"]:
        s = run["settings"]
        if s["method"] == "kgw-distilled":
            cells.append(
                f"KGW-distilled's student was distilled for {s['steps']} steps of {s['batch_size']} x {s['seq_len']} "
                f"tokens ({s['optimizer']}, lr {s['lr']:g}) towards the delta-{s['delta']:g} teacher"
            )
        if s["method"] == "sir":
            cells.append(f"SIR's transform network was trained for {s['steps']} steps on {s['train_texts']} texts")
    return ["", "; ".join(cells) + "."] if cells else []


def _lengths(r: dict) -> list[str]:
    """Detection against length on the same completions: where the methods separate before they saturate."""
    from openstamp.evaluation.report import length_table

    table = length_table(r)
    if not table:
        return []
    plot = RESULTS / "eval" / "length_curve.png"
    return ["", "Detection against length, same run. " + table[0], *table[1:]] + (
        ["", "![length_curve.png](benchmarks/results/eval/length_curve.png)"] if plot.exists() else []
    )


def _release_note(created: str) -> str:
    if created >= RETIED_FROM:
        return ", with the re-tied OpenStamp releases (the default since e33b98b)"
    return (
        ", before tied models were re-tied and m was made exact: OpenStamp's releases in this table were untied, "
        "and they have not been re-run since"
    )


def _saturation_note(r: dict) -> str:
    """Say so when every method detects perfectly: the detection columns then separate nothing."""
    tprs = [s["tpr_at_1pct_fpr"]["mean"] for s in r["summary"] if s.get("tpr_at_1pct_fpr")]
    if tprs and min(tprs) >= 1.0:
        return " Every method detects at 1.000 here, so the detection columns do not separate the methods."
    return ""


def _flagged(r: dict) -> list[str]:
    """How often each detector's p-value flags text its watermark did not write, at p <= 0.01."""
    cells = []
    for run in r["runs"]:
        m = run["metrics"]
        if m.get("human_flagged_at_p_0.01") is not None:
            unwm = m.get("unwatermarked_flagged_at_p_0.01")
            cells.append(f"{run['run']} {m['human_flagged_at_p_0.01']:.1%} / {'-' if unwm is None else f'{unwm:.1%}'}")
    if not cells:
        return []
    return ["", "Flagged at p <= 0.01 (human continuations / unwatermarked completions): " + "; ".join(cells) + "."]


def scale_out() -> list[str]:
    """Ray batch detection (ray_detect.json) and key-building memory (key_memory.json)."""
    out: list[str] = []
    ray = load("ray_detect")
    if ray is not None:
        local = ray["in_process"]
        out += [
            f"Batch detection on Ray Data (`python benchmarks/ray_detect.py`): {ray['texts']} held-out Wikipedia "
            f"texts ({ray['tokens']} scored tokens) in {ray['shards']} JSONL shards, batch {ray['batch']}, "
            f"local Ray on {ray['cpus']} CPUs; Ray's walls include starting the actors and loading the model "
            "in each:",
            "",
            "| engine | tokens/s | wall (s) | x in-process time |",
            "|---|---:|---:|---:|",
            f"| in-process (one Detector) | {local['tokens_per_s']:.0f} | {local['detect_s']:.1f} | 1.00 |",
        ]
        for workers, run in sorted(ray["ray"].items()):
            ratio = ray["overhead_vs_in_process"][workers]
            label = f"`--engine ray --workers {workers}`"
            out.append(f"| {label} | {run['tokens_per_s']:.0f} | {run['wall_s']:.1f} | {ratio:.2f} |")
        out += [
            "",
            f"Ray start-up: {ray['ray_init_s']:.1f} s. Largest difference from in-process scores: "
            f"{ray['max_abs_score_diff']:.1e} (mean LLR), {ray['max_abs_p_value_diff']:.1e} (p-value). "
            f"Per scored token: {ray['per_token_ms']:.2f} ms, of which the head (LLR over the vocabulary and "
            f"the null statistics) is {ray['head_share']:.0%} and the backbone {ray['backbone_per_token_ms']:.2f} ms.",
            "",
        ]
        walls = "; ".join(
            f"{'in-process' if k == 'in_process' else k + ' worker(s)'} " + " / ".join(f"{w:.1f}" for w in v)
            for k, v in ray["walls_s"].items()
        )
        loads = ray.get("load_avg_1min")
        if loads:
            walls += f" (1-minute load average at each round's start: {', '.join(f'{x:.1f}' for x in loads)})"
        out += [f"Walls per round, in seconds: {walls}.", ""]
    km = load("kmeans_backends")
    if km is not None:
        sk, tk = km["backends"]["sklearn"], km["backends"]["torch"]
        out += [
            f"The selector's k-means (`python benchmarks/kmeans_backends.py`, {km['model']}, {km['states_train']:,} "
            f"training states of width {km['hidden_size']}, L {km['lists']}, no P, {km['threads']} thread(s) on "
            f"{km['device']}): scikit-learn {sk['wall_s']:.0f} s, inertia {sk['inertia_per_state']:.1f} per state, "
            f"held-out selector accuracy {sk['heldout_accuracy']:.3f}; torch ({tk['rounds']} Lloyd rounds) "
            f"{tk['wall_s']:.0f} s, inertia {tk['inertia_per_state']:.1f}, held-out accuracy "
            f"{tk['heldout_accuracy']:.3f}. The torch path exists for GPUs; on a CPU scikit-learn stays the default.",
            "",
        ]
    mem = load("key_memory")
    if mem is not None:
        by = {(p["mode"], p["n_states"]): p for p in mem["points"]}
        sizes = sorted({n for _, n in by})
        fits, x = mem["fits"], mem["extrapolation_7b"]
        out += [
            f"Key-building memory (`python benchmarks/key_memory.py`, {mem['model']}, L {mem['lists']}, no P): "
            "peak RSS above the loaded model while sampling states and fitting S; the sharded path streams "
            f"chunks of {mem.get('chunk', 8192)} states",
            "",
            "| states | in memory (MB) | sharded on disk (MB) |",
            "|---:|---:|---:|",
            *(
                f"| {n} | {by[('memory', n)]['above_model_mb']:.0f} | {by[('sharded', n)]['above_model_mb']:.0f} |"
                for n in sizes
                if ("memory", n) in by and ("sharded", n) in by
            ),
            "",
            f"Slopes: {fits['memory']['mb_per_1k_states']:.2f} MB per 1,000 states in memory, "
            f"{fits['sharded']['mb_per_1k_states']:.2f} sharded. Extrapolated to a 7B model (hidden "
            f"{x['hidden_size']}) and the paper's {x['states']:,} states: {x['in_memory_gb']:.1f} GB in memory "
            f"against about {x['sharded_gb']:.2f} GB sharded (Gram matrix plus one chunk), besides the model.",
            "",
        ]
    return out


def render() -> str:
    sections = [
        ("embed_stages", embed_stages),
        ("selector_variants", selector_variants),
        ("detect_speed", detect_speed),
        ("score_reuse", score_reuse),
        ("retied_lengths", retied_lengths),
        ("eval_retime", eval_retime),
        ("score_retime", score_retime),
        ("own_ppl_reuse", own_ppl_reuse),
        ("own_ppl_dtype", own_ppl_dtype),
        ("eval_store", eval_store),
        ("generate_speed", generate_speed),
        ("oracle_dtype", oracle_dtype),
        ("score_dtype", score_dtype),
        ("distill_precision", distill_precision),
        ("key_rebuild", key_rebuild),
        ("key_rebuild_from_results", key_rebuild_from_results),
        ("detect_quality", detect_quality),
        ("retie", retie),
    ]
    out: list[str] = []
    for name, render in sections:
        result = load(name)
        if result is not None:
            out += render(result) + [""]
    ev = RESULTS / "eval" / "results.json"
    if ev.exists():
        out += evaluation(json.loads(ev.read_text())) + [""]
        out += robustness(ev.parent) + [""]
    if (timed := load("eval_timed/results")) is not None:
        invocations = load("eval_timed/timings")
        out += evaluation_timed(timed, json.loads(ev.read_text()) if ev.exists() else None, invocations) + [""]
        if (again := load("eval_timed/rerun/results")) is not None:
            out += evaluation_retimed(again, timed, load("eval_timed/rerun/made"), load("eval_timed/rerun/timings"))
    if (memo := load("sweep_memo")) is not None:
        out += sweep_memo(memo) + [""]
    out += paraphrase64(RESULTS / "paraphrase64", "benchmarks/results/paraphrase64")
    for attacks in AT_COST:
        out += robust_at_cost(RESULTS, attacks=attacks)
    if (bias := load("pruned_bias")) is not None:
        out += pruned_bias(bias)
    if (coverage := load("verdict_coverage")) is not None:
        out += verdict_coverage(coverage)
    durable = RESULTS / "durability" / "results.json"
    if durable.exists():
        cfg = json.loads(durable.read_text())["config"]
        source = (
            f"`bash benchmarks/reference_runs.sh durability`: the current re-tied releases, {cfg['n']} prompts, "
            f"{cfg['new_tokens']} new tokens; each quantizer's backend (its real library, or simulated) is named "
            "in its row; the fine-tune merged in is the base fully instruction-tuned for 100 steps by "
            "`benchmarks/base_finetune.py`; "
            "plots of TPR and perplexity against t and sparsity in `benchmarks/results/durability/attacks/`"
        )
        out += durability(durable.parent, source) + [""]
    cal = RESULTS / "calibration" / "calibration.json"
    if cal.exists():
        out += calibration(json.loads(cal.read_text())) + [""]
    cost = RESULTS / "cost" / "results.json"
    if cost.exists():
        out += strength_sweep(json.loads(cost.read_text())) + [""]
    out += pareto_sweep()
    out += budget()
    out += projection()
    for name, render_section in (
        ("tune", tune),
        ("tune_shrinkage", tune),
        ("fpr_per_key", fpr_per_key),
        ("tail_check", tail_check),
    ):
        result = load(name)
        if result is not None:
            out += render_section(result) + [""]
    out += analyses(RESULTS)
    for name, render_section in (("serve_load", serve_load), ("serve_bad_inputs", serve_bad_inputs)):
        result = load(name)
        if result is not None:
            out += render_section(result) + [""]
    out += scale_out()
    return "\n".join(out).rstrip() + "\n"


def pareto_sweep(whole: bool = True) -> list[str]:
    """The Pareto sweep's section (benchmarks/results/sweep/): whole in RESULTS.md, at equal cost in the README."""
    pareto = RESULTS / "sweep" / "results.json"
    return sweep(json.loads(pareto.read_text()), pareto.parent, whole) + [""] if pareto.exists() else []


def budget(whole: bool = True) -> list[str]:
    """Each sweep point against the second-order ceiling (benchmarks/results/detection_budget.json)."""
    result = load("detection_budget")
    reruns = RESULTS / "sweep" / "rerun"
    return [] if result is None else detection_budget(result, whole, load("retie"), load("full_llr"), reruns)


def projection() -> list[str]:
    """The projection under paraphrase (benchmarks/results/projection/): pooled per prompt, then key by key."""
    folder, shown = RESULTS / "projection", "benchmarks/results/projection"
    return projection_test(folder, shown) + projection_keys(folder, shown)


def headline() -> str:
    """What the README shows: the Pareto sweep with its plots, what its costs can buy at best, every method under
    paraphrase, token edits and quantization at equal cost, the projection under paraphrase at equal cost, the
    strength `tune` chooses and what it costs, and the false-positive rate per key; the rest is in RESULTS.md."""
    out: list[str] = []
    out += pareto_sweep(whole=False)
    out += budget(whole=False)
    out += paraphrase_baselines(RESULTS / "paraphrase64", "benchmarks/results/paraphrase64")
    for attacks in AT_COST:
        out += robust_at_cost(RESULTS, per_key=False, attacks=attacks)
    out += projection()
    for name, render_section in (("tune", tune), ("tune_shrinkage", tune), ("fpr_per_key", fpr_per_key)):
        result = load(name)
        if result is not None:
            out += render_section(result) + [""]
    out.append(
        "Everything else measured (embedding, detection speed and quality, the default comparison and its timing, "
        "robustness and paraphrase, calibration, the paper's analyses, the service, scale-out) is in "
        f"[{RESULTS_PAGE.name}]({RESULTS_PAGE.name}), these sections included, rendered by the same script."
    )
    return "\n".join(out).rstrip() + "\n"


PAGE_HEAD = """# OpenStamp: measured on this machine (2 CPU cores; float32 unless a section says otherwise)

Rendered by `python benchmarks/summary.py --readme` from `benchmarks/results/` (do not edit by hand): every figure
comes from a script in `benchmarks/` or a command in `benchmarks/reference_runs.sh` that writes its JSON there. The
conventions (the key, and which results predate which change of the sampler and of the dtypes) are in the README's
section "Measured on this machine".

"""


def page(text: str) -> str:
    """RESULTS.md as it should read."""
    return PAGE_HEAD + text


def readme_with(text: str) -> str:
    """README.md with `text` between its results markers."""
    readme = README.read_text(encoding="utf-8")
    if readme.count(START) != 1 or readme.count(END) != 1:
        raise SystemExit(f"README.md needs exactly one {START} and one {END}")
    head, rest = readme.split(START)
    tail = rest.split(END)[1]
    return f"{head}{START}\n{text}{END}{tail}"


def write_pages(text: str, head: str) -> None:
    """Write every measurement into RESULTS.md and the headline into README.md, each atomically."""
    from openstamp.storage import atomic_write_text

    atomic_write_text(RESULTS_PAGE, page(text))
    print(f"wrote {RESULTS_PAGE}")
    atomic_write_text(README, readme_with(head))
    print(f"wrote the results into {README}")


def stale_pages(text: str, head: str) -> list[str]:
    """The pages whose text differs from what the results in benchmarks/results/ render."""
    stale = []
    if not RESULTS_PAGE.exists() or RESULTS_PAGE.read_text(encoding="utf-8") != page(text):
        stale.append(RESULTS_PAGE.name)
    if README.read_text(encoding="utf-8") != readme_with(head):
        stale.append(README.name)
    return stale


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--readme", action="store_true", help="also write RESULTS.md, and the headline results into README.md"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if RESULTS.md or README.md's results differ from what benchmarks/results/ renders, else 0",
    )
    args = parser.parse_args()
    text = render()
    if args.check:
        stale = stale_pages(text, headline())
        if stale:
            pages = " and ".join(stale)
            fix = "python benchmarks/summary.py --readme"
            raise SystemExit(f"{pages} differ from what benchmarks/results/ renders; to render them: {fix}")
        print("RESULTS.md and README.md's results match benchmarks/results/")
        return
    print(text)
    if args.readme:
        write_pages(text, headline())


if __name__ == "__main__":
    main()
