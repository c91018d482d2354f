"""What the strength chosen for pooled detection of sources costs in own perplexity, for several source sizes.

    python benchmarks/provenance/pooled_cost.py --key-tune KEY_A --key-test KEY_B [--texts 10,20,50] [--out DIR]
    python benchmarks/provenance/pooled_cost.py --quick --key-tune KEY_A --key-test KEY_B   # smoke run, minutes

``openstamp tune --target pooled --texts N --tokens T --p 1e-6`` chooses the smallest delta at which a source of N
texts of T tokens, detected together (``detect/pool.py``), reaches pooled p <= 1e-6 in 95% of sources. This measures
what that delta costs in the model's own perplexity on human text, for N = 10, 20 and 50 at T = 200 (the goal: at the
strength chosen for N = 20, at most +3%). It walks the product path of ``embed/tune.py``'s ``probe``:
``apply_watermark(model, key, "retie")`` at a delta, ``sample_completions`` of one completion per held-out prompt,
``Detector`` and ``source_pvalues`` (a source: ``N`` of the completions drawn at random without replacement, pooled),
own perplexity on the prompts' human continuations, ``revert_watermark``.

A setting chosen on the numbers it is judged by is not a result, so there are two splits:

* tune (stage 1): ``--key-tune``, ``--n`` prompts of ``--prompt-tokens`` from the held-out half of the packaged
  ``wikipedia`` corpus. For every delta of ``--deltas`` the model samples ONCE, and that one set of completions
  serves every N (the reason for this script over running ``tune`` once per N): per N, the fraction of ``--sources``
  random sources detected at pooled p <= ``--p`` (Clopper-Pearson 95% interval) and their median p; and the own
  perplexity with its change over the unwatermarked model's on the same pairs (paired bootstrap 95% interval over
  windows). The chosen delta per N is the smallest grid delta whose fraction is >= ``--target-tpr`` (if none is,
  the grid point with the highest fraction, marked not reached, as ``tune`` does). A log-linear interpolation
  between the last grid miss and the first hit is recorded too, labelled as such: it was not measured.
* test (stage 2): ``--key-test`` (a fresh key: another secret), ``--n`` fresh prompts from the held-out half of
  ``news`` (no document shared with the tune split, asserted by sha256; neither split shares one with the key half
  of ``--corpus``), sampled with ``--test-seed``. At each N's chosen delta: sources detected (with its interval),
  own perplexity change against the unwatermarked model on the test pairs, and the median pooled p.

Sources are random groups of the split's ``--n`` completions (``source_pvalues``), so where N is not small against
n they overlap: two sources share N/n of their texts on average (recorded per N as ``expected_overlap``). At
N = 50 of 60 completions they overlap heavily (83%): the sources are far from independent, and the interval, which
assumes independent sources, is too narrow there; read the N = 50 rows as a check of one set of 60 texts. (``--n``
is 60 because the held-out half of ``news`` holds only 62 windows of 50 + 200 tokens.)

Every delta of each stage and both unwatermarked baselines are cached as JSON under ``--out`` (git-ignored runs/),
so a re-run resumes; a run with other settings (``--deltas`` and ``--name`` aside) is refused. Keys not given are
built once (the profile's default key on the key half of ``--corpus``, two fixed secrets) under ``--out/keys``.
Writes benchmarks/results/<name>.json atomically (``--quick``: pooled_cost_quick, so a smoke run never replaces the
result).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import hashlib
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import claim_run, saved_key, write_result  # noqa: E402

from openstamp.storage import atomic_write_json, read_json  # noqa: E402

TUNE_CORPUS, TEST_CORPUS = "wikipedia", "news"  # held-out halves: prompts of each split
GEN_DTYPE = "float32"
DETECT_ALPHA = 0.01  # probe's DetectConfig(alpha=cfg.fpr): the decision only; pooled p-values do not depend on it
GOAL = {"texts": 20, "max_own_ppl_change": 0.03}
QUICK = {"n": 8, "sources": 5, "texts": "2,4", "deltas": "0.25,1.0", "tokens": 32}


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="base model: packaged alias, directory or hub id")
    parser.add_argument("--profile", default="default", help="profile of keys built here")
    parser.add_argument("--corpus", default="wikipedia", help="the keys' corpus (its key half); kept out of splits")
    parser.add_argument("--key-tune", type=Path, help="key of the tune split (default: built under --out/keys)")
    parser.add_argument("--key-test", type=Path, help="a fresh key for the test split (another secret)")
    parser.add_argument("--tokens", type=int, default=200, help="new tokens per text")
    parser.add_argument("--prompt-tokens", type=int, default=50)
    parser.add_argument("--n", type=int, default=60, help="prompts (completions) per split; news holds 62")
    parser.add_argument("--sources", type=int, default=40, help="random sources per N and delta")
    parser.add_argument("--p", type=float, default=1e-6, help="a source is detected at pooled p <= this")
    parser.add_argument("--target-tpr", type=float, default=0.95, help="fraction of sources that must be detected")
    parser.add_argument("--texts", default="10,20,50", help="N: texts per source, a comma list")
    parser.add_argument("--deltas", default="0.03,0.045,0.065,0.09,0.13,0.18,0.25", help="the tune grid")
    parser.add_argument("--batch-size", type=int, default=16, help="completions per generation batch")
    parser.add_argument("--seed", type=int, default=0, help="tune split: sampling and source draws")
    parser.add_argument("--test-seed", type=int, default=1, help="test split: sampling and source draws")
    parser.add_argument("--device", default="auto", help="auto (cuda if there is one), cpu, cuda")
    parser.add_argument("--out", type=Path, help="cache folder (default runs/<name>)")
    parser.add_argument("--name", default="pooled_cost", help="writes benchmarks/results/<name>.json")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {QUICK}, --name pooled_cost_quick")
    args = parser.parse_args()
    if args.quick:  # the quick sizes, where not given explicitly
        for k, v in QUICK.items():
            if getattr(args, k) == parser.get_default(k):
                setattr(args, k, v)
        if args.name == parser.get_default("name"):
            args.name = "pooled_cost_quick"
    args.texts = sorted({int(x) for x in str(args.texts).split(",") if x.strip()})
    args.deltas = sorted({float(x) for x in str(args.deltas).split(",") if x.strip()})
    args.out = args.out or Path("runs") / args.name
    if not args.texts or not args.deltas or min(args.deltas) <= 0:
        parser.error("need at least one N and one positive delta")
    if not 1 <= min(args.texts) <= max(args.texts) <= args.n:
        parser.error(f"need 1 <= N <= n={args.n} for every N of --texts")
    return args


def secret(role: str, seed: int) -> bytes:
    return hashlib.sha256(f"openstamp/pooled-cost/{role}/{seed}".encode()).digest()


def keys(args, model, tokenizer) -> dict:
    """The tune and test keys: loaded from --key-tune/--key-test, or built once under --out/keys."""
    out, states = {}, None
    for role in ("tune", "test"):
        given = getattr(args, f"key_{role}")
        directory = Path(given) if given else args.out / "keys" / role
        key, states = saved_key(
            directory, model, tokenizer, model_spec=args.model, secret=secret(role, args.seed),
            profile=args.profile, corpus=args.corpus, states=states,
        )  # fmt: skip
        out[role] = (key, directory)
    (tune_key, _), (test_key, _) = out["tune"], out["test"]
    if tune_key.key_id == test_key.key_id or tune_key.secret == test_key.secret:
        raise SystemExit("the test key must be a fresh key (another secret) than the tune key")
    return out


def splits(args, tokenizer, tune_key, test_key) -> dict:
    """(prompt, human continuation) pairs of each split, from disjoint held-out documents."""
    from openstamp import load_documents, split_documents
    from openstamp.embed.tune import TuneConfig, heldout_pairs

    cfg = TuneConfig(tokens=args.tokens, prompt_tokens=args.prompt_tokens, n=args.n, batch_size=args.batch_size)
    docs = {
        "tune": split_documents(load_documents(TUNE_CORPUS), "heldout"),
        "test": split_documents(load_documents(TEST_CORPUS), "heldout"),
    }
    hashes = {split: {d.sha256 for d in ds} for split, ds in docs.items()}
    key_docs = {d.sha256 for d in split_documents(load_documents(args.corpus), "key")}
    for key in (tune_key, test_key):  # a key that records its corpus: those documents too
        key_docs |= {d["sha256"] for d in key.meta.get("corpus", {}).get("documents", [])}
    shared = hashes["tune"] & hashes["test"]
    assert not shared, f"{len(shared)} documents are in both the tune and the test split"
    for split, h in hashes.items():
        assert not h & key_docs, f"{len(h & key_docs)} documents of the {split} split built a key"
    return {
        split: {
            "corpus": f"{TUNE_CORPUS if split == 'tune' else TEST_CORPUS} (held-out half)",
            "documents": len(ds),
            "pairs": heldout_pairs(tokenizer, ds, cfg),
        }
        for split, ds in docs.items()
    }


def own_nll(model, tokenizer, pairs, batch_size: int) -> list[float]:
    """Per pair: the mean NLL of its human continuation given BOS and its prompt (``tune.own_perplexity``'s
    windows; exp of their mean is its own perplexity). Kept per window for a paired interval."""
    from openstamp.model.perplexity import window_nll
    from openstamp.model.text import bos_prefix

    bos = bos_prefix(tokenizer)
    return window_nll(model, [(bos + p, h) for p, h in pairs], batch_size=batch_size)


def baseline(path: Path, model, tokenizer, pairs, args) -> dict:
    """The unwatermarked model's own NLL on a split's pairs (cached)."""
    from openstamp.model.perplexity import perplexity

    if not path.exists():
        began = time.perf_counter()
        nll = own_nll(model, tokenizer, pairs, args.batch_size)
        atomic_write_json(path, {"own_ppl": perplexity(nll), "nll": nll, "seconds": time.perf_counter() - began})
        print(f"[{path.parent.name}] unwatermarked own perplexity {perplexity(nll):.3f}", flush=True)
    return read_json(path, "baseline")


def measure(path: Path, model, tokenizer, key, delta: float, pairs, args, seed: int) -> dict:
    """Watermark at ``delta``, sample once, pool every N's sources, measure own NLL; revert. Cached at ``path``."""
    from openstamp.config import DetectConfig
    from openstamp.detect.detector import Detector
    from openstamp.detect.pool import source_pvalues
    from openstamp.model.generate import sample_completions
    from openstamp.model.patch import apply_watermark, revert_watermark
    from openstamp.model.perplexity import perplexity

    if path.exists():
        kept = read_json(path, "cached delta")
        if kept["key_id"] != key.key_id or kept["seed"] != seed:
            raise SystemExit(f"{path} was measured with another key or seed; choose another --out")
        return kept
    variant = dataclasses.replace(key, delta=delta, meta=copy.deepcopy(key.meta))  # records its own fingerprints
    seconds = {}
    apply_watermark(model, variant, "retie")
    try:
        began = time.perf_counter()
        ids = sample_completions(
            model, tokenizer, [p for p, _ in pairs], args.tokens, seed=seed, batch_size=args.batch_size, progress=False
        )
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        seconds["generate"] = time.perf_counter() - began
        detector = Detector(model, tokenizer, variant, DetectConfig(alpha=DETECT_ALPHA))
        began = time.perf_counter()
        by_n = {str(n): source_pvalues(detector, texts, n, args.sources, seed) for n in args.texts}
        seconds["detect"] = time.perf_counter() - began
        began = time.perf_counter()
        nll = own_nll(model, tokenizer, pairs, args.batch_size)
        seconds["own_ppl"] = time.perf_counter() - began
    finally:
        how = revert_watermark(model, variant)
    assert how == "exact", f"the model was reverted by {how}, not exactly"
    row = {
        "delta": delta,
        "key_id": key.key_id,
        "seed": seed,
        "p_values": by_n,
        "own_ppl": perplexity(nll),
        "nll": nll,
        "distinct_token_fraction": statistics.fmean(len(set(x)) / len(x) for x in ids),
        "seconds": seconds,
    }
    atomic_write_json(path, row)
    return row


