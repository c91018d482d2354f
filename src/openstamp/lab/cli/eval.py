"""openstamp eval / report: the paper's detection-vs-quality comparison as one reproducible command."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from openstamp.cli.common import StoreOption, console, friendly_errors, out, parse_settings, setup_logging
from openstamp.lab.generators import select_generator


@friendly_errors
def evaluate(
    out_dir: Path = typer.Option(Path("runs/eval"), "--out", help="run directory; an interrupted run resumes"),
    config: Path | None = typer.Option(None, help="YAML or JSON file of settings; flags override it"),
    model: str | None = typer.Option(None, help="model to watermark (default smollm2-135m)"),
    methods: str | None = typer.Option(None, help="comma-separated methods (default: every registered method)"),
    corpus: str | None = typer.Option(None, help="comma-separated prompt corpora (default news,wikipedia)"),
    key_corpus: str | None = typer.Option(None, help="corpus whose key half builds the keys (default wikipedia)"),
    n: int | None = typer.Option(None, help="prompts per method and seed (default 200)"),
    seeds: str | None = typer.Option(None, help="comma-separated seeds (default 0); a run may add more later"),
    sweep: bool | None = typer.Option(None, "--sweep/--no-sweep", help="run every method over its strength grid"),
    oracle: str | None = typer.Option(None, help="perplexity oracle model, or 'none' (default gemma3-270m)"),
    top_p: float | None = typer.Option(None, help="nucleus sampling (1.0 default; 0.9 is the quality setting)"),
    temperature: float | None = typer.Option(None, help="sampling temperature (default 1.0)"),
    prompt_tokens: int | None = typer.Option(None, help="prompt length (default 50)"),
    new_tokens: int | None = typer.Option(None, help="completion length (default 200)"),
    settings: list[str] | None = typer.Option(None, "--set", help="any EvalConfig field, e.g. --set strengths={...}"),
    generator: str = typer.Option(
        "transformers", help="transformers, vllm (a CUDA GPU with vLLM; else transformers) or auto"
    ),
    store: str = StoreOption,
    quiet: bool = typer.Option(False, help="less output"),
) -> None:
    """Compare OpenStamp with the baselines on detection and text quality, and write a report."""
    # lazy: every `openstamp` call imports this module; pipeline pulls torch, config yaml (~15 ms), store ~6 ms
    from openstamp.lab.evaluation.config import EvalConfig
    from openstamp.lab.evaluation.pipeline import run_eval
    from openstamp.lab.evaluation.store import open_store

    setup_logging(quiet)
    data = EvalConfig.from_file(str(config)).to_dict() if config else {}
    flags = {
        "model": model,
        "methods": methods,
        "corpus": corpus,
        "key_corpus": key_corpus,
        "n": n,
        "seeds": seeds,
        "sweep": sweep,
        "oracle": oracle,
        "top_p": top_p,
        "temperature": temperature,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        **parse_settings(settings),
    }
    data.update({k: v for k, v in flags.items() if v is not None})
    cfg = EvalConfig.from_dict(data)

    choice = select_generator(generator)
    if generator != "transformers":
        console.print(f"generator: {choice.name} ({choice.reason})")
    start = time.perf_counter()
    results = run_eval(cfg, out_dir, progress=not quiet, generator=choice.name, store=open_store(store))
    minutes = (time.perf_counter() - start) / 60
    console.print(f"finished in {minutes:.1f} min (cached stages are not recomputed)")
    print_summary(results)
    console.print(f"report: [bold]{out_dir / 'report.md'}[/]; numbers: {out_dir / 'results.json'}")


def print_summary(results: dict) -> None:
    from rich.table import Table

    from openstamp.lab.evaluation.report import fmt, shown_columns

    table = Table(title="detection and quality (mean ± sd over seeds)")
    table.add_column("method")
    table.add_column("strength")
    columns = shown_columns(results)
    for name, _ in columns:
        table.add_column(name, justify="right")
    for s in results["summary"]:
        table.add_row(s["method"], f"{s['strength']:g}", *(fmt(s.get(k), k) for _, k in columns))
    out.print(table)
