"""openstamp embed: build a key on a corpus and write it into a model's unembedding."""

from __future__ import annotations

import json
import string
from pathlib import Path

import typer
from rich.table import Table

from openstamp.cli.common import (
    CacheOption,
    DeviceOption,
    DtypeOption,
    ModelOption,
    console,
    friendly_errors,
    parse_settings,
    setup_logging,
)
from openstamp.config import EmbedConfig, load_profile

NoDiscloseOption = typer.Option(
    False,
    "--no-disclose",
    help="write no model card (README.md) and no watermark.json into the checkpoint; by default the release says "
    "it is watermarked, with what, its key id and how to verify",
)
VerifyUrlOption = typer.Option(
    None, "--verify-url", help="the detection service's URL, named in the model card (default: 'contact the owner')"
)

SecretFileOption = typer.Option(None, help="use this secret (raw bytes or hex) instead of a random one")


def read_secret(path: Path | None) -> bytes | None:
    """A secret file holds raw bytes, or hex text (64 hex digits for 256 bits); no file, no secret (a random one)."""
    if path is None:
        return None
    data = path.read_bytes()
    text = data.strip().decode("ascii", errors="replace")
    if text and all(c in string.hexdigits for c in text) and len(text) % 2 == 0:
        data = bytes.fromhex(text)
    if len(data) < 16:
        raise ValueError(f"secret file {path} holds {len(data)} bytes; at least 16 (128 bits) are required")
    return data


def resolve_config(profile: str, config_file: Path | None, flags: dict) -> EmbedConfig:
    """Profile, then a JSON config file, then command-line flags (later wins)."""
    cfg = load_profile(profile)
    if config_file is not None:
        data = json.loads(config_file.read_text())
        merged = cfg.to_dict()
        for section, values in data.items():
            if isinstance(values, dict) and isinstance(merged.get(section), dict):
                merged[section].update(values)
            else:
                merged[section] = values
        cfg = EmbedConfig.from_dict(merged)
    return cfg.with_overrides(flags)


