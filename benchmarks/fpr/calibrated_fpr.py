"""Per-key FPR of keys calibrated on their owner's domain, beside the permutation p-value, on the product path.

    python benchmarks/fpr/calibrated_fpr.py [--keys 10 --n 1500 --out runs/fpr_calibrated]

The permutation p-value's null is over random keys: over keys its FPR is alpha on any text, but one key on one
domain can sit above it (``key_spread.json``: a product-path key at 0.032 on human code at alpha 0.01). An owner who
needs the rate for their own key on their own domain calibrates that key on human text of the domain and flags with
the calibrated LLR threshold::

    openstamp calibrate --model RELEASE --base BASE --key KEY --corpus MY_DOMAIN --part all --length 64
    openstamp detect --model RELEASE --base BASE --key KEY --calibrated --fpr 0.01 texts.jsonl

Here ``product_path_fpr.py``'s owners (its secrets, ``--seed``; each key's re-tied release, read with the base
beside it: ``Detector(release, ..., base=base)``) meet two domains, each split by document into two halves:

* ``code``: windows of gensim's own Python source (``fpr_per_key.code_files``), even-numbered files
  in one half and odd-numbered files in the other;
* ``prose``: windows of held-out Wikipedia and news documents (none built the keys), alternate documents.

Each key is calibrated on one half (``empirical_thresholds``, as ``openstamp calibrate`` computes them: the split
conformal threshold, so each half must hold at least 1/alpha - 1 texts) and tested on the other, then the halves swap:
each key's FPR is cross-fitted over both halves, and never measured on the texts that set its threshold. Per domain,
rule and alpha it reports ``fpr_scoring.fpr_summary``: the per-key FPR, keys in [a/2, 2a], keys significantly above
2a, the spread test. Scores are cached per domain and half under ``--out``; re-running resumes. Writes
benchmarks/results/<name>.json atomically.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
sys.path.insert(0, str(Path(__file__).resolve().parent))  # fpr/: product_path_fpr.py, fpr_scoring.py

import numpy as np  # noqa: E402
from common import claim_run, write_result  # noqa: E402
from fpr_per_key import code_files, token_windows  # noqa: E402
from fpr_scoring import ALPHAS, fpr_summary  # noqa: E402
from product_path_fpr import build_keys  # noqa: E402

from openstamp.storage import atomic_write_json, read_json  # noqa: E402

DOMAINS = ("code", "prose")
RULES = ("p_value", "calibrated")


def domain_halves(tokenizer, domain: str, n: int, length: int, exclude: set[str]) -> tuple[list[str], list[str]]:
    """``n`` windows of ``length`` tokens from each half of a domain's documents (even- and odd-numbered)."""
    from openstamp import load_documents, split_documents

    if domain == "code":
        groups = [[f.read_text(encoding="utf-8") for f in code_files()]]
    else:
        groups = [
            [d.text for d in split_documents(load_documents(spec), "heldout") if d.sha256 not in exclude]
            for spec in ("news", "wikipedia")
        ]
    halves = []
    for half in (0, 1):
        per_group = []
        for docs in groups:
            per_group.append(token_windows(tokenizer, docs[half::2], length))
        mixed = [w for row in zip(*per_group, strict=False) for w in row]  # corpora interleaved window by window
        mixed += [w for windows in per_group for w in windows[min(map(len, per_group)) :]]
        if len(mixed) < n:
            raise SystemExit(f"{domain} half {half} gives {len(mixed)} windows of {length} tokens; lower --n")
        halves.append(tokenizer.batch_decode(mixed[:n], skip_special_tokens=True))
    return halves[0], halves[1]


