"""openstamp demo: embed on the packaged model, sample from both models, show the result."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.panel import Panel
from rich.table import Table

from openstamp.cli.common import CacheOption, ModelOption, console, friendly_errors, setup_logging


@friendly_errors
def demo(
    out: Path = typer.Option(
        Path("runs/demo"), help="run directory (model/, key/, demo.json); replaced if present"
    ),
    model: str = ModelOption,
    corpus: str = typer.Option("wikipedia", help="corpus that builds the key"),
    prompts: str = typer.Option("news", help="corpus whose held-out documents give the prompts"),
    profile: str = typer.Option("default", help="embedding profile"),
    n: int = typer.Option(4, help="number of prompts"),
    prompt_tokens: int = typer.Option(32, help="tokens per prompt"),
    new_tokens: int = typer.Option(64, help="tokens sampled per completion"),
    seed: int = typer.Option(0, help="sampling seed (both models use the same one)"),
    cache_dir: Path | None = CacheOption,
    quiet: bool = typer.Option(False, help="no progress bars"),
) -> None:
    """Embed a watermark, sample from the original and watermarked models, and compare."""
    from transformers import AutoModelForCausalLM

    from openstamp.cli.embed import print_summary
    from openstamp.config import load_profile
    from openstamp.corpus import load_documents, split_documents
    from openstamp.embed import embed as run_embed
    from openstamp.generate import sample_completions
    from openstamp.models import load_model
    from openstamp.storage import atomic_write_json
    from openstamp.text import prompt_windows

    setup_logging(quiet)
    out.mkdir(parents=True, exist_ok=True)
    console.rule("1. embed")
    result = run_embed(
        model,
        corpus,
        out / "model",
        out / "key",
        load_profile(profile),
        cache_dir=cache_dir,
        overwrite=True,
        progress=not quiet,
    )
    print_summary(result.key, result.model_dir, result.key_dir)

    console.rule("2. generate")
    tokenizer = result.tokenizer
    texts = [d.text for d in split_documents(load_documents(prompts), "heldout")]
    windows = prompt_windows(tokenizer, texts, prompt_tokens, new_tokens, limit=n)
    prompt_ids = [p for p, _ in windows]
    original, _ = load_model(model, cache_dir=cache_dir)
    released = AutoModelForCausalLM.from_pretrained(
        result.model_dir
    ).eval()  # plain transformers, no OpenStamp
    samples = {}
    for name, m in (("original", original), ("watermarked", released)):
        ids = sample_completions(m, tokenizer, prompt_ids, new_tokens, seed=seed, progress=not quiet)
        samples[name] = tokenizer.batch_decode(ids, skip_special_tokens=True)

    records = []
    for i, p in enumerate(prompt_ids):
        record = {"prompt": tokenizer.decode(p), **{k: v[i] for k, v in samples.items()}}
        records.append(record)
        table = Table(show_header=True, expand=True)
        table.add_column("original model")
        table.add_column("watermarked model")
        table.add_row(record["original"], record["watermarked"])
        console.print(Panel(table, title=f"prompt {i + 1}: {record['prompt'][-120:]!r}"))
    atomic_write_json(
        out / "demo.json",
        {
            "settings": {
                "model": model,
                "corpus": corpus,
                "prompts": prompts,
                "profile": profile,
                "new_tokens": new_tokens,
                "seed": seed,
                "key_id": result.key.key_id,
            },
            "samples": records,
        },
    )
    console.print(
        f"watermarked checkpoint: [bold]{result.model_dir}[/]  (load it with plain "
        "AutoModelForCausalLM.from_pretrained)"
    )
    console.print(f"private key:            [bold]{result.key_dir}[/]  (keep it secret)")
    console.print(f"samples:                [bold]{out / 'demo.json'}[/]")
