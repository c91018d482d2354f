"""openstamp attack ...: the paper's robustness experiments as plug-ins of the evaluation tool.

Each subcommand reads a finished ``openstamp eval`` run (``--eval``), writes its outputs to
``--out`` (resumable: finished batches are kept) and adds its section to the eval's report.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from openstamp.cli.common import console, friendly_errors, out, setup_logging

attack_app = typer.Typer(
    name="attack",
    help=(
        "Attack watermarked text and models (paraphrase, fine-tune, quantize, re-train lm_head, edit, invert S, "
        "merge, prune, instruction-tune)."
    ),
    no_args_is_help=True,
)

EvalOption = typer.Option(..., "--eval", help="a run directory written by `openstamp eval`")
MethodsOption = typer.Option(None, help="comma-separated methods to attack (default: all in the eval run)")
QuietOption = typer.Option(False, help="less output")
AtCostOption = typer.Option(
    None, help="attack each method at the strength whose own PPL change is nearest this (0.3: +30%), e.g. of a sweep"
)
# the training attacks' shared settings (openstamp.lab.training.TrainConfig): finetune and instruct
TrainStepsOption = typer.Option(300, help="optimizer steps")
TrainEveryOption = typer.Option(50, help="generate and detect every this many steps")
TrainLrOption = typer.Option(1e-4, help="peak learning rate")
TrainOptimizerOption = typer.Option("adafactor", help="adafactor or adamw")
TrainPromptsOption = typer.Option(64, help="eval prompts completed at each checkpoint")


def method_names(text: str | None) -> tuple[str, ...] | None:
    return tuple(m.strip() for m in text.split(",") if m.strip()) if text else None


def attack_settings(cls: type, params: dict[str, Any], **converted: Any) -> Any:
    """The attack's settings dataclass from the command's parameters of the same names (its ``locals()``);
    ``converted`` gives the fields whose option is spelled otherwise (a comma-separated list, a renamed flag)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{name: value for name, value in params.items() if name in names} | converted)


def run_attack(run: Callable[..., Any], eval_dir: Path, out_dir: Path, cfg: Any, quiet: bool) -> None:
    """An attack on an eval run (``run(eval_dir, out_dir, cfg, progress=...)``), timed, its section printed."""
    start = time.perf_counter()
    run(eval_dir, out_dir, cfg, progress=not quiet)
    _finish(out_dir, start, eval_dir)


def _finish(out_dir: Path, start: float, eval_dir: Path | None) -> None:
    from rich.markdown import Markdown

    out.print(Markdown((out_dir / "section.md").read_text(encoding="utf-8")))
    console.print(f"finished in {(time.perf_counter() - start) / 60:.1f} min; report: [bold]{out_dir / 'report.md'}[/]")
    if eval_dir is not None:
        console.print(f"section added to [bold]{eval_dir / 'report.md'}[/]")


@attack_app.command()
@friendly_errors
def paraphrase(
    eval_dir: Path = EvalOption,
    out_dir: Path = typer.Option(Path("runs/para"), "--out", help="output directory (resumable)"),
    paraphraser: str = typer.Option("qwen2.5-coder-1.5b", help="instruct model; qwen2.5-coder-0.5b is faster"),
    prompt: str = typer.Option("paper", help="paper (the paper's instruction) or strong (forbids copying phrases)"),
    n: int | None = typer.Option(None, help="paraphrase only the first n completions per generation set"),
    beams: int = typer.Option(1, help="beam width (the paper: 3)"),
    temperature: float = typer.Option(0.7, help="sampling temperature"),
    top_p: float = typer.Option(0.9, help="nucleus sampling"),
    max_new_tokens: int | None = typer.Option(None, help="tokens per paraphrase (default 1.5 x the original + 16)"),
    batch_size: int = typer.Option(8, help="paraphrases per generate call"),
    methods: str | None = MethodsOption,
    at_cost: float | None = AtCostOption,
    dtype: str = typer.Option("float32", help="paraphraser dtype"),
    device: str = typer.Option("cpu", help="paraphraser device"),
    quiet: bool = QuietOption,
) -> None:
    """Paraphrase watermarked completions with an instruct model and re-score them (paper Table 3)."""
    from openstamp.lab.attacks.paraphrase import ParaphraseConfig, run_paraphrase

    setup_logging(quiet)
    cfg = attack_settings(ParaphraseConfig, locals(), methods=method_names(methods))
    run_attack(run_paraphrase, eval_dir, out_dir, cfg, quiet)