def score(out: Path, args) -> dict:
    """Each key's (score, p) of every text of each domain's halves, cached per domain and half."""
    from openstamp.config import DetectConfig
    from openstamp.detect import Detector
    from openstamp.detect.multikey import MultiKeyDetector
    from openstamp.model.load import load_model
    from openstamp.model.patch import apply_watermark

    base, tokenizer = load_model(args.model)
    keys = build_keys(out, args, base, tokenizer)  # product_path_fpr's owners: same secrets, same folders
    detectors = []
    for key in keys:  # each owner's own release, read with the base beside it (the release's copy is not kept)
        release = copy.deepcopy(base)
        apply_watermark(release, key, "retie", source=args.model)  # the release as embed writes it
        detectors.append(Detector(release, tokenizer, key, DetectConfig(), base=base))
        del release
    multi = MultiKeyDetector(detectors)
    exclude = {d["sha256"] for d in keys[0].meta.get("corpus", {}).get("documents", [])}
    found: dict = {}
    for domain in args.domains:
        halves = None
        for half in (0, 1):
            cache = out / "scores" / f"{domain}_h{half}.json"
            if not cache.exists():
                halves = halves or domain_halves(tokenizer, domain, args.n, args.length, exclude)
                began = time.perf_counter()
                each = multi.detect_each(halves[half])
                rows = {
                    "score": [[r.score for r in row] for row in each],
                    "p": [[1.0 if r.p_value is None else r.p_value for r in row] for row in each],
                    "status": [row[0].status for row in each],
                    "seconds": time.perf_counter() - began,
                }
                atomic_write_json(cache, rows)
                print(f"[score] {domain} half {half}: {len(each)} texts x {len(keys)} keys in {rows['seconds']:.0f} s")
            found.setdefault(domain, []).append(read_json(cache, "scores"))
    return {"found": found, "key_ids": [k.key_id for k in keys], "delta": keys[0].delta}


def summarise(halves: list[dict]) -> dict:
    """Per rule and alpha, ``fpr_summary`` over both halves' texts, each tested with the other half's threshold."""
    from openstamp.detect.calibrate import empirical_thresholds

    ok = [np.array(h["status"]) == "ok" for h in halves]
    scores = [np.array(h["score"], dtype=np.float64)[m] for h, m in zip(halves, ok, strict=True)]
    p = np.concatenate([np.array(h["p"], dtype=np.float64)[m] for h, m in zip(halves, ok, strict=True)])
    out: dict = {"n_texts_per_half": [int(m.sum()) for m in ok]}
    for alpha in ALPHAS:
        flagged = []
        for test, fit in ((0, 1), (1, 0)):
            tau = np.array([empirical_thresholds(scores[fit][:, k], (alpha,))[f"{alpha:g}"] for k in range(p.shape[1])])
            flagged.append(scores[test] > tau)
        as_p = np.where(np.concatenate(flagged), 0.0, 1.0)  # fpr_summary counts p <= alpha
        out[f"{alpha:g}"] = {"p_value": fpr_summary(p, alpha), "calibrated": fpr_summary(as_p, alpha)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/fpr_calibrated"))
    parser.add_argument("--model", default="smollm2-135m", help="the base model: alias, directory or hub id")
    parser.add_argument("--corpus", default="wikipedia", help="the key documents")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--keys", type=int, default=10, help="owners: product_path_fpr's, by --seed")
    parser.add_argument("--seed", type=int, default=0, help="product_path_fpr's --seed: whose owners")
    parser.add_argument("--n", type=int, default=1500, help="texts per half of each domain")
    parser.add_argument("--length", type=int, default=64, help="tokens per window")
    parser.add_argument("--domains", default="code,prose")
    parser.add_argument("--name", default="fpr_calibrated", help="writes benchmarks/results/<name>.json")
    args = parser.parse_args()
    args.domains = [d for d in args.domains.split(",") if d]
    if unknown := set(args.domains) - set(DOMAINS):
        raise SystemExit(f"unknown domains {sorted(unknown)}; choose from {list(DOMAINS)}")
    from openstamp.detect.rates import texts_needed

    if args.n < texts_needed(min(ALPHAS)):  # each half calibrates the other's keys
        raise SystemExit(f"--n {args.n}: calibrating alpha {min(ALPHAS):g} needs {texts_needed(min(ALPHAS))} texts")
    settings = claim_run(args.out, vars(args), free=("domains", "name"))  # a re-run may add domains
    scored = score(args.out, args)
    report = {domain: summarise(halves) for domain, halves in scored["found"].items()}
    for domain, by_alpha in report.items():
        for a in (f"{x:g}" for x in ALPHAS):
            for rule in RULES:
                r = by_alpha[a][rule]
                print(
                    f"{domain:6s} alpha {a:6s} {rule:10s} pooled {r['pooled_fpr']:.4f} median {r['median_fpr']:.4f} "
                    f"max {r['max_fpr']:.4f} in band {r['keys_with_estimate_in_band']}/{r['n_keys']} "
                    f"significantly above 2a {r['keys_above_band_significantly']}",
                    flush=True,
                )
    write_result(
        args.name,
        {
            "settings": settings,
            "question": "per-key FPR on a domain: the permutation p-value, and keys calibrated on the domain",
            "key_ids": scored["key_ids"],
            "delta": scored["delta"],
            "domains": report,
            "seconds": {d: sum(h["seconds"] for h in halves) for d, halves in scored["found"].items()},
        },
    )


if __name__ == "__main__":
    main()
