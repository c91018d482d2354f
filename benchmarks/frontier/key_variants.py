"""Key variants against the default key at the same strengths: detection, cost, and where the separation goes.

    python benchmarks/frontier/key_variants.py [--deltas 0.5,1 --tokens 64 --n 64 --variants plain,centred,...]

One secret and one set of hidden states serve every variant, so the variants differ only in what they change:

A variant is named by dash-joined parts, each changing one setting of the profile:

* ``plain``: the profile's key as it is (P, ridge S, re-tied release);
* ``raw``: S fitted on raw final hidden states, P = I (as the authors' code does);
* ``centred``: ``green.centre`` (dW's frequency-weighted mean row removed);
* ``consistency``: S fitted with the context-consistency penalty (``selector.consistency`` 1);
* ``f<x>``: ridge shrinkage ``selector.shrinkage`` x;
* ``g<x>``: green fraction ``green.gamma`` x;
* ``L<n>``: ``selector.n_lists`` n;
* ``c<x>``: the consistency penalty's weight ``selector.consistency`` x;
* ``F<x>``: the input-side Fisher penalty's weight ``selector.fisher`` x;
* ``N<n>``: ``states.n_states`` n, and ``P<n>``: ``states.positions_per_window`` n (P240 with 256-token windows
  takes every position after the first 16); ``G<n>``: ``states.generated_windows`` n, windows of the model's own
  samples added to the corpus's (``openstamp.embed.states.sampled_windows``). A variant with its own states writes them
  in shards under ``--states-dir`` and fits S by streaming over them (``openstamp.embed.shards``), as ``embed
  --states-dir`` does;
* ``R<x>``: the re-tied release's backbone repaired for x minutes (``openstamp.embed.repair``, as ``embed
  --repair-minutes`` does) at each delta, before its completions are sampled; the point keeps the repair's report.

For example ``raw-centred-f8-g0.1``. ``--keys K`` measures K keys, each with its own secret (S and P do not depend
on the secret, so they are fitted once); ``--split tune`` uses the first ``n`` held-out prompts and ``--split test``
the next ``n``, so settings chosen on one are reported on the other.

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
import copy
import dataclasses
import hashlib
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import RESULTS  # noqa: E402

from openstamp.config import DetectConfig, load_profile  # noqa: E402
from openstamp.corpus import load_documents, split_documents  # noqa: E402
from openstamp.detect import Detector  # noqa: E402
from openstamp.detect.rates import clopper_pearson  # noqa: E402
from openstamp.embed.build import build_key  # noqa: E402
from openstamp.embed.repair import RepairConfig, repair_backbone  # noqa: E402
from openstamp.embed.states import collect_states  # noqa: E402
from openstamp.embed.tune import TuneConfig, heldout_pairs  # noqa: E402
from openstamp.lab.evaluation.budget import cost_nats, llr_budget  # noqa: E402
from openstamp.model.generate import sample_completions  # noqa: E402
from openstamp.model.load import load_model  # noqa: E402
from openstamp.model.patch import apply_watermark, revert_watermark  # noqa: E402
from openstamp.model.perplexity import perplexity, window_nll  # noqa: E402
from openstamp.model.text import bos_prefix, token_frequencies  # noqa: E402
from openstamp.runtime import versions  # noqa: E402
from openstamp.storage import atomic_write_json, read_json  # noqa: E402

SECRET = bytes(range(32))
PARTS = {  # flag parts -> (profile overrides, centre)
    "plain": ({}, False),
    "raw": ({"projection.enabled": False}, False),
    "centred": ({}, True),
    "consistency": ({"selector.consistency": 1.0}, False),
}
NUMBERED = {
    "f": ("selector.shrinkage", float),
    "g": ("green.gamma", float),
    "L": ("selector.n_lists", int),
    "c": ("selector.consistency", float),
    "F": ("selector.fisher", float),
    "N": ("states.n_states", int),
    "P": ("states.positions_per_window", int),
    "G": ("states.generated_windows", int),
    "R": ("repair.minutes", float),  # not a profile setting: measure() repairs the release
}


def parse_variant(name: str) -> tuple[dict, bool]:
    """``raw-centred-f8`` -> ({"projection.enabled": False, "selector.shrinkage": 8.0}, True)."""
    overrides, centre = {}, False
    for part in name.split("-"):
        if part in PARTS:
            more, flag = PARTS[part]
            overrides.update(more)
            centre = centre or flag
        elif part[:1] in NUMBERED and part[1:]:
            setting, kind = NUMBERED[part[:1]]
            try:
                overrides[setting] = kind(part[1:])
            except ValueError:
                raise ValueError(f"variant {name!r}: {part!r} needs a number after {part[:1]!r}") from None
        else:
            numbered = ", ".join(f"{k}<x>" for k in NUMBERED)
            raise ValueError(f"variant {name!r}: unknown part {part!r}; use {sorted(PARTS)} or {numbered}")
    return overrides, centre


def secret(index: int) -> bytes:
    """Key 0 is the tune split's fixed secret; key j > 0 a fresh one, derived from j."""
    return SECRET if index == 0 else hashlib.sha256(b"openstamp/key-variants/" + index.to_bytes(4, "little")).digest()