@attack_app.command()
@friendly_errors
def finetune(
    eval_dir: Path = EvalOption,
    out_dir: Path = typer.Option(Path("runs/ft"), "--out", help="output directory (resumable)"),
    mode: str = typer.Option("lora", help="lora (rank 16 on blocks + lm_head), full, or head (lm_head only)"),
    corpus: str = typer.Option("wikipedia", help="training text"),
    part: str = typer.Option("key", help="hash half of the corpus: key, heldout or all"),
    steps: int = TrainStepsOption,
    every: int = TrainEveryOption,
    batch_size: int = typer.Option(4, help="sequences per step"),
    seq_len: int = typer.Option(128, help="tokens per sequence"),
    lr: float = TrainLrOption,
    optimizer: str = TrainOptimizerOption,
    n: int = TrainPromptsOption,
    seed: int = typer.Option(0, help="seed for the data order and dropout"),
    methods: str | None = MethodsOption,
    at_cost: float | None = AtCostOption,
    quiet: bool = QuietOption,
) -> None:
    """Keep training each watermarked model; plot detection (TPR@1%FPR) against steps."""
    from openstamp.lab.attacks.finetune import FinetuneConfig, run_finetune

    setup_logging(quiet)
    cfg = attack_settings(FinetuneConfig, locals(), methods=method_names(methods))
    run_attack(run_finetune, eval_dir, out_dir, cfg, quiet)


@attack_app.command()
@friendly_errors
def quantize(
    eval_dir: Path = EvalOption,
    out_dir: Path = typer.Option(Path("runs/quant"), "--out", help="output directory (resumable)"),
    scheme: str = typer.Option(
        "int8,nf4",
        help="comma-separated: int8, nf4, gguf-q8_0, gguf-q4_0, gguf-q4_k_m, gguf-q2_k, hqq-4bit, quanto-int8, "
        "quanto-int4 (the lab's SCHEMES, lab/attacks/quantizers.py)",
    ),
    head: str = typer.Option(
        "recipe+float",
        help="lm_head: recipe (GGUF quantizes it, transformers' integrations do not), recipe+float (also the "
        "float-head variant where the recipe quantizes it), both, quantized or float",
    ),
    include_head: bool = typer.Option(False, help="same as --head quantized"),
    backend: str = typer.Option("auto", help="int8/nf4: auto, bitsandbytes (CPU or CUDA) or simulated"),
    n: int | None = typer.Option(None, help="eval prompts completed per method and scheme (default: all)"),
    methods: str | None = MethodsOption,
    at_cost: float | None = AtCostOption,
    quiet: bool = QuietOption,
) -> None:
    """Quantize each watermarked model (bitsandbytes, GGUF, HQQ, quanto); generate; detect with the unquantized key."""
    from openstamp.lab.attacks.quantize import QuantizeConfig, run_quantize

    setup_logging(quiet)
    schemes = tuple(s.strip().lower() for s in scheme.split(",") if s.strip())
    cfg = attack_settings(
        QuantizeConfig,
        locals(),
        schemes=schemes,
        head="quantized" if include_head else head,
        methods=method_names(methods),
    )
    run_attack(run_quantize, eval_dir, out_dir, cfg, quiet)


