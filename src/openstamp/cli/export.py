"""openstamp export ...: write a (watermarked) checkpoint in the formats people run."""

from __future__ import annotations

from pathlib import Path

import typer

from openstamp.cli.common import console, friendly_errors, setup_logging

export_app = typer.Typer(name="export", help="Export a checkpoint to another format (GGUF).", no_args_is_help=True)


@export_app.command()
@friendly_errors
def gguf(
    model: Path = typer.Option(..., "--model", "-m", help="a Hugging Face checkpoint directory (Llama or Qwen2)"),
    out: Path = typer.Option(..., "--out", help="the .gguf file to write"),
    quant: str = typer.Option(
        "q4_k_m", help="f32, f16, bf16, q8_0, q6_k, q4_0, q4_k_m or q2_k (llama-quantize's per-tensor types)"
    ),
    pre: str | None = typer.Option(
        None,
        help="tokenizer.ggml.pre: llama.cpp's name for the pre-tokenizer (default: qwen2 for Qwen2's tokenizer, "
        "else default; SmolLM2: smollm)",
    ),
    no_disclose: bool = typer.Option(
        False, "--no-disclose", help="leave the model folder's watermark.json out of the GGUF metadata (openstamp.*)"
    ),
    overwrite: bool = typer.Option(False, help="replace an existing output file"),
    quiet: bool = typer.Option(False, help="less output"),
) -> None:
    """Write the checkpoint as a GGUF file for llama.cpp, with llama.cpp's names, metadata and codecs."""
    from openstamp.release.gguf_export import export_gguf

    setup_logging(quiet)
    if not model.is_dir():
        raise FileNotFoundError(f"model directory {model} does not exist")
    record = export_gguf(model, out, quant.strip().lower(), overwrite=overwrite, pre=pre, disclose=not no_disclose)
    types = ", ".join(f"{n} x{c}" for n, c in sorted(record["tensor_types"].items()))
    head = "tied (one token_embd.weight serves as lm_head)" if record["tied"] else "untied (output.weight)"
    console.print(
        f"wrote [bold]{record['path']}[/] ({record['bytes'] / 2**20:.1f} MiB, {record['file_type']}, "
        f"{record['seconds']:.1f} s); lm_head {head}; tensors: {types}"
    )
    if record["disclosure"]:
        console.print(f"metadata discloses the watermark: openstamp.* (key id {record['disclosure']['key_id']})")