def keys(model, tok, documents, names, profile, key_ids, progress, states_dir: Path):
    """(variant, key index) -> key, from one set of states (P and S refitted only where their settings differ; a
    variant with its own states settings gets its own states, in shards under ``states_dir``)."""
    cfg = load_profile(profile)
    shared = None
    weights = token_frequencies(tok, documents, model.get_output_embeddings().weight.shape[0])
    fitted, out = {}, {}
    for name in names:
        overrides, centre = parse_variant(name)
        overrides = {k: v for k, v in overrides.items() if not k.startswith("repair.")}
        variant_cfg = cfg.with_overrides(overrides)
        fit = tuple(sorted((k, v) for k, v in overrides.items() if not k.startswith("green.")))
        for index in key_ids:
            if fit not in fitted and any(k.startswith("states.") for k in overrides):
                where = states_dir / "-".join(f"{k.split('.')[-1]}{v}" for k, v in fit if k.startswith("states."))
                fitted[fit] = build_key(model, tok, documents, variant_cfg, secret=secret(index), states_dir=where,
                                        progress=progress)  # fmt: skip
            elif fit not in fitted:
                if shared is None:
                    shared = collect_states(model, tok, documents, cfg.states, progress)
                fitted[fit] = build_key(model, tok, documents, variant_cfg, secret=secret(index), states=shared,
                                        progress=progress)  # fmt: skip
            key = dataclasses.replace(
                fitted[fit], secret=secret(index), gamma=variant_cfg.green.gamma, centring=None, meta={}
            )
            out[name, index] = dataclasses.replace(key, centring=key.green_float.T @ weights) if centre else key
    return out


