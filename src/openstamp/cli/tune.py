"""openstamp tune: build a key once and give it the smallest delta that reaches a detection target."""

from __future__ import annotations

from pathlib import Path

import typer

from openstamp.cli.common import (
    DeviceOption,
    DtypeOption,
    ModelOption,
    friendly_errors,
    parse_settings,
    setup_logging,
)
from openstamp.cli.embed import (
    NoDiscloseOption,
    SecretFileOption,
    VerifyUrlOption,
    print_summary,
    print_tune,
    read_secret,
    resolve_config,
)


@friendly_errors
def tune(
    key: Path = typer.Option(
        Path("runs/tune/key"), "--key", "-k", help="directory for the private key (with the chosen delta)"
    ),
    out: Path | None = typer.Option(None, "--out", "-o", help="also write the watermarked checkpoint here"),
    model: str = ModelOption,
    corpus: str = typer.Option("wikipedia", help="key corpus; its held-out half gives the tuning prompts"),
    profile: str = typer.Option(
        "default", help="settings profile: default, projected (0.1.0's default, with P), paper, small"
    ),
    target_tpr: float | None = typer.Option(
        None, help="fraction of watermarked texts (--target pooled: of sources) that must be detected [0.99; 0.95]"
    ),
    target: str = typer.Option("texts", help="texts: single texts at p <= --fpr; pooled: sources of --texts texts"),
    texts: int = typer.Option(20, help="--target pooled: texts per source (a random group of the --n completions)"),
    p: float = typer.Option(1e-6, "--p", help="--target pooled: a source is detected at pooled p <= this"),
    sources: int = typer.Option(20, help="--target pooled: random sources per probed delta"),
    tokens: int = typer.Option(200, help="new tokens per text: the length detection must work at"),
    fpr: float = typer.Option(0.01, help="flag at p-value <= this false-positive rate"),
    n: int = typer.Option(64, help="held-out prompts per probed delta"),
    low: float = typer.Option(0.25, help="smallest delta tried"),
    high: float = typer.Option(4.0, help="largest delta tried (the ascending pass doubles from --low)"),
    steps: int = typer.Option(3, help="bisection steps after the ascending pass (one probe each)"),
    seed: int = typer.Option(0, help="sampling seed"),
    secret_file: Path | None = SecretFileOption,
    tied_head: str = typer.Option("retie", help="retie or untie, as for embed"),
    settings: list[str] | None = typer.Option(None, "--set", help="any key setting, e.g. --set selector.n_lists=64"),
    from_key: Path | None = typer.Option(
        None, "--from-key", help="re-tune an existing key (its S, P and G) instead of building one; --model is its base"
    ),
    dtype: str = DtypeOption,
    device: str = DeviceOption,
    no_disclose: bool = NoDiscloseOption,
    verify_url: str | None = VerifyUrlOption,
    overwrite: bool = typer.Option(False, help="replace existing output directories"),
    quiet: bool = typer.Option(False, help="no progress bars"),
) -> None:
    """Choose delta: the smallest whose watermark is flagged in --target-tpr of texts of --tokens tokens
    (--target pooled: in --target-tpr of sources of --texts such texts, detected together at p <= --p)."""
    from openstamp.embed.pipeline import Release, embed
    from openstamp.embed.tune import TuneConfig
    from openstamp.release.card import check_verify_url

    setup_logging(quiet)
    release = Release(disclose=not no_disclose, verify_url=check_verify_url(verify_url))
    if target_tpr is None:
        target_tpr = 0.95 if target == "pooled" else 0.99
    pooled = {"target": target, "texts": texts, "p": p, "sources": sources}
    cfg = TuneConfig(
        target_tpr=target_tpr, tokens=tokens, fpr=fpr, n=n, low=low, high=high, steps=steps, seed=seed, **pooled
    )
    if from_key is not None:
        if secret_file is not None:
            raise typer.BadParameter(
                "--from-key keeps that key's secret; leave out --secret-file", param_hint="--secret-file"
            )
        retune(from_key, key, out, model, corpus, cfg, tied_head, dtype, device, overwrite, quiet, release)
        return
    secret = read_secret(secret_file)
    result = embed(
        model,
        corpus,
        out,
        key,
        resolve_config(profile, None, parse_settings(settings)),
        secret=secret,
        dtype=dtype,
        device=device,
        overwrite=overwrite,
        progress=not quiet,
        tied_head=tied_head,
        tune=cfg,
        disclose=release.disclose,
        verify_url=release.verify_url,
    )
    print_tune(result.key.meta["tune"])
    print_summary(result.key, result.model_dir, result.key_dir)


def retune(source: Path, key_dir: Path, out: Path | None, model: str, corpus: str, cfg, tied_head, dtype, device,
           overwrite: bool, quiet: bool, release=None) -> None:  # fmt: skip
    """Load a key, choose its delta on the base model, and write the tuned key (and checkpoint)."""
    from openstamp.corpus import load_documents, split_documents
    from openstamp.embed.pipeline import write_release
    from openstamp.embed.tune import tune_delta
    from openstamp.key import WatermarkKey
    from openstamp.model.load import load_model
    from openstamp.storage import check_can_write

    check_can_write(key_dir, overwrite)
    if out is not None:
        check_can_write(out, overwrite)
    base_key = WatermarkKey.load(source)
    base, tokenizer = load_model(model, dtype=dtype, device=device)
    heldout = split_documents(load_documents(corpus), "heldout")
    key, report = tune_delta(base, tokenizer, base_key, heldout, cfg, tied_head, progress=not quiet)
    write_release(base, tokenizer, key, key_dir, out, tied_head, model, overwrite, release)
    print_tune(report)
    print_summary(key, out, key_dir)
