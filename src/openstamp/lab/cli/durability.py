"""openstamp attack merge | prune | instruct: what people do to open weights (issue 17).

Registered on the ``attack`` group like the other attacks: each reads a finished ``openstamp
eval`` run (``--eval``), writes resumable outputs to ``--out`` and adds its section to the
eval's report.
"""

from __future__ import annotations

from pathlib import Path

import typer

from openstamp.cli.common import friendly_errors, numbers, setup_logging
from openstamp.lab.cli.attack import (
    AtCostOption,
    EvalOption,
    MethodsOption,
    QuietOption,
    TrainEveryOption,
    TrainLrOption,
    TrainOptimizerOption,
    TrainPromptsOption,
    TrainStepsOption,
    attack_app,
    attack_settings,
    method_names,
    run_attack,
)


def _names(text: str) -> tuple[str, ...]:
    return tuple(v.strip().lower().replace("-", "_") for v in text.split(",") if v.strip())


@attack_app.command()
@friendly_errors
def merge(
    eval_dir: Path = EvalOption,
    out_dir: Path = typer.Option(Path("runs/merge"), "--out", help="output directory (resumable)"),
    with_model: str | None = typer.Option(
        None, "--with", help="model merged in: the eval's base model (default), a fine-tune, hub id, dir or alias"
    ),
    method: str = typer.Option("linear,slerp,ties,dare_ties", help="comma-separated: linear, slerp, ties, dare_ties"),
    t: str = typer.Option("0.1,0.3,0.5,0.7", "--t", help="comma-separated weights of the other model (linear, slerp)"),
    task_t: float = typer.Option(0.5, help="weight of the other model for ties and dare_ties"),
    density: float = typer.Option(0.5, help="fraction of each task vector kept (ties, dare_ties)"),
    seed: int = typer.Option(0, help="seed of DARE's drops"),
    n: int | None = typer.Option(None, help="eval prompts completed per setting (default: all)"),
    ppl_windows: int = typer.Option(16, help="held-out windows for perplexity"),
    seq_len: int = typer.Option(128, help="tokens per perplexity window"),
    methods: str | None = MethodsOption,
    at_cost: float | None = AtCostOption,
    quiet: bool = QuietOption,
) -> None:
    """Merge each watermarked model with another (linear, SLERP, TIES, DARE-TIES); detect and measure quality."""
    from openstamp.lab.attacks.merge import MergeConfig, run_merge

    setup_logging(quiet)
    merges, names = _names(method), method_names(methods)
    cfg = attack_settings(MergeConfig, locals(), merges=merges, t=numbers(t, "t"), methods=names)
    run_attack(run_merge, eval_dir, out_dir, cfg, quiet)


@attack_app.command()
@friendly_errors
def prune(
    eval_dir: Path = EvalOption,
    out_dir: Path = typer.Option(Path("runs/prune"), "--out", help="output directory (resumable)"),
    method: str = typer.Option("wanda", help="wanda (|W| x input norm, per row) or magnitude (|W|, per layer)"),
    sparsity: str = typer.Option("0.1,0.2,0.3,0.4,0.5", help="comma-separated fractions of each layer zeroed"),
    include_head: bool = typer.Option(False, help="prune lm_head too (untied first)"),
    calibration: str = typer.Option("wikipedia", help="corpus of Wanda's calibration windows"),
    calibration_windows: int = typer.Option(8, help="calibration windows"),
    seq_len: int = typer.Option(128, help="tokens per calibration and perplexity window"),
    n: int | None = typer.Option(None, help="eval prompts completed per sparsity (default: all)"),
    ppl_windows: int = typer.Option(16, help="held-out windows for perplexity"),
    methods: str | None = MethodsOption,
    at_cost: float | None = AtCostOption,
    quiet: bool = QuietOption,
) -> None:
    """Prune each watermarked model (Wanda or magnitude) at several sparsities; detect and measure quality."""
    from openstamp.lab.attacks.prune import PruneConfig, run_prune

    setup_logging(quiet)
    cfg = attack_settings(
        PruneConfig,
        locals(),
        pruner=method.strip().lower(),
        sparsities=numbers(sparsity, "sparsity"),
        methods=method_names(methods),
    )
    run_attack(run_prune, eval_dir, out_dir, cfg, quiet)


@attack_app.command()
@friendly_errors
def instruct(
    eval_dir: Path = EvalOption,
    out_dir: Path = typer.Option(Path("runs/instruct"), "--out", help="output directory (resumable)"),
    data: str | None = typer.Option(
        None, help="local .jsonl (alpaca or messages rows) or hf:NAME[:CONFIG][:SPLIT]; default: built offline"
    ),
    corpora: str = typer.Option("news,wikipedia", help="packaged corpora of the offline set"),
    examples: int = typer.Option(256, help="examples built or read (at most)"),
    mode: str = typer.Option("lora", help="lora (rank 16 on blocks + lm_head) or full"),
    steps: int = TrainStepsOption,
    every: int = TrainEveryOption,
    batch_size: int = typer.Option(4, help="examples per step"),
    seq_len: int = typer.Option(128, help="tokens per example (prompt + response, truncated)"),
    lr: float = TrainLrOption,
    optimizer: str = TrainOptimizerOption,
    n: int = TrainPromptsOption,
    seed: int = typer.Option(0, help="seed for the data order, dropout and the offline set"),
    methods: str | None = MethodsOption,
    at_cost: float | None = AtCostOption,
    quiet: bool = QuietOption,
) -> None:
    """Instruction-tune each watermarked model (LoRA or full); plot detection against steps."""
    from openstamp.lab.attacks.instruct import InstructConfig, run_instruct

    setup_logging(quiet)
    cfg = attack_settings(InstructConfig, locals(), methods=method_names(methods))
    run_attack(run_instruct, eval_dir, out_dir, cfg, quiet)
