"""openstamp demo: embed on the packaged model, sample from both models, detect, report."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from openstamp.cli.common import CacheOption, ModelOption, console, friendly_errors, out, setup_logging


@friendly_errors
def demo(
    out_dir: Path = typer.Option(
        Path("runs/demo"), "--out", help="run directory (model/, key/, demo.json); replaced if present"
    ),
    model: str = ModelOption,
    corpus: str = typer.Option("wikipedia", help="corpus that builds the key"),
    prompts: str = typer.Option("news", help="corpus whose held-out documents give the prompts"),
    profile: str = typer.Option("default", help="embedding profile"),
    n: int = typer.Option(4, help="number of prompts"),
    prompt_tokens: int = typer.Option(32, help="tokens per prompt"),
    new_tokens: int = typer.Option(
        200, help="tokens sampled per completion (the default key's delta is tuned to flag 99% of 200-token texts)"
    ),
    seed: int = typer.Option(0, help="sampling seed (both models use the same one)"),
    secret_file: Path | None = typer.Option(
        None,
        help="the key's secret (raw bytes or hex) instead of a new random one: another run with the same secret and "
        "settings repeats this one's numbers",
    ),
    cache_dir: Path | None = CacheOption,
    quiet: bool = typer.Option(False, help="no progress bars"),
) -> None:
    """Embed a watermark, sample from the original and watermarked models, detect, and compare.

    Each run draws a new random secret for its key, as ``embed`` does: another run releases another watermarked
    model, so its watermarked samples and every score and p-value differ (the prompts, the original model's samples
    and the human text do not). ``--secret-file`` (for example ``runs/demo/key/secret``) repeats a run.
    """
    from transformers import AutoModelForCausalLM

    from openstamp.cli.embed import print_summary, read_secret
    from openstamp.config import DetectConfig, load_profile
    from openstamp.corpus import load_documents, split_documents
    from openstamp.detect import Detector
    from openstamp.embed.pipeline import embed as run_embed
    from openstamp.model.generate import sample_completions
    from openstamp.model.load import load_model
    from openstamp.model.text import prompt_windows
    from openstamp.storage import atomic_write_json

    setup_logging(quiet)
    secret = read_secret(secret_file)  # before the run replaces a key it may come from
    out_dir.mkdir(parents=True, exist_ok=True)
    console.rule("1. embed")
    result = run_embed(
        model,
        corpus,
        out_dir / "model",
        out_dir / "key",
        load_profile(profile),
        cache_dir=cache_dir,
        overwrite=True,
        progress=not quiet,
        secret=secret,
    )
    print_summary(result.key, result.model_dir, result.key_dir)
    if secret is None:
        console.print(
            "a new random secret: another run gives other watermarked samples, scores and p-values (--secret-file "
            "repeats this one)"
        )

    console.rule("2. generate")
    tokenizer = result.tokenizer
    texts = [d.text for d in split_documents(load_documents(prompts), "heldout")]
    windows = prompt_windows(tokenizer, texts, prompt_tokens, new_tokens, limit=n)
    prompt_ids = [p for p, _ in windows]
    original, _ = load_model(model, cache_dir=cache_dir)
    released = AutoModelForCausalLM.from_pretrained(result.model_dir).eval()  # plain transformers, no OpenStamp
    samples = {}
    for name, m in (("original", original), ("watermarked", released)):
        ids = sample_completions(m, tokenizer, prompt_ids, new_tokens, seed=seed, progress=not quiet)
        samples[name] = tokenizer.batch_decode(ids, skip_special_tokens=True)
    samples["human"] = tokenizer.batch_decode([c for _, c in windows], skip_special_tokens=True)

    console.rule("3. detect (the completion text alone, without its prompt)")
    detector = Detector(released, tokenizer, result.key, DetectConfig(min_tokens=min(16, new_tokens)))
    scores = {name: detector.detect(texts) for name, texts in samples.items()}
    records = []
    for i, p in enumerate(prompt_ids):
        record = {
            "prompt": tokenizer.decode(p),
            **{k: v[i] for k, v in samples.items()},
            "detection": {k: v[i].to_dict() for k, v in scores.items()},
        }
        records.append(record)
        table = Table(title=f"prompt {i + 1}: ...{record['prompt'][-90:]!r}", expand=True, show_lines=True)
        table.add_column("original model")
        table.add_column("watermarked model")
        table.add_row(record["original"], record["watermarked"])
        table.add_row(*(_verdict(scores[k][i]) for k in ("original", "watermarked")))
        out.print(table)
    out.print(_summary(scores, detector.config))
    settings = {
        "model": model,
        "corpus": corpus,
        "prompts": prompts,
        "profile": profile,
        "new_tokens": new_tokens,
        "seed": seed,
        "secret": "given" if secret else "random",
        "key_id": result.key.key_id,
    }
    atomic_write_json(out_dir / "demo.json", {"settings": settings, "samples": records})
    console.print(f"watermarked checkpoint: [bold]{result.model_dir}[/] (plain AutoModelForCausalLM.from_pretrained)")
    console.print(f"private key:            [bold]{result.key_dir}[/] (keep it secret)")
    console.print(f"samples and scores:     [bold]{out_dir / 'demo.json'}[/]")


def _verdict(result) -> str:
    if result.status != "ok":
        return f"[dim]{result.status}[/]"
    flag = "[bold green]watermarked[/]" if result.decision else "not flagged"
    return f"{flag}: mean LLR {result.score:+.3f}, p = {result.p_value:.3g}"


def _summary(scores: dict, config) -> Table:
    """The flagged count per source, and what the false-positive rate means for a row of n unwatermarked texts:
    at least one of them is flagged in 1 - (1 - alpha)^n of runs (each key's rate: benchmarks/fpr/fpr_per_key.py)."""
    n = max(map(len, scores.values()), default=0)
    table = Table(
        title=f"detection at false-positive rate {config.alpha:g} ({config.n_permutations} permutations)",
        caption=f"a text not watermarked is flagged with probability about {config.alpha:g}, so a row of {n} such "
        f"texts has one flagged in about {1 - (1 - config.alpha) ** n:.0%} of runs",
    )
    for column in ("completions by", "mean LLR", "median p-value", "flagged"):
        table.add_column(column)
    for name, results in scores.items():
        ok = [r for r in results if r.status == "ok"]
        mean = sum(r.score for r in ok) / max(len(ok), 1)
        median_p = sorted(r.p_value for r in ok)[len(ok) // 2] if ok else float("nan")
        label = "human (real continuation)" if name == "human" else f"{name} model"
        table.add_row(label, f"{mean:+.3f}", f"{median_p:.3g}", f"{sum(bool(r.decision) for r in ok)} / {len(results)}")
    return table
