"""False-positive rate per key, on the text most likely to be falsely flagged.

    python benchmarks/fpr/fpr_per_key.py [--n 1000 --keys 20 --new-tokens 100 --out runs/fpr]

An owner holds ONE key and every text is tested against it, so the p-value's promise must hold
key by key, not only on average over random keys. This script:

1. ``texts``: builds ``n`` held-out prompts (news and Wikipedia documents that built no key) and
   writes the sources of unwatermarked text, each as decoded text without its prompt:
   the original (public base) model with pure sampling, the same at temperature 0.7 / top-p 0.9,
   the human continuations, Gemma-3-270M's completions (another model, another tokenizer), and
   human code (``human_code``: windows of gensim's own Python source, a pinned package, one window
   from each file in turn, so that no file dominates). One corpus at a time, the same way: ``human_news``
   (every Lee news article: the keys are built on Wikipedia) and ``human_wikipedia`` (its held-out half).
2. ``key``: builds one key on the model under test (``--model``, the packaged SmolLM2 by default; the
   ``default`` profile users get).
3. ``score``: scores every text once through the backbone and derives, for ``keys`` owners, the
   statistics of key variants that share S and P but have their own secret (so their own G and
   permutations). See ``fpr_scoring.py`` for why that is what varies between owners.

Per source and alpha it reports the per-key FPR (median, max), the 95% Clopper-Pearson interval of
each key, and a chi-square test of whether the spread across keys exceeds the binomial spread.
Every stage caches its output under ``--out``; re-running resumes. Writes
benchmarks/results/fpr_per_key.json (``--name``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common.py

from common import heldout_windows  # noqa: E402

from openstamp.storage import atomic_write_json, read_json  # noqa: E402


@dataclass(frozen=True)
class Source:
    """One source of unwatermarked text: sampled by a model from the held-out prompts, or real text (``temperature``
    None). ``label`` is how the tables name it."""

    label: str
    model: str | None = None  # None: the model under test (--model)
    temperature: float | None = None
    top_p: float = 1.0


SOURCES = {
    "base_pure": Source("original model, pure sampling", temperature=1.0),
    "base_t0.7_p0.9": Source("original model, T 0.7 / top-p 0.9", temperature=0.7, top_p=0.9),
    "human": Source("human continuations (news, Wikipedia)"),  # the held-out prompts' own, the two in turn
    "gemma3_pure": Source("Gemma-3-270M, pure sampling", model="gemma3-270m", temperature=1.0),
    "human_code": Source("human code (gensim's Python)"),
    "human_news": Source("human news (Lee articles)"),
    "human_wikipedia": Source("human Wikipedia (held-out articles)"),
}
HUMAN = tuple(name for name, source in SOURCES.items() if source.temperature is None)  # real text, not sampled


def generate_source(out: Path, name: str, prompts_text: list[str], args) -> None:
    """Completions of every prompt from one source, batch files under out/texts/<name>/ (resumable)."""
    from openstamp.model.generate import sample_completions
    from openstamp.model.load import load_model

    source = SOURCES[name]
    directory = out / "texts" / name
    directory.mkdir(parents=True, exist_ok=True)
    model = tokenizer = None
    for b, start in enumerate(range(0, len(prompts_text), args.batch)):
        path = directory / f"b{b:04d}.json"
        if path.exists():
            continue
        if model is None:
            model, tokenizer = load_model(source.model or args.model, dtype=args.gen_dtype)
        began = time.perf_counter()
        prompts = [tokenizer(p, add_special_tokens=False).input_ids for p in prompts_text[start : start + args.batch]]
        ids = sample_completions(
            model,
            tokenizer,
            prompts,
            args.new_tokens,
            temperature=source.temperature,
            top_p=source.top_p,
            seed=args.seed * 100_003 + b,
            batch_size=args.batch,
            progress=False,
        )
        texts = tokenizer.batch_decode(ids, skip_special_tokens=True)
        atomic_write_json(path, texts)
        rate = len(prompts) * args.new_tokens / (time.perf_counter() - began)
        print(f"[texts] {name} batch {b + 1}/{-(-len(prompts_text) // args.batch)}: {rate:.0f} tok/s", flush=True)


def token_windows(tokenizer, documents: list[str], tokens: int) -> list[list[int]]:
    """Every document's consecutive windows of ``tokens`` token ids, taken in turn (``in_turns``)."""
    from openstamp.model.text import encode

    return in_turns(
        [[ids[s : s + tokens] for s in range(0, len(ids) - tokens + 1, tokens)] for ids in encode(tokenizer, documents)]
    )


def windows(tokenizer, documents: list[str], n: int, tokens: int, what: str) -> list[str]:
    """``n`` windows of ``tokens`` tokens, each document's consecutive windows taken in turn (``token_windows``)."""
    turns = token_windows(tokenizer, documents, tokens)
    if len(turns) < n:
        raise SystemExit(f"only {len(turns)} {what} windows of {tokens} tokens; lower --n")
    return tokenizer.batch_decode(turns[:n], skip_special_tokens=True)


