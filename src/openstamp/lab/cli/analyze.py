"""openstamp analyze ...: the paper's analyses of how a key behaves, with plots."""

from __future__ import annotations

from pathlib import Path

import typer

from openstamp.cli.common import ModelOption, console, friendly_errors, numbers, setup_logging

analyze_app = typer.Typer(name="analyze", help="The paper's analyses of a key, with plots.", no_args_is_help=True)


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
    from openstamp.lab.analysis.lists import run_lists

    setup_logging(quiet)
    n_lists, fractions = numbers(lists_, "lists", int), numbers(gammas, "gammas")
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
    from openstamp.lab.analysis.prompt import run_prompt

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
    from openstamp.lab.analysis.llr import run_llr

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


@analyze_app.command("gamma-delta")
@friendly_errors
def gamma_delta(
    key: Path = typer.Option(..., "--key", "-k", help="a key directory: its secret, P and S stay fixed"),
    model: str = ModelOption,
    corpus: str = typer.Option("wikipedia", help="corpus whose held-out half gives the prompts"),
    gammas: str = typer.Option("0.1,0.25,0.5", help="green fractions"),
    deltas: str = typer.Option("0.25,0.5,1,2", help="strengths"),
    tokens: int = typer.Option(64, help="new tokens per text"),
    fpr: float = typer.Option(0.01, help="flag at p-value <= this false-positive rate"),
    n: int = typer.Option(32, help="held-out prompts per (gamma, delta)"),
    prompt_tokens: int = typer.Option(50, help="tokens of each prompt (withheld from the detector)"),
    seed: int = typer.Option(0, help="sampling seed"),
    out: Path = typer.Option(Path("runs/analysis/gamma-delta"), "--out", help="results.json and gamma_delta.png"),
    quiet: bool = typer.Option(False, help="less output"),
) -> None:
    """Detection (TPR at p <= --fpr) and cost (own perplexity) over a grid of gamma and delta, one key."""
    from openstamp.embed.tune import TuneConfig
    from openstamp.lab.analysis.gamma_delta import run_gamma_delta

    setup_logging(quiet)
    fractions, strengths = numbers(gammas, "gammas"), numbers(deltas, "deltas")
    if not all(0 < g < 1 for g in fractions) or min(strengths) <= 0:
        raise ValueError("need --gammas in (0, 1) and --deltas > 0")
    cfg = TuneConfig(tokens=tokens, fpr=fpr, n=n, prompt_tokens=prompt_tokens, seed=seed)
    results = run_gamma_delta(model, key, corpus, fractions, strengths, cfg, out, progress=not quiet)
    console.print(f"original model's own perplexity {results['own_ppl_original']:.2f}")
    for row in results["rows"]:
        low, high = row["tpr_ci"]
        console.print(
            f"gamma {row['gamma']:<5g} delta {row['delta']:<5g} TPR {row['tpr']:.3f} [{low:.2f}, {high:.2f}]  "
            f"own perplexity {row['own_ppl']:.2f} ({100 * row['own_ppl_change']:+.1f}%)"
        )
    console.print(f"written: {out / 'results.json'}, {out / 'gamma_delta.png'}")
