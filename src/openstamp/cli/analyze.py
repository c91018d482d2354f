"""openstamp analyze ...: the paper's analyses of how a key behaves, with plots."""

from __future__ import annotations

from pathlib import Path

import typer

from openstamp.cli.common import ModelOption, console, friendly_errors, setup_logging

analyze_app = typer.Typer(name="analyze", help="The paper's analyses of a key, with plots.", no_args_is_help=True)


def _values(text: str, kind: type, name: str) -> tuple:
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--{name} takes comma-separated numbers, got {text!r}") from None
    if not values:
        raise ValueError(f"--{name} is empty")
    return values


@analyze_app.command()
@friendly_errors
def lists(
    key: Path = typer.Option(..., "--key", "-k", help="a key directory: its secret, P, delta and S's settings"),
    model: str = ModelOption,
    corpus: str = typer.Option("wikipedia", help="corpus whose key half gives the hidden states"),
    lists_: str = typer.Option("16,64,256,1024", "--lists", help="numbers of green lists L to refit S at"),
    gammas: str = typer.Option("0.1,0.25,0.5", help="green fractions to draw G at"),
    states: int = typer.Option(10000, help="hidden states sampled (S is fitted on the training documents' ones)"),
    pairs: int = typer.Option(2000, help="random pairs of held-out states for the Jaccard similarity"),
    out: Path = typer.Option(Path("runs/analysis/lists"), "--out", help="results.json and lists.png go here"),
    quiet: bool = typer.Option(False, help="less output"),
) -> None:
    """Overlap of the most favoured tokens with the intended green list, and their variability, against L."""
    from openstamp.analysis.lists import run_lists

    setup_logging(quiet)
    n_lists, fractions = _values(lists_, int, "lists"), _values(gammas, float, "gammas")
    if min(n_lists) < 2 or not all(0 < g < 1 for g in fractions):
        raise ValueError("need --lists >= 2 and --gammas in (0, 1)")
    results = run_lists(model, key, corpus, n_lists, fractions, states, pairs, out, progress=not quiet)
    for row in results["rows"]:
        console.print(
            f"L {row['lists']:>5} (asked {row['lists_requested']}), gamma {row['gamma']:<5g} overlap "
            f"{row['overlap']:.3f}  Jaccard {row['jaccard']:.3f}  selector held-out accuracy "
            f"{row['selector_heldout_accuracy']:.3f}"
        )
    console.print(f"written: {out / 'results.json'}, {out / 'lists.png'}")


@analyze_app.command()
@friendly_errors
def prompt(
    eval_dir: Path = typer.Option(..., "--eval", help="a finished `openstamp eval` run with an OpenStamp method"),
    n: int | None = typer.Option(None, help="completions per run (default: all)"),
    out: Path = typer.Option(Path("runs/analysis/prompt"), "--out", help="results.json and prompt.png go here"),
    quiet: bool = typer.Option(False, help="less output"),
) -> None:
    """Score each OpenStamp completion with and without its prompt: how much detection needs the prompt."""
    from openstamp.analysis.prompt import run_prompt

    setup_logging(quiet)
    if n is not None and n < 3:
        raise ValueError("--n must be at least 3")
    results = run_prompt(eval_dir, out, n)
    for row in results["rows"]:
        gap = row["gap_by_position"]
        first = row["gap_first_position"] + 1
        console.print(
            f"{row['run']} {row['text']}: mean LLR {row['mean_score_with_prompt']:.3f} with the prompt, "
            f"{row['mean_score_without']:.3f} without (correlation {row['correlation']:.3f}); flagged at p <= 0.01 "
            f"{row['flagged_with_prompt']:.2f} / {row['flagged_without']:.2f}; "
            f"per-token gap {gap[0]:.3f} at token {first}, {sum(gap[-10:]) / len(gap[-10:]):.3f} over the last 10"
        )
    console.print(f"written: {out / 'results.json'}, {out / 'prompt.png'}")


@analyze_app.command()
@friendly_errors
def llr(
    eval_dir: Path = typer.Option(..., "--eval", help="a finished `openstamp eval` run with a weight-level baseline"),
    n: int | None = typer.Option(None, help="texts per set (default: all)"),
    batch_size: int = typer.Option(8, help="texts per forward pass"),
    out: Path = typer.Option(Path("runs/analysis/llr"), "--out", help="results.json and llr.png go here"),
    quiet: bool = typer.Option(False, help="less output"),
) -> None:
    """Rescore the weight-level baselines (Unremovable, GaussMark, KGW-distilled) with the LLR detector."""
    from openstamp.analysis.llr import run_llr

    setup_logging(quiet)
    if n is not None and n < 2:
        raise ValueError("--n must be at least 2")
    results = run_llr(eval_dir, out, n, batch_size, progress=not quiet)
    for row in results["rows"]:
        native, llr_ = row["native"], row["llr"]
        console.print(
            f"{row['run']} (n {row['texts']}): AUROC {native['auroc']:.3f} native, {llr_['auroc']:.3f} LLR; "
            f"TPR@1%FPR {native['tpr_at_1pct_fpr']:.3f} native, {llr_['tpr_at_1pct_fpr']:.3f} LLR "
            f"(against unwatermarked text {native['tpr_at_1pct_fpr_vs_unwatermarked']:.3f} / "
            f"{llr_['tpr_at_1pct_fpr_vs_unwatermarked']:.3f})"
        )
    console.print(f"written: {out / 'results.json'}, {out / 'llr.png'}")