def pooled(p_values: list, n: int, args) -> dict:
    """Sources detected at pooled p <= args.p among the sources of N texts, with the median pooled p."""
    from openstamp.detect.rates import clopper_pearson

    ps = [1.0 if p is None else p for p in p_values]  # no p-value (too short): not detected
    hits = sum(p <= args.p for p in ps)
    return {
        "texts": n,
        "sources": len(ps),
        "detected": hits,
        "tpr": hits / len(ps),
        "tpr_ci": clopper_pearson(hits, len(ps)),
        "median_p": statistics.median(ps),
        "expected_overlap": n / args.n,  # mean share of one source's texts that another source also holds
    }


def row(measured: dict, base: dict, args) -> dict:
    """A cached delta as the result reports it: per N, own perplexity and its change over the unwatermarked model."""
    from openstamp.model.perplexity import change

    cost = change(measured["nll"], base["nll"], seed=args.seed)
    return {
        "delta": measured["delta"],
        "own_ppl": measured["own_ppl"],
        "own_ppl_original": base["own_ppl"],
        "own_ppl_change": cost["change"],
        "own_ppl_change_ci": list(cost["ci"]),
        "distinct_token_fraction": measured["distinct_token_fraction"],
        "by_texts": {str(n): pooled(measured["p_values"][str(n)], n, args) for n in args.texts},
        "seconds": measured["seconds"],
    }