@friendly_errors
def embed(
    out: Path = typer.Option(..., "--out", "-o", help="directory for the watermarked checkpoint"),
    key: Path = typer.Option(..., "--key", "-k", help="directory for the private key"),
    model: str = ModelOption,
    corpus: str = typer.Option(
        "wikipedia", help="wikipedia, news, a .txt/.jsonl file or folder, or hf:name[:config]:split:field"
    ),
    corpus_part: str = typer.Option("key", help="documents to use: the 'key' half of the hash split, or 'all'"),
    profile: str = typer.Option(
        "default", help="settings profile: default (CPU, minutes), projected (0.1.0's default, with P), paper, small"
    ),
    config: Path | None = typer.Option(None, help="JSON file of settings (sections states/projection/selector/green)"),
    gamma: float | None = typer.Option(None, help="green-list fraction"),
    delta: str | None = typer.Option(
        None, help="watermark strength (logit boost), or 'auto': the smallest that reaches --target-tpr (see tune)"
    ),
    target_tpr: float = typer.Option(0.99, help="with --delta auto: fraction of texts that must be flagged"),
    tune_tokens: int = typer.Option(200, help="with --delta auto: new tokens per text"),
    tune_fpr: float = typer.Option(0.01, help="with --delta auto: flag at p <= this"),
    lists: int | None = typer.Option(None, help="L, the number of clusters / green lists"),
    states: int | None = typer.Option(None, help="hidden states to sample"),
    epochs: int | None = typer.Option(None, help="epochs of P training"),
    embedder: str | None = typer.Option(
        None, help="sentence-transformers model for P's targets (default: packaged MiniLM)"
    ),
    no_projection: bool = typer.Option(False, "--no-projection", help="P = I: the paper's 'w/o sem-align' ablation"),
    seed: int | None = typer.Option(None, help="seed for sampling states and k-means"),
    secret_file: Path | None = SecretFileOption,
    settings: list[str] | None = typer.Option(None, "--set", help="any setting, e.g. --set projection.lr=1e-4"),
    dtype: str = DtypeOption,
    device: str = DeviceOption,
    cache_dir: Path | None = CacheOption,
    tied_head: str = typer.Option(
        "retie",
        help="for a model whose lm_head is tied to its input embeddings: 'retie' writes U~ into the one "
        "shared tensor (same size and config as the base, no copy of U); 'untie' keeps the input embeddings "
        "at U, which lets anyone subtract the watermark. No effect on an untied model",
    ),
    no_disclose: bool = NoDiscloseOption,
    verify_url: str | None = VerifyUrlOption,
    overwrite: bool = typer.Option(False, help="replace existing output directories"),
    quiet: bool = typer.Option(False, help="no progress bars"),
    device_map: str | None = typer.Option(
        None, help="'auto': accelerate spreads a large model over GPUs, CPU and disk (replaces --device)"
    ),
    states_dir: Path | None = typer.Option(
        None, help="write hidden states here in shards and fit the selector by streaming (large models)"
    ),
    repair_minutes: float = typer.Option(
        0.0,
        help="a tied model re-tied: train its layers (not U~) for this many wall-clock minutes towards the base's "
        "outputs, which removes part of the cost the detector cannot see (e.g. 30); 0: off. Detect such a "
        "release with the released checkpoint only",
    ),
) -> None:
    """Build a watermark key on a corpus and write it into a model's unembedding."""
    from openstamp.embed.pipeline import embed as run_embed
    from openstamp.embed.repair import RepairConfig
    from openstamp.embed.tune import TuneConfig

    setup_logging(quiet)
    if repair_minutes < 0:
        raise ValueError("--repair-minutes must be >= 0 (0: no repair)")
    if repair_minutes > 0 and tied_head != "retie":
        raise ValueError("--repair-minutes repairs a re-tied release; it does not combine with --tied-head untie")
    repair = RepairConfig(minutes=repair_minutes) if repair_minutes > 0 else None
    tune = None
    if delta == "auto":
        tune = TuneConfig(target_tpr=target_tpr, tokens=tune_tokens, fpr=tune_fpr)
    flags = {
        "green.gamma": gamma,
        "green.delta": parse_delta(delta),
        "selector.n_lists": lists,
        "states.n_states": states,
        "projection.epochs": epochs,
        "projection.embedder": embedder,
        "projection.enabled": False if no_projection else None,
        "states.seed": seed,
        "selector.seed": seed,
        **parse_settings(settings),
    }
    cfg = resolve_config(profile, config, flags)
    secret = read_secret(secret_file)
    result = run_embed(
        model,
        corpus,
        out,
        key,
        cfg,
        secret=secret,
        dtype=dtype,
        device=device,
        cache_dir=cache_dir,
        corpus_part=corpus_part,
        overwrite=overwrite,
        progress=not quiet,
        device_map=device_map,
        states_dir=states_dir,
        tied_head=tied_head,
        tune=tune,
        disclose=not no_disclose,
        verify_url=verify_url,
        repair=repair,
    )
    if tune is not None:
        print_tune(result.key.meta["tune"])
    print_summary(result.key, result.model_dir, result.key_dir)
    if repair is not None:
        print_repair(result.key.meta["repair"])


def parse_delta(text: str | None) -> float | None:
    """A number, or None for 'auto' and for no flag."""
    if text is None or text == "auto":
        return None
    try:
        value = float(text)
    except ValueError:
        raise typer.BadParameter(f"--delta must be a number or 'auto', not {text!r}") from None
    if value <= 0:
        raise typer.BadParameter("--delta must be > 0")
    return value


