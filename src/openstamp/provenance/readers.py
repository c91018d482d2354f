"""Read a checkpoint's unembedding, input embeddings and vocabulary without loading the model.

A suspect (or a base) is any of:

* a Hugging Face model directory (safetensors shards; lm_head, or the input embeddings when tied), a packaged
  alias, or a hub id (downloaded with ``huggingface_hub``: configs, tokenizer files and safetensors only);
* one ``.gguf`` file: ``output.weight`` (else ``token_embd.weight``, tied) dequantized with llama.cpp's decoders
  (``gguf.quants.dequantize``), so every type ``openstamp export gguf`` writes (F32, F16, BF16, Q8_0, Q6_K, Q4_0,
  Q4_K_M) reads, and so do Q2_K, Q3_K and Q5_K; IQ types read where the installed ``gguf`` decodes them. Its
  vocabulary is ``tokenizer.ggml.tokens``;
* one ``.safetensors`` file (no vocabulary: rows align by index, with a warning);
* a LoRA adapter directory (``adapter_config.json``): merged onto its base with peft (``merge_and_unload``), the
  base being ``adapter_base`` or the adapter's ``base_model_name_or_path``. Needs peft (the [lab] extra).

The matrices come back as fp32 (V, d); ``files`` are what a receipt hashes.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

from openstamp.errors import ModelNotFoundError, require_extra
from openstamp.release.checkpoint import EMBED_SUFFIXES, HEAD_NAMES, Checkpoint

log = logging.getLogger(__name__)
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]


@dataclass
class ModelWeights:
    """What the weights test needs from one checkpoint.

    head: fp32 (V, d) unembedding; embed: fp32 (V', d) input embeddings or None; tokens: the string of each
    vocabulary id (None: unknown); architecture: the config's model_type or GGUF's general.architecture.
    """

    source: str
    head: torch.Tensor
    embed: torch.Tensor | None
    tokens: list[str] | None
    architecture: str | None
    tied: bool
    files: list[Path] = field(default_factory=list)

    @property
    def hidden_size(self) -> int:
        return self.head.shape[1]


def read_weights(spec: str | Path, *, adapter_base: str | None = None, cache_dir: str | None = None) -> ModelWeights:
    """Read ``spec`` (directory, .gguf, .safetensors, LoRA adapter directory, packaged alias or hub id)."""
    path = Path(spec).expanduser()
    if path.is_dir() and (path / "adapter_config.json").is_file():
        return _read_adapter(path, adapter_base, cache_dir)
    if path.is_dir():
        return _read_directory(path, str(spec))
    if path.is_file() and path.suffix == ".gguf":
        return _read_gguf(path)
    if path.is_file() and path.suffix == ".safetensors":
        return _read_safetensors_file(path)
    if path.exists():
        raise ValueError(f"{path} is not a model: give a model directory, a .gguf or .safetensors file")
    if str(spec).startswith(("/", ".", "~")) or path.suffix in (".gguf", ".safetensors"):
        raise FileNotFoundError(f"{spec} does not exist")
    return _read_directory(Path(_resolve_remote(str(spec), cache_dir)), str(spec))


def _resolve_remote(spec: str, cache_dir: str | None) -> str:
    """A packaged alias's converted directory, or a hub id's snapshot (weights and tokenizer files only)."""
    from openstamp.model.load import PACKAGED_MODELS, resolve_model_path

    resolved = resolve_model_path(spec, cache_dir)  # raises ModelNotFoundError for anything else
    if spec in PACKAGED_MODELS or Path(resolved).is_dir():
        return resolved
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(spec, allow_patterns=HUB_PATTERNS)
    except Exception as err:  # offline, unknown repository, gated: one clear line
        raise ModelNotFoundError(f"could not download {spec!r} from the Hugging Face hub: {err}") from err


def _read_directory(path: Path, source: str) -> ModelWeights:
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist")
    checkpoint = Checkpoint(path)
    if not checkpoint.index:
        raise ValueError(f"{path} holds no safetensors weights: is it a model directory?")
    head_name, embed_name = checkpoint.head_name(), checkpoint.embed_name()
    if head_name is None and embed_name is None:
        raise ValueError(f"{path} has no unembedding ({', '.join(HEAD_NAMES)}) nor input embeddings: not a causal LM")
    embed = checkpoint.tensor(embed_name).float() if embed_name else None
    head = checkpoint.tensor(head_name).float() if head_name else embed
    config = checkpoint.config
    text_config = config.get("text_config") or config
    return ModelWeights(
        source=source,
        head=head,
        embed=embed,
        tokens=_directory_tokens(path),
        architecture=text_config.get("model_type") or config.get("model_type"),
        tied=head_name is None,
        files=[f for f in checkpoint.files if f.suffix in (".safetensors", ".json")],
    )


def _directory_tokens(path: Path) -> list[str] | None:
    """The token string of every id, from the directory's tokenizer; None when it has none."""
    if not any((path / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        log.warning("could not read the tokenizer of %s (%s); rows align by index", path, err)
        return None
    return tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))


def _read_gguf(path: Path) -> ModelWeights:
    from gguf import GGUFReader

    checkpoint = Checkpoint(path)  # raises ValueError for a file that is not GGUF
    head_name, embed_name = checkpoint.head_name(), checkpoint.embed_name()
    if embed_name is None and head_name is None:
        raise ValueError(f"{path} has no output.weight nor token_embd.weight: not a language model GGUF")
    try:
        embed = checkpoint.tensor(embed_name).float() if embed_name else None
        head = checkpoint.tensor(head_name).float() if head_name else embed
    except NotImplementedError as err:
        raise ValueError(f"{path}: this gguf package cannot decode its embedding type: {err}") from err
    tokens_field = GGUFReader(path).fields.get("tokenizer.ggml.tokens")
    tokens = [str(t) for t in tokens_field.contents()] if tokens_field is not None else None
    return ModelWeights(
        source=str(path),
        head=head,
        embed=embed,
        tokens=tokens,
        architecture=checkpoint.fields.get("general.architecture"),
        tied=head_name is None,
        files=[path],
    )


def _read_safetensors_file(path: Path) -> ModelWeights:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), "pt") as handle:
            names = list(handle.keys())
            head_name = next((n for n in HEAD_NAMES if n in names), None)
            embed_name = next((n for n in sorted(names, key=len) if n.endswith(EMBED_SUFFIXES)), None)
            if head_name is None and embed_name is None:
                raise ValueError(f"{path} has no unembedding nor input embeddings: not a causal LM's weights")
            embed = handle.get_tensor(embed_name).float() if embed_name else None
            head = handle.get_tensor(head_name).float() if head_name else embed
    except SafetensorError as err:
        raise ValueError(f"{path} is not a readable safetensors file: {err}") from err
    return ModelWeights(str(path), head, embed, None, None, head_name is None, [path])


