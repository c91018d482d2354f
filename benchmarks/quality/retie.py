"""Re-tied against untied releases of a tied model: perplexity, detection, size, audit.

    python benchmarks/quality/retie.py [--model smollm2-135m --profile default]

Builds ONE key on the model (corpus wikipedia, its key half), then writes two releases into
runs/retie/ (git-ignored): ``untie`` (lm_head = U~, input embeddings = U: the old, leaky
export) and ``retie`` (one shared tensor U~: the default). For the original model and each
release (loaded back with plain transformers) it measures:

* the model's own perplexity on held-out human text: 80 windows of 256 tokens from the
  held-out halves of the packaged news and Wikipedia corpora (no key was built on them);
* 32 completions of 200 new tokens from held-out 50-token prompts, scored as text without
  their prompts, against the 32 human continuations: the fraction flagged at p <= 0.01;
* the checkpoint's size, and what ``openstamp audit --base`` finds.

Writes benchmarks/results/retie.json.
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import write_result  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from openstamp import (  # noqa: E402
    DetectConfig,
    Detector,
    WatermarkKey,
    build_key,
    load_documents,
    load_model,
    load_profile,
    split_documents,
)
from openstamp.corpus import fingerprint  # noqa: E402
from openstamp.detect.rates import clopper_pearson  # noqa: E402
from openstamp.model.generate import sample_completions  # noqa: E402
from openstamp.model.load import resolve_model_path  # noqa: E402
from openstamp.model.patch import apply_watermark, tied_head_mode  # noqa: E402
from openstamp.model.text import bos_prefix, encode, prompt_windows  # noqa: E402
from openstamp.release.audit import audit  # noqa: E402

RUNS = Path("runs/retie")
HELDOUT = ("news", "wikipedia")


def heldout_texts(exclude: set[str]) -> list[str]:
    """Held-out documents of the packaged corpora, interleaved, minus any that built the key."""
    groups = [
        [d.text for d in split_documents(load_documents(spec), "heldout") if d.sha256 not in exclude]
        for spec in HELDOUT
    ]
    return [t for pair in zip(*groups, strict=False) for t in pair]


def windows(tokenizer, texts: list[str], n: int, length: int) -> list[list[int]]:
    out = []
    for ids in encode(tokenizer, texts):
        out += [ids[i : i + length] for i in range(0, len(ids) - length + 1, length)]
        if len(out) >= n:
            return out[:n]
    raise SystemExit(f"only {len(out)} held-out windows of {length} tokens")


@torch.inference_mode()
def perplexity(model, tokenizer, windows: list[list[int]], batch: int = 4) -> dict:
    """Token-level perplexity exp(total NLL / tokens) of equal-length windows, each after BOS."""
    bos = bos_prefix(tokenizer)
    nll, count, per_window = 0.0, 0, []
    for b in range(0, len(windows), batch):
        ids = torch.tensor([bos + w for w in windows[b : b + batch]])
        logits = model(input_ids=ids).logits[:, len(bos) - 1 if bos else 0 : -1].float()
        targets = ids[:, len(bos) if bos else 1 :]
        losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), targets, reduction="none").double()
        nll, count = nll + float(losses.sum()), count + losses.numel()
        per_window += torch.exp(losses.mean(-1)).tolist()
    return {"ppl": math.exp(nll / count), "mean_window_ppl": sum(per_window) / len(per_window), "tokens": count}


def release(base_spec: str, key, mode: str) -> tuple[Path, Path]:
    """Watermark a fresh copy of the base in ``mode`` and save model and key under runs/retie/MODE."""
    model, tokenizer = load_model(base_spec)
    key = copy.copy(key)
    key.meta = copy.deepcopy(key.meta)  # each release records its own mode
    apply_watermark(model, key, mode, source=base_spec)
    model.save_pretrained(RUNS / mode / "model")
    tokenizer.save_pretrained(RUNS / mode / "model")
    key.save(RUNS / mode / "key", overwrite=True)
    return RUNS / mode / "model", RUNS / mode / "key"


def size_mb(directory: Path) -> float:
    return sum(f.stat().st_size for f in Path(directory).glob("*.safetensors")) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--corpus", default="wikipedia")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--ppl-windows", type=int, default=80)
    parser.add_argument("--ppl-tokens", type=int, default=256)
    parser.add_argument("--n", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=50)
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reuse", action="store_true", help="measure the releases already in runs/retie again")
    parser.add_argument(
        "--fpr-texts",
        type=Path,
        default=Path("runs/fpr/texts"),
        help="unwatermarked texts of benchmarks/fpr/fpr_per_key.py: the re-tied key's false-positive rate on them",
    )
    parser.add_argument("--fpr-n", type=int, default=500, help="texts per source for that check")
    args = parser.parse_args()
    base, tokenizer = load_model(args.model)
    documents = split_documents(load_documents(args.corpus), "key")
    reuse = args.reuse and all((RUNS / m / "key" / "key.json").exists() for m in ("untie", "retie"))
    start = time.perf_counter()
    if reuse:
        key = WatermarkKey.load(RUNS / "retie" / "key")
    else:
        key = build_key(base, tokenizer, documents, load_profile(args.profile), secret=b"openstamp/retie" * 2)
        key.meta["corpus"] = {"spec": args.corpus, "part": "key", **fingerprint(documents)}
    key_s = sum(key.meta["stats"]["timings_s"].values()) if reuse else time.perf_counter() - start
    exclude = {d["sha256"] for d in key.meta["corpus"].get("documents", [])}
    texts = heldout_texts(exclude)
    ppl_windows = windows(tokenizer, texts, args.ppl_windows, args.ppl_tokens)
    # prompts come from the documents after those that gave the perplexity windows
    prompts = prompt_windows(tokenizer, texts[len(texts) // 2 :], args.prompt_tokens, args.new_tokens, args.n)
    human = tokenizer.batch_decode([c for _, c in prompts], skip_special_tokens=True)
    base_dir = resolve_model_path(args.model)
    results = {"original": {"perplexity": perplexity(base, tokenizer, ppl_windows), "size_mb": size_mb(base_dir)}}
    print(f"original: perplexity {results['original']['perplexity']['ppl']:.1f}", flush=True)
    del base
    for mode in ("untie", "retie"):
        model_dir, key_dir = (RUNS / mode / "model", RUNS / mode / "key") if reuse else release(args.model, key, mode)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()  # plain transformers
        mode_key = WatermarkKey.load(key_dir)
        ppl = perplexity(model, tokenizer, ppl_windows)
        generated = sample_completions(
            model, tokenizer, [p for p, _ in prompts], args.new_tokens, seed=args.seed, progress=False
        )
        detector = Detector(model, tokenizer, mode_key, DetectConfig(alpha=0.01))
        completions = detector.detect(tokenizer.batch_decode(generated, skip_special_tokens=True))
        negatives = detector.detect(human)
        findings = audit(model_dir, key_dir, base=base_dir)
        results[mode] = {
            "tied_head": tied_head_mode(mode_key),
            "perplexity": ppl,
            "flagged_completions": sum(bool(r.decision) for r in completions) / len(completions),
            "flagged_human": sum(bool(r.decision) for r in negatives) / len(negatives),
            "mean_llr_completions": sum(r.score for r in completions) / len(completions),
            "mean_llr_human": sum(r.score for r in negatives) / len(negatives),
            "size_mb": size_mb(model_dir),
            "tensors": len({n for f in model_dir.glob("*.safetensors") for n in _names(f)}),
            "audit_high": [f.message for f in findings if f.severity == "high"],
            "path": str(model_dir),
        }
        if mode == "retie" and args.fpr_texts.exists():
            r = results[mode]
            r["unwatermarked"] = unwatermarked_fpr(detector, args.fpr_texts, args.fpr_n)
        r = results[mode]
        print(
            f"{mode}: perplexity {ppl['ppl']:.1f}; flagged at p <= 0.01: completions {r['flagged_completions']:.0%}, "
            f"human {r['flagged_human']:.0%}; {r['size_mb']:.0f} MB; audit high: {len(r['audit_high'])}",
            flush=True,
        )
        del model
    write_result(
        "retie",
        {
            "model": args.model,
            "profile": args.profile,
            "key_corpus": f"{args.corpus} (key half)",
            "key_id": key.key_id,
            "gamma": key.gamma,
            "delta": key.delta,
            "n_lists": key.n_lists,
            "key_seconds": key_s,
            "heldout_text": f"held-out halves of {', '.join(HELDOUT)} (interleaved documents)",
            "ppl_windows": args.ppl_windows,
            "ppl_tokens": args.ppl_tokens,
            "n": args.n,
            "prompt_tokens": args.prompt_tokens,
            "new_tokens": args.new_tokens,
            "sampling": {"temperature": 1.0, "top_p": 1.0, "seed": args.seed},
            "alpha": 0.01,
            "results": results,
        },
    )
    o, u, t = (results[k]["perplexity"]["ppl"] for k in ("original", "untie", "retie"))
    print(
        f"\nperplexity on {args.ppl_windows} x {args.ppl_tokens} held-out tokens: original {o:.1f}, "
        f"untie {u:.1f}, retie {t:.1f}"
    )
    for mode in ("untie", "retie"):
        r = results[mode]
        print(
            f"{mode}: {args.n} completions flagged {r['flagged_completions']:.0%}, "
            f"{args.n} human texts flagged {r['flagged_human']:.0%} (p <= 0.01)"
        )


def unwatermarked_fpr(detector, texts: Path, n: int) -> dict:
    """Flagged fractions at p <= 0.01 and 0.001 on the public base model's samples and human text."""
    from openstamp.storage import read_json

    out = {}
    for source in ("base_pure", "human"):
        files = [texts / "human.json"] if source == "human" else sorted((texts / source).glob("b*.json"))
        sample = [t for f in files for t in read_json(f, "texts")][:n]
        p = [r.p_value for r in detector.detect(sample) if r.p_value is not None]
        out[source] = {
            "n": len(p),
            **{
                f"fpr_at_{a:g}": {
                    "rate": sum(x <= a for x in p) / len(p),
                    "ci95": clopper_pearson(sum(x <= a for x in p), len(p)),
                }
                for a in (0.01, 0.001)
            },
        }
        print(
            f"retie key on {source}: flagged at 0.01 {out[source]['fpr_at_0.01']['rate']:.3f} (n {len(p)})", flush=True
        )
    return out


def _names(file: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(str(file), "pt") as fh:
        return list(fh.keys())


if __name__ == "__main__":
    main()
