"""Detection of chat text: assistant turns of the watermarked instruct model against base turns and human answers.

    python benchmarks/quality/chat_detect.py [--n 96 --new-tokens 160 --alpha 0.01 --out runs/chat_detect]
    python benchmarks/quality/chat_detect.py --smoke        # a tiny random model, 8 prompts: plumbing only

The packaged model (SmolLM2-135M-Instruct) is a chat model; its users send conversations. This
script builds a watermarked release whose key is built on the ``news`` corpus, so that every
packaged Wikipedia article is held out from key building, and for ``--n`` articles:

1. asks "Tell me about <title>." in the model's chat template;
2. samples an assistant turn from the watermarked release and from the base model (same seeds,
   ``--temperature``/``--top-p``, EOS suppressed, cut at ``--new-tokens``);
3. takes the article's opening (the same number of tokens) as the human answer;
4. scores each conversation with ``Detector.detect_messages`` (only the assistant turn is scored,
   with the template's system prompt and the question as context).

Reports TPR at ``--alpha`` on the watermarked turns and FPR on the base turns and on the human
answers, each with its 95% Clopper-Pearson interval (a too-short turn counts as not flagged).
Writes benchmarks/results/chat_detect.json atomically (``--smoke`` writes under ``--out``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py, smoke_model.py

from common import RESULTS  # noqa: E402

from openstamp.storage import atomic_write_json, read_json  # noqa: E402

SOURCES = ("watermarked", "base", "human")


def release(args) -> tuple[Path, Path]:
    """The watermarked release and its key under ``--out`` (built once from the news corpus)."""
    from openstamp.config import load_profile
    from openstamp.embed.pipeline import embed

    model_dir, key_dir = args.out / "model", args.out / "key"
    if not (key_dir / "key.json").exists():
        cfg = load_profile(args.profile)
        if args.smoke:
            from smoke_model import SMOKE_OVERRIDES

            cfg = cfg.with_overrides(SMOKE_OVERRIDES)
        embed(args.model, "news", model_dir, key_dir, cfg, device=args.device, overwrite=True, progress=False)
    return model_dir, key_dir


def questions(n: int, exclude: set[str]) -> list[tuple[str, str]]:
    """(question, article text) of ``n`` Wikipedia articles outside the key's documents."""
    from openstamp.corpus import load_documents

    docs = [d for d in load_documents("wikipedia") if d.sha256 not in exclude]
    if len(docs) < n:
        raise SystemExit(f"only {len(docs)} Wikipedia articles are held out from the key; lower --n")
    return [(f"Tell me about {d.id.split(':', 2)[-1]}.", d.text) for d in docs[:n]]


def turns(args, model_spec: str, tokenizer, asked: list[str]) -> list[str]:
    """One sampled assistant turn per question from ``model_spec`` (cached under ``--out``)."""
    from openstamp.model.generate import sample_completions
    from openstamp.model.load import load_model

    path = args.out / f"turns_{Path(model_spec).name}_n{len(asked)}.json"
    if path.exists():
        return read_json(path, "turns")
    model, _ = load_model(model_spec, dtype=args.gen_dtype, device=args.device)
    rendered = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        for q in asked
    ]
    prompts = tokenizer(rendered, add_special_tokens=False).input_ids  # as render_chat tokenises
    bos = tokenizer.bos_token_id
    prompts = [p[1:] if bos is not None and p[:1] == [bos] else p for p in prompts]  # sample_completions adds it
    ids = sample_completions(
        model, tokenizer, prompts, args.new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed
    )
    texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
    atomic_write_json(path, texts)
    return texts


def human_answers(tokenizer, articles: list[str], n_tokens: int) -> list[str]:
    """Each article's opening, ``n_tokens`` tokens long."""
    ids = tokenizer(articles, add_special_tokens=False).input_ids
    return tokenizer.batch_decode([x[:n_tokens] for x in ids], skip_special_tokens=True)