def choose(grid: list[dict], n: int, target: float) -> dict:
    """The smallest grid delta whose fraction of sources of N texts detected is >= target; else the best point."""
    tpr = [r["by_texts"][str(n)]["tpr"] for r in grid]
    first = next((i for i, t in enumerate(tpr) if t >= target), None)
    if first is None:  # as tune_delta: the highest TPR, then the smaller delta
        best = max(range(len(grid)), key=lambda i: (tpr[i], -grid[i]["delta"]))
        return {"texts": n, "reached": False, "delta": grid[best]["delta"], "tpr": tpr[best]}
    out = {"texts": n, "reached": True, "delta": grid[first]["delta"], "tpr": tpr[first]}
    if first > 0:  # between the last miss and the first hit, linear in log(delta): not measured
        a, b = grid[first - 1]["delta"], grid[first]["delta"]
        frac = (target - tpr[first - 1]) / (tpr[first] - tpr[first - 1])
        out["interpolated_delta"] = math.exp(math.log(a) + frac * (math.log(b) - math.log(a)))
        out["interpolated_note"] = (
            f"log-linear interpolation between the grid's last miss {a:g} and first hit {b:g}; not measured"
        )
    else:
        out["interpolated_note"] = "the grid's smallest delta already reaches the target: lower the grid"
    return out