def print_tune(report: dict) -> None:
    """The strengths the search tried, what each bought and cost, and the one it chose."""
    s = report["settings"]
    title = f"delta search: TPR at p <= {s['fpr']} on {s['n']} held-out texts of {s['tokens']} tokens"
    if s.get("target") == "pooled":
        title = (
            f"delta search: sources of {s['texts']} texts of {s['tokens']} tokens detected at pooled p <= {s['p']:g} "
            f"({s['sources']} random sources of {s['n']} held-out texts)"
        )
    table = Table(title=title)
    for column in ("delta", "TPR [95% CI]", "own perplexity", "change"):
        table.add_column(column, justify="right")
    for p in report["probes"]:
        mark = " *" if p["delta"] == report["delta"] else ""
        ci = f"{p['tpr']:.3f} [{p['tpr_ci'][0]:.3f}, {p['tpr_ci'][1]:.3f}]"
        table.add_row(f"{p['delta']:.3g}{mark}", ci, f"{p['own_ppl']:.2f}", f"{p['own_ppl_change']:+.1%}")
    console.print(table)
    verdict = "reaches" if report["reached"] else "[bold yellow]does not reach[/] (largest delta tried)"
    console.print(
        f"delta {report['delta']:.3g} {verdict} TPR {s['target_tpr']}: measured {report['tpr']:.3f}; "
        f"own perplexity {report['own_ppl_original']:.2f} -> {report['own_ppl']:.2f} "
        f"({report['own_ppl_change']:+.1%}) on the prompts' human continuations"
    )


def print_repair(report: dict) -> None:
    """The repair's KL from the base before and after, on windows it did not train on."""
    held = report["heldout"]
    console.print(
        f"backbone repair: {report['steps']} steps in {report['seconds']:.0f} s on {report['n_windows_heldin']} "
        f"document and {report['n_windows_generated']} sampled windows; training KL {report['kl_initial']:.4f} -> "
        f"{report['kl_final']:.4f}"
    )
    if held["n_windows"]:
        console.print(
            f"  on {held['n_windows']} held-back windows, KL from the base: unseen (U h~) "
            f"{held['unseen_kl_before']:.4f} -> {held['unseen_kl_after']:.4f}; release (U~ h~) "
            f"{held['release_kl_before']:.4f} -> {held['release_kl_after']:.4f}"
        )


def print_summary(key, model_dir: Path, key_dir: Path) -> None:
    stats, sel = key.meta["stats"], key.meta["stats"]["selector"]
    proj = stats.get("projection") or {}
    table = Table(title="OpenStamp key", show_header=False)
    table.add_row("key id", key.key_id)
    model = key.meta["model"]
    tied = model.get("tied_head", "untie" if model["tied"] else "untied-base")
    table.add_row("model", f"{model['source']} ({model['architecture']}, tied head: {tied})")
    table.add_row("corpus", f"{key.meta['corpus']['spec']} ({key.meta['corpus']['n_documents']} documents)")
    table.add_row(
        "states",
        f"{stats['n_states']} ({stats['n_train_states']} train / {stats['n_heldout_states']} held out)",
    )
    table.add_row("gamma / delta", f"{key.gamma:g} / {key.delta:.4g}")
    table.add_row(
        "green lists",
        f"{sel['n_lists']} of {sel['n_lists_requested']} ({sel['n_dropped_clusters']} small ones dropped)",
    )
    table.add_row("selector accuracy", f"train {sel['train_accuracy']:.3f}, held out {sel['heldout_accuracy']:.3f}")
    table.add_row(
        "effective strength",
        f"{sel['effective_strength']:.3f} ({sel['effective_strength_over_delta']:.2f} x delta)",
    )
    if proj:
        table.add_row(
            "projection",
            f"held-out KL {proj['heldout_kl_identity']:.3f} -> {proj['heldout_kl']:.3f}, "
            f"similarity corr {proj['heldout_corr_identity']:.3f} -> {proj['heldout_corr']:.3f}",
        )
    else:
        table.add_row("projection", "none (P = I)")
    table.add_row("timings (s)", ", ".join(f"{k} {v:.1f}" for k, v in stats["timings_s"].items()))
    table.add_row("checkpoint", str(model_dir) if model_dir else "not written (key only)")
    table.add_row("key (private)", str(key_dir))
    console.print(table)
    for warning in key.meta.get("warnings", []):
        console.print(f"[bold yellow]warning:[/] {warning}")