def flagged_rate(results, alpha: float) -> dict:
    from openstamp.detect.rates import clopper_pearson

    hits = sum(r.status == "ok" and r.p_value is not None and r.p_value <= alpha for r in results)
    low, high = clopper_pearson(hits, len(results))
    scored = [r.n_tokens for r in results if r.status == "ok"]
    return {
        "rate": hits / len(results),
        "hits": hits,
        "n": len(results),
        "ci95": [low, high],
        "too_short": len(results) - len(scored),
        "median_tokens_scored": sorted(scored)[len(scored) // 2] if scored else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m", help="the instruct model (packaged alias or directory)")
    parser.add_argument("--n", type=int, default=96, help="questions (>= 64; at most the 106 Wikipedia articles)")
    parser.add_argument("--new-tokens", type=int, default=160, help="tokens per assistant turn and human answer")
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--alpha", type=float, default=0.01)
    parser.add_argument("--profile", default="default", help="embedding profile of the release")
    parser.add_argument("--gen-dtype", default="bfloat16", help="dtype the models generate in")
    parser.add_argument("--dtype", default="float32", help="dtype of detection")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/chat_detect"), help="release and turns (resumable)")
    parser.add_argument("--result", type=Path, default=None, help="JSON (default benchmarks/results/chat_detect.json)")
    parser.add_argument("--smoke", action="store_true", help="a tiny random model, 8 questions: plumbing only")
    args = parser.parse_args()
    if args.smoke:
        from smoke_model import tiny_model

        args.out = args.out if args.out != Path("runs/chat_detect") else Path("runs/chat_detect_smoke")
        args.model = str(tiny_model(args.out / "base"))
        args.n, args.new_tokens, args.profile, args.device, args.gen_dtype = 8, 24, "small", "cpu", "float32"
    run(args, args.result or (args.out / "chat_detect_smoke.json" if args.smoke else RESULTS / "chat_detect.json"))


def run(args, result_path: Path) -> None:
    from openstamp.config import DetectConfig
    from openstamp.detect import Detector
    from openstamp.key.key import WatermarkKey
    from openstamp.model.load import load_tokenizer
    from openstamp.runtime import versions

    args.out.mkdir(parents=True, exist_ok=True)
    model_dir, key_dir = release(args)
    key = WatermarkKey.load(key_dir)
    exclude = {d["sha256"] for d in key.meta.get("corpus", {}).get("documents", [])}
    asked, articles = zip(*questions(args.n, exclude), strict=True)
    tokenizer = load_tokenizer(str(model_dir))
    answers = {
        "watermarked": turns(args, str(model_dir), tokenizer, list(asked)),
        "base": turns(args, args.model, tokenizer, list(asked)),
        "human": human_answers(tokenizer, list(articles), args.new_tokens),
    }
    config = DetectConfig(alpha=args.alpha, min_tokens=min(16, args.new_tokens // 2))
    detector = Detector.from_pretrained(str(model_dir), str(key_dir), config, dtype=args.dtype, device=args.device)
    report, began = {}, time.perf_counter()
    for source in SOURCES:
        chats = [
            [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
            for q, a in zip(asked, answers[source], strict=True)
        ]
        report[source] = flagged_rate(detector.detect_messages(chats, progress=True), args.alpha)
    data = {
        "benchmark": "chat_detect",
        "question": "TPR and FPR of detection on chat-formatted assistant turns of the packaged instruct model",
        "smoke": args.smoke,
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "key_id": key.key_id,
        "key_corpus": "news (key part); questions from Wikipedia articles outside it",
        "tpr_watermarked": report["watermarked"],
        "fpr_base": report["base"],
        "fpr_human": report["human"],
        "detect_seconds": round(time.perf_counter() - began, 2),
        "example": {"question": asked[0], **{s: answers[s][0][:300] for s in SOURCES}},
        "command": " ".join(["python", *sys.argv]),
        "versions": versions(),
    }
    atomic_write_json(result_path, data)
    print(json.dumps({k: data[k]["rate"] for k in ("tpr_watermarked", "fpr_base", "fpr_human")}, indent=1))
    print(f"wrote {result_path}")


if __name__ == "__main__":
    main()