def main() -> None:
    args = parse()
    settings = claim_run(args.out, vars(args), free=("deltas", "name", "quick"))

    import torch

    from openstamp import load_model
    from openstamp.model.load import resolve_device

    began = time.perf_counter()
    torch.manual_seed(args.seed)
    device = str(resolve_device(args.device))
    model, tokenizer = load_model(args.model, dtype=GEN_DTYPE, device=device)
    found = keys(args, model, tokenizer)
    (tune_key, tune_dir), (test_key, test_dir) = found["tune"], found["test"]
    data = splits(args, tokenizer, tune_key, test_key)
    setup_s = time.perf_counter() - began

    # stage 1: the tune split, every delta of the grid, one generation shared by every N
    began = time.perf_counter()
    pairs = data["tune"]["pairs"]
    base = baseline(args.out / "tune" / "original.json", model, tokenizer, pairs, args)
    grid = []
    for delta in args.deltas:
        m = measure(
            args.out / "tune" / f"delta_{delta:g}.json", model, tokenizer, tune_key, delta, pairs, args, args.seed
        )
        grid.append(row(m, base, args))
        cells = "  ".join(f"N={n} {r['tpr']:.2f}" for n, r in grid[-1]["by_texts"].items())
        print(f"[tune] delta {delta:g}: own PPL {grid[-1]['own_ppl_change']:+.2%}  detected {cells}", flush=True)
    chosen = {str(n): choose(grid, n, args.target_tpr) for n in args.texts}
    tune_s = time.perf_counter() - began

    # stage 2: the test split, a fresh key and fresh prompts, at each N's chosen delta
    began = time.perf_counter()
    pairs = data["test"]["pairs"]
    base = baseline(args.out / "test" / "original.json", model, tokenizer, pairs, args)
    at = {}
    for delta in sorted({c["delta"] for c in chosen.values()}):
        path = args.out / "test" / f"delta_{delta:g}.json"
        at[delta] = row(measure(path, model, tokenizer, test_key, delta, pairs, args, args.test_seed), base, args)
    test = []
    for n, c in chosen.items():
        r = at[c["delta"]]
        test.append(
            {
                "texts": int(n),
                "delta": c["delta"],
                "reached_on_tune": c["reached"],
                **{k: r[k] for k in ("own_ppl", "own_ppl_original", "own_ppl_change", "own_ppl_change_ci")},
                **{k: v for k, v in r["by_texts"][n].items() if k != "texts"},
            }
        )
    test_s = time.perf_counter() - began

    goal_row = next((t for t in test if t["texts"] == GOAL["texts"]), None)
    goal = {
        **GOAL,
        "met": None if goal_row is None else goal_row["own_ppl_change"] <= GOAL["max_own_ppl_change"],
        "note": "test split: own PPL change at the delta the tune split chose for N = 20 texts",
    }
    write_result(
        args.name,
        {
            "question": "what the delta chosen for pooled detection of sources of N texts costs in own perplexity",
            "method": __doc__.strip().splitlines()[0],
            "settings": {
                **settings,
                "out": str(args.out),
                "gen_dtype": GEN_DTYPE,
                "device": device,
                "tied_head": "retie",
                "detect_config": {"alpha": DETECT_ALPHA, "note": "DetectConfig defaults otherwise; decision only"},
                "sampling": {"temperature": 1.0, "top_p": 1.0, "tune_seed": args.seed, "test_seed": args.test_seed},
                "source_draws": "source_pvalues: each source N of the split's n completions, without replacement "
                "(seeded by the split's seed); sources overlap by N/n on average and are not independent",
            },
            "keys": {
                role: {"dir": str(d), "key_id": k.key_id, "default_delta": k.delta, "n_lists": k.n_lists}
                for role, (k, d) in (("tune", (tune_key, tune_dir)), ("test", (test_key, test_dir)))
            },
            "splits": {
                s: {"corpus": v["corpus"], "documents": v["documents"], "pairs": len(v["pairs"])}
                for s, v in data.items()
            },
            "goal": goal,
            "tune": {"own_ppl_original": grid[0]["own_ppl_original"], "grid": grid, "chosen": chosen},
            "test": test,
            "seconds": {"setup": setup_s, "tune": tune_s, "test": test_s},
            "seconds_note": "wall seconds of this run per stage; cached deltas cost ~0 here (each row keeps its own)",
        },
    )
    print_summary(test, chosen, goal, args)
    print(f"wall seconds: setup {setup_s:.0f}, tune {tune_s:.0f}, test {test_s:.0f}")