@attack_app.command("reinit-head")
@friendly_errors
def reinit_head(
    model: str = typer.Option(..., "--model", "-m", help="the watermarked model (directory, hub id or alias)"),
    out_dir: Path = typer.Option(Path("runs/reinit"), "--out", help="output directory"),
    corpus: str = typer.Option(
        "news,wikipedia", help="comma-separated training text (key halves) and perplexity text (held-out halves)"
    ),
    steps: int = typer.Option(500, help="optimizer steps"),
    every: int = typer.Option(100, help="measure perplexity every this many steps"),
    batch_size: int = typer.Option(8, help="windows per step"),
    seq_len: int = typer.Option(128, help="tokens per window"),
    lr: float = typer.Option(1e-3, help="peak AdamW learning rate"),
    train_windows: int = typer.Option(0, help="distinct training windows, hidden states cached (0: all of them)"),
    eval_windows: int = typer.Option(32, help="held-out windows for perplexity"),
    eval_dir: Path | None = typer.Option(None, "--eval", help="also add the section to this eval run's report"),
    dtype: str = typer.Option("float32", help="model dtype"),
    device: str = typer.Option("cpu", help="cpu, cuda or auto"),
    quiet: bool = QuietOption,
) -> None:
    """Re-initialise lm_head, retrain only it (backbone frozen), and report held-out perplexity."""
    from openstamp.lab.attacks.common import optional_eval
    from openstamp.lab.attacks.reinit import ReinitConfig, run_reinit

    setup_logging(quiet)
    cfg = attack_settings(ReinitConfig, locals())
    eval_path = optional_eval(eval_dir)
    start = time.perf_counter()
    run_reinit(model, out_dir, cfg, eval_path, dtype=dtype, device=device, progress=not quiet)
    _finish(out_dir, start, eval_path)


@attack_app.command()
@friendly_errors
def edit(
    eval_dir: Path = EvalOption,
    out_dir: Path = typer.Option(Path("runs/edit"), "--out", help="output directory"),
    delete: float = typer.Option(0.1, help="probability that a token is deleted"),
    substitute: float = typer.Option(0.1, help="probability that a token is replaced by a random one"),
    insert: float = typer.Option(0.0, help="probability that a random token is inserted after a token"),
    seed: int = typer.Option(0, help="seed of the edit pattern"),
    methods: str | None = MethodsOption,
    at_cost: float | None = AtCostOption,
    quiet: bool = QuietOption,
) -> None:
    """Randomly delete, substitute and insert tokens of the watermarked completions; re-score them."""
    from openstamp.lab.attacks.edits import EditConfig, run_edit

    setup_logging(quiet)
    cfg = attack_settings(EditConfig, locals(), methods=method_names(methods))
    run_attack(run_edit, eval_dir, out_dir, cfg, quiet)


@attack_app.command("selector-inversion")
@friendly_errors
def selector_inversion(
    model: str | None = typer.Option(None, "--model", "-m", help="model (default: the eval run's, else smollm2-135m)"),
    out_dir: Path = typer.Option(Path("runs/inversion"), "--out", help="output directory"),
    corpora: str = typer.Option("wikipedia,news", help="the owner's corpus, then the attacker's"),
    seeds: str = typer.Option("0,1", help="the owner's k-means/P seed, then the attacker's"),
    test_corpora: str = typer.Option("wikipedia,news", help="held-out halves whose states are assigned"),
    n_lists: int = typer.Option(254, help="L for every selector"),
    n_states: int = typer.Option(8192, help="states per corpus for building a selector"),
    n_test: int = typer.Option(2048, help="held-out states assigned"),
    projection: bool = typer.Option(True, "--projection/--no-projection", help="train P, as OpenStamp does"),
    eval_dir: Path | None = typer.Option(None, "--eval", help="also add the section to this eval run's report"),
    dtype: str = typer.Option("float32", help="model dtype"),
    device: str = typer.Option("cpu", help="cpu, cuda or auto"),
    quiet: bool = QuietOption,
) -> None:
    """Rebuild the selector with another seed and/or corpus; report ARI and NMI of the cluster assignments."""
    from openstamp.lab.attacks.common import open_eval, optional_eval
    from openstamp.lab.attacks.inversion import InversionConfig, run_inversion

    setup_logging(quiet)
    split = lambda text: tuple(v.strip() for v in text.split(",") if v.strip())  # noqa: E731
    cfg = attack_settings(
        InversionConfig,
        locals(),
        corpora=split(corpora),
        seeds=tuple(int(s) for s in split(seeds)),
        test_corpora=split(test_corpora),
    )
    eval_path = optional_eval(eval_dir)
    if model is None:
        model = open_eval(eval_path).cfg.model if eval_path else "smollm2-135m"
    start = time.perf_counter()
    run_inversion(model, out_dir, cfg, eval_path, dtype=dtype, device=device, progress=not quiet)
    _finish(out_dir, start, eval_path)
