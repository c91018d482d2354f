"""Family-wise false-positive rate of detection against several keys, on human text.

    python benchmarks/fpr/multikey_fpr.py [--n 1000 --keys 5 --length 200 --alpha 0.01 --out runs/multikey]
    python benchmarks/fpr/multikey_fpr.py --key-dirs runs/a/key,runs/b/key,...   # existing keys of --model
    python benchmarks/fpr/multikey_fpr.py --smoke                                # plumbing only, seconds

An owner who serves several keys (``openstamp detect --key K1 --key K2 ...``) tests every text
against all of them; the result's p-value is Holm-adjusted over the keys, so a human text should
be flagged under ANY key with probability at most alpha. This script:

1. ``keys``: builds ``--keys`` keys on ``--model`` from the ``wikipedia`` corpus's key part, each
   with its own secret (or loads ``--key-dirs``); every key's key-building documents are excluded below.
2. ``texts``: ``--n`` windows of ``--length`` tokens of human text from the held-out parts of the
   packaged wikipedia and news corpora (interleaved), decoded to text.
3. ``score``: scores every window against every key with one ``MultiKeyDetector`` on the original
   model (one backbone pass per batch where the keys share it; a re-tied key needs its own copy).

Reports, at ``--alpha``: the family-wise FPR after Holm (any key flags), the same without the
correction, and each key's own FPR, each with its 95% Clopper-Pearson interval. Writes
benchmarks/results/multikey_fpr.json (atomically; ``--smoke`` writes under ``--out`` instead).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py, smoke_model.py

from common import RESULTS  # noqa: E402

from openstamp.storage import atomic_write_json, read_json  # noqa: E402


def build_keys(args) -> list[Path]:
    """``--keys`` key directories under ``--out``/keys (built once; resumable), or ``--key-dirs``."""
    from openstamp.config import load_profile
    from openstamp.embed.pipeline import embed

    if args.key_dirs:
        return [Path(k) for k in args.key_dirs.split(",") if k.strip()]
    cfg = load_profile(args.profile)
    if args.smoke:
        from smoke_model import SMOKE_OVERRIDES

        cfg = cfg.with_overrides(SMOKE_OVERRIDES)
    dirs = []
    for i in range(args.keys):
        key_dir = args.out / "keys" / f"k{i}"
        if not (key_dir / "key.json").exists():
            secret = hashlib.sha256(f"openstamp/multikey-fpr/{args.seed}/{i}".encode()).digest()
            print(f"building key {i + 1}/{args.keys} in {key_dir}", flush=True)
            embed(args.model, "wikipedia", None, key_dir, cfg, secret=secret, device=args.device, progress=False)
        dirs.append(key_dir)
    return dirs


def human_texts(args, tokenizer, keys) -> list[str]:
    """``--n`` held-out human windows that built none of the keys (cached under ``--out``)."""
    from openstamp.detect.calibrate import reference_texts

    path = args.out / f"texts_n{args.n}_L{args.length}.json"
    if path.exists():
        return read_json(path, "texts")
    exclude = {d["sha256"] for k in keys for d in k.meta.get("corpus", {}).get("documents", [])}
    texts = reference_texts(tokenizer, ["wikipedia", "news"], args.n, args.length, exclude)
    atomic_write_json(path, texts)
    return texts


def rates(hits: list[bool]) -> dict:
    from openstamp.detect.rates import clopper_pearson

    n, k = len(hits), int(sum(hits))
    low, high = clopper_pearson(k, n)
    return {"rate": k / n if n else None, "hits": k, "n": n, "ci95": [low, high]}


def summarise(each, key_ids: list[str], alpha: float) -> dict:
    """Per-text per-key results -> family-wise FPR (Holm, uncorrected) and per-key FPR with intervals."""
    import numpy as np

    from openstamp.detect.multikey import holm

    ok = [r for r in each if r[0].status == "ok"]
    p = np.array([[x.p_value for x in r] for r in ok], dtype=np.float64)  # (texts, keys)
    return {
        "texts_scored": len(ok),
        "texts_too_short": len(each) - len(ok),
        "family_wise_fpr_holm": rates(list(holm(p).min(-1) <= alpha)),
        "family_wise_fpr_uncorrected": rates(list(p.min(-1) <= alpha)),
        "per_key_fpr": {k: rates(list(p[:, j] <= alpha)) for j, k in enumerate(key_ids)},
        "best_key_counts": {k: int((p.argmin(-1) == j).sum()) for j, k in enumerate(key_ids)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="the original (base) model every key was built on")
    parser.add_argument("--n", type=int, default=1000, help="human windows")
    parser.add_argument("--keys", type=int, default=5, help="keys to build (ignored with --key-dirs)")
    parser.add_argument("--key-dirs", default=None, help="comma-separated existing key directories of --model")
    parser.add_argument("--length", type=int, default=200, help="tokens per window")
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--profile", default="default", help="embedding profile of the built keys")
    parser.add_argument("--batch", type=int, default=32, help="texts per forward pass")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--seed", type=int, default=0, help="derives the keys' secrets")
    parser.add_argument("--out", type=Path, default=Path("runs/multikey"), help="keys and texts (resumable)")
    parser.add_argument("--result", type=Path, default=None, help="JSON (default benchmarks/results/multikey_fpr.json)")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 3 keys, 24 texts: plumbing only")
    args = parser.parse_args()
    if args.smoke:
        from smoke_model import tiny_model

        args.out = args.out if args.out != Path("runs/multikey") else Path("runs/multikey_smoke")
        args.model = str(tiny_model(args.out / "model"))
        args.n, args.keys, args.length, args.profile, args.device = 24, min(args.keys, 3), 48, "small", "cpu"
    result_path = args.result or (args.out / "multikey_fpr_smoke.json" if args.smoke else RESULTS / "multikey_fpr.json")
    run(args, result_path)


def run(args, result_path: Path) -> None:
    from openstamp.config import DetectConfig
    from openstamp.detect.multikey import MultiKeyDetector
    from openstamp.runtime import versions

    args.out.mkdir(parents=True, exist_ok=True)
    key_dirs = build_keys(args)
    config = DetectConfig(alpha=args.alpha, batch_size=args.batch, min_tokens=min(16, args.length // 2))
    # Holm's smallest step decides at alpha / m: where the permutation floor is already below it, no decision
    # needs the tail bound's finer p-values
    floor = 1 / (config.n_permutations + 1)
    config = dataclasses.replace(config, tail_bound=config.tail_bound and floor > args.alpha / len(key_dirs))
    detector = MultiKeyDetector.from_pretrained(
        args.model, [str(k) for k in key_dirs], config, dtype=args.dtype, device=args.device
    )
    texts = human_texts(args, detector.tokenizer, [d.key for d in detector.detectors])
    began = time.perf_counter()
    each = detector.detect_each(texts, progress=True)
    seconds = time.perf_counter() - began
    data = {
        "benchmark": "multikey_fpr",
        "question": "family-wise FPR on human text when every text is tested against several keys (Holm)",
        "smoke": args.smoke,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model": args.model,
        "key_ids": detector.key_ids,
        "alpha": args.alpha,
        "corpora": ["wikipedia", "news"],
        "part": "heldout",
        **summarise(each, detector.key_ids, args.alpha),
        "score_seconds": round(seconds, 2),
        "command": " ".join(["python", *sys.argv]),
        "versions": versions(),
    }
    atomic_write_json(result_path, data)
    print(json.dumps({k: data[k] for k in ("family_wise_fpr_holm", "family_wise_fpr_uncorrected")}, indent=1))
    print(f"wrote {result_path}")


if __name__ == "__main__":
    main()
