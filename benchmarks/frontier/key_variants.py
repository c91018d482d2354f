"""Key variants against the default key at the same strengths: detection, cost, and where the separation goes.

    python benchmarks/frontier/key_variants.py [--deltas 0.5,1 --tokens 64 --n 64 --variants plain,centred,...]

One secret and one set of hidden states serve every variant, so the variants differ only in what they change:

* ``plain``: the default profile's key (P, ridge S, re-tied release);
* ``centred``: the same key with ``green.centre`` (dW's frequency-weighted mean row removed);
* ``consistency``: S fitted with the context-consistency penalty (``selector.consistency`` 1);
* ``raw``: S fitted on raw final hidden states, P = I (as the authors' code does);
* ``raw-centred``: both;
* ``raw-centred-consistency``: the three together.

For each variant and delta the script watermarks the packaged model (re-tied), samples ``n`` completions of
``tokens`` tokens from held-out prompts, and detects them without their prompts; it scores the human continuations
with the same key, and measures the model's own perplexity on those continuations. It reports TPR at 1% FPR with
its interval, the own-perplexity change, and the decomposition of the mean-LLR separation
(``openstamp.lab.evaluation.budget.llr_budget``): seen (the part of the cost the LLR sees on human text), signal
(the watermarked mean LLR against that seen cost) and spread (the human scores' spread against independent
tokens). Writes benchmarks/results/key_variants.json atomically, after every point (re-running resumes).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import RESULTS  # noqa: E402

from openstamp.config import DetectConfig, load_profile  # noqa: E402
from openstamp.corpus import load_documents, split_documents  # noqa: E402
from openstamp.detect import Detector  # noqa: E402
from openstamp.generate import sample_completions  # noqa: E402
from openstamp.hidden import collect_states  # noqa: E402
from openstamp.lab.evaluation.budget import cost_nats, llr_budget  # noqa: E402
from openstamp.models import load_model  # noqa: E402
from openstamp.patch import apply_watermark, revert_watermark  # noqa: E402
from openstamp.quality import perplexity, window_nll  # noqa: E402
from openstamp.stats import clopper_pearson  # noqa: E402
from openstamp.storage import atomic_write_json, read_json  # noqa: E402
from openstamp.text import bos_prefix, token_frequencies  # noqa: E402
from openstamp.tune import TuneConfig, heldout_pairs  # noqa: E402
from openstamp.watermark import build_key, versions  # noqa: E402

SECRET = bytes(range(32))
VARIANTS = {  # name -> (profile overrides, centre)
    "plain": ({}, False),
    "centred": ({}, True),
    "consistency": ({"selector.consistency": 1.0}, False),
    "raw": ({"projection.enabled": False}, False),
    "raw-centred": ({"projection.enabled": False}, True),
    "raw-centred-consistency": ({"projection.enabled": False, "selector.consistency": 1.0}, True),
}


def keys(model, tok, documents, names, profile, progress):
    """Each named variant's key, from one secret and one set of states (P and S refitted where they differ)."""
    cfg = load_profile(profile)
    states = collect_states(model, tok, documents, cfg.states, progress)
    built, out = {}, {}
    weights = token_frequencies(tok, documents, model.get_output_embeddings().weight.shape[0])
    for name in names:
        overrides, centre = VARIANTS[name]
        fit = tuple(sorted(overrides.items()))
        if fit not in built:
            built[fit] = build_key(
                model, tok, documents, cfg.with_overrides(dict(overrides)), secret=SECRET, states=states,
                progress=progress,
            )  # fmt: skip
        key = built[fit]
        out[name] = dataclasses.replace(key, centring=key.green_float.T @ weights) if centre else key
    return out


def measure(model, tok, key, delta, pairs, tune_cfg, original_nll, progress) -> dict:
    """TPR, own-PPL change and the LLR decomposition of ``key`` at ``delta`` (the model is left as it was)."""
    key = dataclasses.replace(key, delta=delta)
    bos = bos_prefix(tok)
    human = [h for _, h in pairs]
    apply_watermark(model, key, "retie")
    try:
        ids = sample_completions(
            model, tok, [p for p, _ in pairs], tune_cfg.tokens, seed=0, batch_size=tune_cfg.batch_size,
            progress=progress,
        )  # fmt: skip
        nll = window_nll(model, [(bos + p, h) for p, h in pairs], batch_size=tune_cfg.batch_size)
    finally:
        revert_watermark(model, key)
    detector = Detector(model, tok, key, DetectConfig(alpha=tune_cfg.fpr))
    wm = detector.detect(tok.batch_decode(ids, skip_special_tokens=True))
    hu = detector.detect(tok.batch_decode(human, skip_special_tokens=True))
    hits = sum(r.p_value is not None and r.p_value <= tune_cfg.fpr for r in wm)
    false = sum(r.p_value is not None and r.p_value <= tune_cfg.fpr for r in hu)
    wm_scores = [r.score for r in wm if r.score is not None]  # a too-short text has no score
    hu_scores = [r.score for r in hu if r.score is not None]
    change = perplexity(nll) / perplexity(original_nll) - 1
    budget = llr_budget(hu_scores, wm_scores, cost_nats(change), tune_cfg.tokens)
    return {
        "delta": delta,
        "tpr": hits / len(wm),
        "tpr_ci": clopper_pearson(hits, len(wm)),
        "human_fpr": false / len(hu),
        "own_ppl_change": change,
        "scored": [len(wm_scores), len(hu_scores)],
        "mean_llr_watermarked": sum(wm_scores) / len(wm_scores),
        "mean_llr_human": sum(hu_scores) / len(hu_scores),
        **budget,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="wikipedia")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--variants", default="plain,centred,consistency,raw,raw-centred")
    parser.add_argument("--deltas", default="0.5,1")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS / "key_variants.json")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(names) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {sorted(VARIANTS)}")
    deltas = [float(d) for d in args.deltas.split(",")]
    settings = {k: str(v) for k, v in vars(args).items() if k != "quiet"}
    record = read_json(args.out, "results") if args.out.exists() else {}
    if record.get("settings") != settings:
        record = {"settings": settings, "versions": versions(), "points": {}}
    model, tok = load_model(args.model)
    docs = load_documents(args.corpus)
    train, held = split_documents(docs, "key"), split_documents(docs, "heldout")
    tune_cfg = TuneConfig(tokens=args.tokens, n=args.n, fpr=0.01, batch_size=16)
    pairs = heldout_pairs(tok, held, tune_cfg)
    bos = bos_prefix(tok)
    original_nll = window_nll(model, [(bos + p, h) for p, h in pairs], batch_size=tune_cfg.batch_size)
    start = time.time()
    variant_keys = keys(model, tok, train, names, args.profile, not args.quiet)
    record["key_seconds"] = time.time() - start
    for name in names:
        for delta in deltas:
            label = f"{name}@{delta:g}"
            if label in record["points"]:
                continue
            t0 = time.time()
            point = measure(model, tok, variant_keys[name], delta, pairs, tune_cfg, original_nll, not args.quiet)
            record["points"][label] = {"variant": name, **point, "seconds": time.time() - t0}
            atomic_write_json(args.out, record)
            print(
                f"{label:>18}: TPR {point['tpr']:.3f}  own PPL {point['own_ppl_change']:+.1%}  "
                f"seen {fmt(point['seen'])}  signal {fmt(point['signal'])}  spread {fmt(point['spread'])}",
                flush=True,
            )
    print(f"wrote {args.out}")


def fmt(value) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2f}"


if __name__ == "__main__":
    main()