def _read_adapter(path: Path, adapter_base: str | None, cache_dir: str | None) -> ModelWeights:
    """Merge a LoRA adapter onto its base in memory (peft) and read the merged matrices."""
    require_extra("peft", "lab", "reading a LoRA adapter")
    from peft import PeftModel

    from openstamp.model.load import load_model

    config = json.loads((path / "adapter_config.json").read_text(encoding="utf-8"))
    base_spec = adapter_base or config.get("base_model_name_or_path")
    if not base_spec:
        raise ValueError(f"{path}/adapter_config.json names no base model; give --adapter-base")
    model, tokenizer = load_model(str(base_spec), cache_dir=cache_dir)
    merged = PeftModel.from_pretrained(model, str(path)).merge_and_unload()
    head, embed = merged.get_output_embeddings().weight, merged.get_input_embeddings().weight
    tied = head.data_ptr() == embed.data_ptr()
    head, embed = head.detach().float().clone(), embed.detach().float().clone()
    base_files = read_weights(base_spec, cache_dir=cache_dir).files if Path(str(base_spec)).exists() else []
    return ModelWeights(
        source=str(path),
        head=head,
        embed=embed,
        tokens=tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))),
        architecture=merged.config.model_type,
        tied=tied,
        files=sorted(p for p in path.iterdir() if p.is_file()) + base_files,
    )