def measure(model, tok, key, delta, pairs, tune_cfg, original_nll, skips, progress, repair=None) -> dict:
    """TPR, own-PPL change and the LLR decomposition of ``key`` at ``delta`` (the model is left as it was); TPR also
    with the first k tokens of each text skipped, for each k in ``skips`` (0 is always measured). ``repair``
    ((documents, RepairConfig) or None) repairs a copy of the release's backbone first and detects on that copy."""
    key = dataclasses.replace(key, delta=delta)
    bos = bos_prefix(tok)
    human = [h for _, h in pairs]
    release, report = model, None
    if repair is not None:
        release = copy.deepcopy(model)
        apply_watermark(release, key, "retie")
        report = repair_backbone(release, model, tok, *repair, progress=progress)
    else:
        apply_watermark(model, key, "retie")
    try:
        ids = sample_completions(
            release, tok, [p for p, _ in pairs], tune_cfg.tokens, seed=0, batch_size=tune_cfg.batch_size,
            progress=progress,
        )  # fmt: skip
        nll = window_nll(release, [(bos + p, h) for p, h in pairs], batch_size=tune_cfg.batch_size)
    finally:
        if repair is None:
            revert_watermark(model, key)
    wm_texts = tok.batch_decode(ids, skip_special_tokens=True)
    hu_texts = tok.batch_decode(human, skip_special_tokens=True)
    detector, results = Detector(release, tok, key, DetectConfig(alpha=tune_cfg.fpr)), {}
    for skip in skips:  # one detector (one watermarked copy), its config changed per k
        detector.config = dataclasses.replace(detector.config, skip_tokens=skip)
        results[skip] = detector.detect(wm_texts), detector.detect(hu_texts)

    def flagged(rs) -> int:
        return sum(r.p_value is not None and r.p_value <= tune_cfg.fpr for r in rs)

    by_skip = {
        str(skip): {"tpr": flagged(w) / len(w), "tpr_ci": clopper_pearson(flagged(w), len(w)),
                    "human_fpr": flagged(h) / len(h)}
        for skip, (w, h) in results.items()
    }  # fmt: skip
    wm, hu = results[0]
    hits, false = flagged(wm), flagged(hu)
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
        "by_skip": by_skip,
        **budget,
        **({"repair": report} if report is not None else {}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="wikipedia")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--variants", default="plain,centred,consistency,raw,raw-centred")
    parser.add_argument("--keys", type=int, default=1, help="keys per variant (key 0 is the fixed tune secret)")
    parser.add_argument("--first-key", type=int, default=0, help="index of the first key (1: fresh keys only)")
    parser.add_argument("--split", choices=("tune", "test"), default="tune")
    parser.add_argument("--skips", default="0", help="TPR also with the first k tokens unscored, for each k")
    parser.add_argument("--deltas", default="0.5,1")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--n", type=int, default=64)
    parser.add_argument("--out", type=Path, default=RESULTS / "key_variants.json")
    parser.add_argument("--states-dir", type=Path, default=Path("runs/key-variants-states"),
                        help="where variants with their own states settings write them (shards)")  # fmt: skip
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args()
    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    for name in names:
        try:
            parse_variant(name)
        except ValueError as err:
            parser.error(str(err))
    key_ids = range(args.first_key, args.first_key + args.keys)
    skips = sorted({0, *(int(k) for k in args.skips.split(","))})
    deltas = [float(d) for d in args.deltas.split(",")]
    settings = {k: str(v) for k, v in vars(args).items() if k not in ("quiet", "out", "states_dir")}
    record = read_json(args.out, "results") if args.out.exists() else {}
    if record.get("settings") != settings:
        record = {"settings": settings, "versions": versions(), "points": {}}
    model, tok = load_model(args.model)
    docs = load_documents(args.corpus)
    train, held = split_documents(docs, "key"), split_documents(docs, "heldout")
    tune_cfg = TuneConfig(tokens=args.tokens, n=args.n, fpr=0.01, batch_size=16)
    pairs = heldout_pairs(tok, held, dataclasses.replace(tune_cfg, n=2 * args.n))
    pairs = pairs[: args.n] if args.split == "tune" else pairs[args.n :]
    bos = bos_prefix(tok)
    original_nll = window_nll(model, [(bos + p, h) for p, h in pairs], batch_size=tune_cfg.batch_size)
    start = time.time()
    variant_keys = keys(model, tok, train, names, args.profile, key_ids, not args.quiet, args.states_dir)
    record["key_seconds"] = time.time() - start
    for name in names:
        for index in key_ids:
            for delta in deltas:
                label = f"{name}@{delta:g}" + (f"#k{index}" if index else "")
                if label in record["points"]:
                    continue
                t0 = time.time()
                key = variant_keys[name, index]
                minutes = parse_variant(name)[0].get("repair.minutes")
                repair = None if minutes is None else (train, RepairConfig(minutes=minutes))
                point = measure(model, tok, key, delta, pairs, tune_cfg, original_nll, skips, not args.quiet, repair)
                record["points"][label] = {"variant": name, "key": index, **point, "seconds": time.time() - t0}
                atomic_write_json(args.out, record)
                print(
                    f"{label:>24}: TPR {point['tpr']:.3f}  own PPL {point['own_ppl_change']:+.1%}  "
                    f"seen {fmt(point['seen'])}  signal {fmt(point['signal'])}  spread {fmt(point['spread'])}",
                    flush=True,
                )
    print(f"wrote {args.out}")


def fmt(value) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.2f}"


if __name__ == "__main__":
    main()