def print_summary(test: list[dict], chosen: dict, goal: dict, args) -> None:
    print(
        f"\nsources of N texts of {args.tokens} tokens detected at pooled p <= {args.p:g} (target {args.target_tpr:g})"
    )
    print(
        f"{'N':>4} {'delta':>7} {'tune TPR':>9}  {'test detected [95% CI]':>23} "
        f"{'own PPL [95% CI]':>27} {'median p':>9}"
    )
    for t in test:
        c = chosen[str(t["texts"])]
        low, high = t["tpr_ci"]
        cost = f"{t['own_ppl_change']:+.2%} [{t['own_ppl_change_ci'][0]:+.1%}, {t['own_ppl_change_ci'][1]:+.1%}]"
        print(
            f"{t['texts']:>4} {t['delta']:>7.3g} {c['tpr']:>9.3f}{' ' if c['reached'] else '*'} "
            f"{t['tpr']:>10.3f} [{low:.2f}, {high:.2f}] {cost:>27} {t['median_p']:>9.2g}"
        )
    if any(not c["reached"] for c in chosen.values()):
        print("* not reached on the tune grid: the grid point with the highest TPR")
    if goal["met"] is not None:
        verdict = "met" if goal["met"] else "NOT met"
        print(f"goal (N = {goal['texts']}: own PPL change <= {goal['max_own_ppl_change']:+.0%}): {verdict}")


if __name__ == "__main__":
    main()
