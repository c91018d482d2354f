"""False-positive rate per key on the path the product uses: re-tied releases, scored as ``openstamp detect`` scores.

    python benchmarks/fpr/product_path_fpr.py [--keys 10 --n 1000 --out runs/fpr_product] [--name NAME]

``fpr_per_key.py`` scores every text through the original backbone, where the permutation p-value is exact by
construction. A re-tied release's backbone reads U~ as its input embeddings, so its hidden states are not independent
of the secret. Here each of ``--keys`` owners has a key of the default profile (the same states and S, a secret of
its own: its G, centring and permutations) and its own re-tied release, and every text is scored twice with
``Detector`` and ``DetectConfig()``'s defaults (as ``openstamp detect`` does):

* ``release``: the release alone (``openstamp detect --model RELEASE``): its own backbone;
* ``original``: the release with the base beside it (``--base BASE``): the base's backbone, the exact path.

``--paths release`` scores the first only (half the time, on a model where the two were shown to agree).

Texts are ``fpr_per_key.py``'s (its ``texts`` stage, in ``--out/texts``): human continuations of held-out news and
Wikipedia prompts, the base model's samples (pure and at T 0.7 / top-p 0.9), and with ``--sources`` Gemma-3-270M's
pure samples (``gemma3_pure``), human code (``human_code``), news alone (``human_news``) and Wikipedia alone
(``human_wikipedia``). Per source, path and alpha it reports the per-key FPR, each key's Clopper-Pearson interval,
the pooled rate and the chi-square spread test (``fpr_scoring.fpr_summary``). Every (key, path, source) is cached
under ``--out``; re-running resumes. Writes benchmarks/results/<name>.json atomically.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py
sys.path.insert(0, str(Path(__file__).resolve().parent))  # fpr/: fpr_per_key.py, fpr_scoring.py

import numpy as np  # noqa: E402
from common import claim_run, saved_key  # noqa: E402
from fpr_per_key import SOURCES, load_source, stage_texts  # noqa: E402
from fpr_scoring import ALPHAS, fpr_summary  # noqa: E402

from openstamp.storage import atomic_write_json, read_json  # noqa: E402

PATHS = ("release", "original")


def owner_secret(j: int, seed: int) -> bytes:
    return hashlib.sha256(f"openstamp/fpr-product/{seed}/{j}".encode()).digest()


def build_keys(out: Path, args, model, tokenizer) -> list:
    """``--keys`` keys of the profile, from one set of states (S does not depend on the secret), each saved once."""
    keys, states = [], None
    for j in range(args.keys):
        key, states = saved_key(
            out / "keys" / f"k{j:02d}", model, tokenizer, model_spec=args.model, secret=owner_secret(j, args.seed),
            profile=args.profile, corpus=args.corpus, states=states,
        )  # fmt: skip
        keys.append(key)
    return keys


def score(out: Path, args, sources: dict[str, list[str]]) -> dict:
    """Each key's p-values of every source's texts on each path of ``--paths`` (cached per key, path and source)."""
    import copy

    from openstamp.config import DetectConfig
    from openstamp.detect import Detector
    from openstamp.model.load import load_model
    from openstamp.model.patch import apply_watermark

    base, tokenizer = load_model(args.model)
    keys = build_keys(out, args, base, tokenizer)
    found: dict = {path: {name: [] for name in sources} for path in args.paths}
    timings: dict = {}
    for j, key in enumerate(keys):
        release = None
        for path in args.paths:
            for name, texts in sources.items():
                cache = out / "scores" / f"k{j:02d}_{path}_{name}.json"
                if not cache.exists():
                    if release is None:
                        release = copy.deepcopy(base)
                        apply_watermark(release, key, "retie", source=args.model)  # the release as embed writes it
                    detector = Detector(
                        release, tokenizer, key, DetectConfig(), base=base if path == "original" else None
                    )
                    began = time.perf_counter()
                    results = detector.detect(texts)
                    seconds = time.perf_counter() - began
                    rows = {"p": [r.p_value for r in results], "n_tokens": [r.n_tokens for r in results]}
                    atomic_write_json(cache, {**rows, "backbone": detector.backbone, "seconds": seconds})
                    print(f"[score] k{j:02d} {path:8s} {name}: {len(texts)} texts in {seconds:.0f} s", flush=True)
                kept = read_json(cache, "scores")
                found[path][name].append([1.0 if p is None else p for p in kept["p"]])
                timings.setdefault(path, 0.0)
                timings[path] += kept["seconds"]
    return {"p_values": found, "seconds": timings, "key_ids": [k.key_id for k in keys], "delta": keys[0].delta}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/fpr_product"))
    parser.add_argument("--model", default="smollm2-135m", help="the base model: alias, directory or hub id")
    parser.add_argument("--corpus", default="wikipedia", help="the key documents")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--keys", type=int, default=10, help="owners: keys with their own re-tied release")
    parser.add_argument("--n", type=int, default=1000, help="texts per source")
    parser.add_argument("--prompt-tokens", type=int, default=50)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--gen-dtype", default="bfloat16", help="dtype the public models generate in")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sources", default="human,base_pure,base_t0.7_p0.9")
    parser.add_argument("--paths", default=",".join(PATHS), help="release (openstamp detect's default), original")
    parser.add_argument("--name", default="fpr_product_path", help="writes benchmarks/results/<name>.json")
    args = parser.parse_args()
    args.sources = [s for s in args.sources.split(",") if s]
    args.paths = [p for p in args.paths.split(",") if p]
    if unknown := set(args.paths) - set(PATHS):
        raise SystemExit(f"unknown paths {sorted(unknown)}; choose from {list(PATHS)}")
    if unknown := set(args.sources) - set(SOURCES):
        raise SystemExit(f"unknown sources {sorted(unknown)}; choose from {list(SOURCES)}")
    settings = claim_run(args.out, vars(args), free=("sources", "paths", "name"))  # a re-run may add sources
    stage_texts(args.out, args)
    sources = {name: load_source(args.out, name)[: args.n] for name in args.sources}
    scored = score(args.out, args, sources)
    report = {
        path: {
            name: {f"{a:g}": fpr_summary(np.array(p).T, a) for a in ALPHAS}
            for name, p in scored["p_values"][path].items()
        }
        for path in args.paths
    }
    for path, by_source in report.items():
        for name, by_alpha in by_source.items():
            for a, r in by_alpha.items():
                print(
                    f"{path:8s} {name:16s} alpha {a:6s} pooled {r['pooled_fpr']:.4f} median {r['median_fpr']:.4f} "
                    f"max {r['max_fpr']:.4f} significantly above 2a {r['keys_above_band_significantly']}/{r['n_keys']}",
                    flush=True,
                )
    from common import write_result

    write_result(
        args.name,
        {
            "settings": {**settings, "profile": args.profile},
            "question": "per-key FPR of re-tied releases scored as openstamp detect scores, release vs base backbone",
            "key_ids": scored["key_ids"],
            "delta": scored["delta"],
            "paths": report,
            "score_seconds": scored["seconds"],
            "method": __doc__.strip().splitlines()[0],
        },
    )


if __name__ == "__main__":
    main()
