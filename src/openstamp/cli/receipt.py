"""openstamp receipt: make an Ed25519 signing keypair, and check a signed receipt."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from openstamp.cli.common import console, friendly_errors, out

receipt_app = typer.Typer(
    help="Signed receipts of verify-model and detect results: make a signing keypair, check a receipt.",
    no_args_is_help=True,
)


@receipt_app.command()
@friendly_errors
def keygen(
    private: Path = typer.Argument(..., help="where to write the private key (PEM, mode 0600); keep it private"),
    public: Path = typer.Argument(..., help="where to write the public key (PEM); publish it"),
    overwrite: bool = typer.Option(False, help="replace existing files"),
) -> None:
    """Write a new Ed25519 keypair for --signing-key (private) and receipt verify --public-key (public)."""
    from openstamp.provenance.receipt import generate_keypair

    fingerprint = generate_keypair(private, public, overwrite)
    out.print(f"public key sha256 {fingerprint}")


@receipt_app.command()
@friendly_errors
def verify(
    receipt: Path = typer.Argument(..., help="the receipt JSON"),
    public_key: Path = typer.Option(..., "--public-key", help="the signer's public key (PEM)"),
    key: Path | None = typer.Option(None, "--key", "-k", help="a revealed key directory: check the commitment too"),
    opening: Path | None = typer.Option(
        None, help="the receipt's opening (salts; default RECEIPT.opening.json) for --key"
    ),
) -> None:
    """Exit 0 when the signature (and, with --key, the key commitment) is valid, 1 when not, 2 on bad input."""
    from openstamp.key.key import WatermarkKey
    from openstamp.provenance.receipt import load_public_key, opening_path, read_receipt, verify_receipt

    record = read_receipt(receipt)
    public = load_public_key(public_key)
    revealed, salts = None, None
    if key is not None:
        revealed = WatermarkKey.load(key)
        opening = opening or opening_path(receipt)
        if not opening.is_file():
            raise FileNotFoundError(f"opening {opening} does not exist; give --opening")
        try:
            salts = json.loads(opening.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{opening} is not a JSON opening: {err}") from err
    valid, why = verify_receipt(record, public, revealed, salts)
    if not valid:
        console.print(f"[bold red]invalid:[/] {why}")
        raise typer.Exit(1)
    out.print(f"valid: {why} ({record.get('kind')}, {record.get('created')})")