def code_windows(tokenizer, n: int, tokens: int) -> list[str]:
    """Human-written Python: gensim's own source (not its tests), file 1's first window, file 2's first, ..."""
    return windows(tokenizer, [f.read_text(encoding="utf-8") for f in code_files()], n, tokens, "code")


def corpus_windows(tokenizer, spec: str, key_corpus: str, n: int, tokens: int) -> list[str]:
    """One packaged corpus's articles, each in turn: every article of a corpus the keys were not built on, and the
    held-out half of the one they were (no document that built a key is read)."""
    from openstamp import load_documents, split_documents

    documents = load_documents(spec)
    if spec == key_corpus:
        documents = split_documents(documents, "heldout")
    return windows(tokenizer, [d.text for d in documents], n, tokens, spec)


def code_files() -> list[Path]:
    """gensim's own Python source files (not its tests), sorted: the human code every FPR run reads."""
    from openstamp.assets import package_dir

    root = package_dir("gensim")
    return sorted(f for f in root.rglob("*.py") if "test" not in f.relative_to(root).parts)


def in_turns(per_document: list[list[list[int]]]) -> list[list[int]]:
    """Every document's first window, then every document's second, ...: no document fills the first n."""
    longest = max(map(len, per_document), default=0)
    return [windows[i] for i in range(longest) for windows in per_document if i < len(windows)]


def load_source(out: Path, name: str) -> list[str]:
    if name in HUMAN:
        return read_json(out / "texts" / f"{name}.json", "texts")
    files = sorted((out / "texts" / name).glob("b*.json"))
    return [t for f in files for t in read_json(f, "texts")]


def stage_texts(out: Path, args) -> None:
    from openstamp.model.load import load_model

    _, tokenizer = load_model(args.model)
    path = out / "texts" / "prompts.json"
    if not path.exists():
        windows = heldout_windows(tokenizer, args.n, args.prompt_tokens, args.new_tokens)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, tokenizer.batch_decode([p for p, _ in windows], skip_special_tokens=True))
        atomic_write_json(
            out / "texts" / "human.json", tokenizer.batch_decode([h for _, h in windows], skip_special_tokens=True)
        )
    made = {
        "human_code": lambda: code_windows(tokenizer, args.n, args.new_tokens),
        "human_news": lambda: corpus_windows(tokenizer, "news", args.corpus, args.n, args.new_tokens),
        "human_wikipedia": lambda: corpus_windows(tokenizer, "wikipedia", args.corpus, args.n, args.new_tokens),
    }
    for name, make in made.items():
        if name in args.sources and not (out / "texts" / f"{name}.json").exists():
            atomic_write_json(out / "texts" / f"{name}.json", make())
    prompts = read_json(path, "prompts")
    for name in args.sources:
        if name not in HUMAN:
            generate_source(out, name, prompts, args)


def stage_key(out: Path, args) -> None:
    """One key on the model under test with the profile (the default: the demo's settings)."""
    from openstamp.config import load_profile
    from openstamp.embed.pipeline import embed

    if (out / "key" / "key.json").exists():
        return
    embed(
        args.model,
        args.corpus,
        out / "model",
        out / "key",
        load_profile(args.profile),
        overwrite=True,
        progress=False,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/fpr"))
    parser.add_argument("--model", default="smollm2-135m", help="the model under test: alias, directory or hub id")
    parser.add_argument("--stage", choices=("texts", "key", "score", "all"), default="all")
    parser.add_argument("--n", type=int, default=1000, help="texts per source")
    parser.add_argument("--keys", type=int, default=20, help="key variants (owners)")
    parser.add_argument("--prompt-tokens", type=int, default=50)
    parser.add_argument("--new-tokens", type=int, default=100)
    parser.add_argument("--batch", type=int, default=50)
    parser.add_argument("--gen-dtype", default="bfloat16", help="dtype users run the public models in")
    parser.add_argument("--profile", default="default")
    parser.add_argument("--corpus", default="wikipedia", help="the key's documents (no text is drawn from them)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sources", default=",".join(SOURCES), help="comma-separated subset to generate or score")
    parser.add_argument("--name", default="fpr_per_key", help="writes benchmarks/results/<name>.json")
    args = parser.parse_args()
    args.sources = [s for s in args.sources.split(",") if s]
    if unknown := set(args.sources) - set(SOURCES):
        raise SystemExit(f"unknown sources {sorted(unknown)}; choose from {list(SOURCES)}")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.stage in ("texts", "all") or not (args.out / "settings.json").exists():
        atomic_write_json(args.out / "settings.json", json.loads(json.dumps(vars(args), default=str)))
    if args.stage in ("texts", "all"):
        stage_texts(args.out, args)
    if args.stage in ("key", "all"):
        stage_key(args.out, args)
    if args.stage in ("score", "all"):
        from fpr_scoring import stage_score

        stage_score(args.out, args, {name: load_source(args.out, name) for name in SOURCES if name in args.sources})


if __name__ == "__main__":
    main()
