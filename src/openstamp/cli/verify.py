"""openstamp verify-model: is this checkpoint a derivative of my release? One JSON object out."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from openstamp.cli.common import CacheOption, console, friendly_errors, out, setup_logging


@friendly_errors
def verify_model(
    suspect: str = typer.Argument(
        ..., help="the suspect: a model directory, .gguf or .safetensors file, LoRA adapter directory, or hub id"
    ),
    key: Path = typer.Option(..., "--key", "-k", help="the private key directory of the release"),
    base: str = typer.Option(..., help="the original model the release was made from (directory, alias or hub id)"),
    permutations: int = typer.Option(9999, help="permutations for the p-value (its floor is 1/(K+1))"),
    tail: bool = typer.Option(True, help="refine p below the permutation floor with the Chernoff bound"),
    adapter_base: str | None = typer.Option(
        None, help="a LoRA adapter's base model, if not the one its adapter_config.json names"
    ),
    receipt: Path | None = typer.Option(None, help="write a signed receipt of this result here (needs --signing-key)"),
    signing_key: Path | None = typer.Option(None, help="the Ed25519 private key (PEM) that signs the receipt"),
    output: Path | None = typer.Option(None, "--output", "-o", help="write the JSON here instead of stdout"),
    cache_dir: Path | None = CacheOption,
) -> None:
    """Project the suspect's head minus the base's onto the key's offset: p-value, statistic and share."""
    from openstamp.provenance import verify_model as run_verify
    from openstamp.provenance.receipt import check_receipt_options, write_receipt
    from openstamp.storage import atomic_write_text

    setup_logging(quiet=True)
    check_receipt_options(receipt, signing_key)
    cache = str(cache_dir) if cache_dir else None
    result = run_verify(
        suspect, key, base, n_permutations=permutations, tail=tail, adapter_base=adapter_base, cache_dir=cache
    )
    if receipt is not None:
        write_receipt(receipt, signing_key, "verify-model", result.to_dict(), result.files, key)
        console.print(f"receipt: {receipt}")
    text = json.dumps(result.to_dict(), indent=2)
    if output is not None:
        atomic_write_text(output, text + "\n")
    else:
        out.print_json(text)
