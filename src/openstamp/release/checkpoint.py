"""A checkpoint directory, or one GGUF file, as the release audit reads it (lazily, never loading the
model), and the :class:`Finding` each audit check returns."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open

SEVERITIES = ("high", "medium", "info")
HEAD_NAMES = ("lm_head.weight", "embed_out.weight", "output.weight")
EMBED_SUFFIXES = (
    "embed_tokens.weight",
    "wte.weight",
    "word_embeddings.weight",
    "embed_in.weight",
    "tok_embeddings.weight",
    "token_embd.weight",  # GGUF (llama.cpp's names)
)


@dataclass
class Finding:
    severity: str  # high, medium or info
    check: str
    message: str
    details: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Checkpoint:
    """A model directory (its files, config.json and an index of its safetensors tensors), or one
    ``.gguf`` file (its tensors, dequantized when read, and its metadata)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.gguf: dict[str, Any] | None = None  # a GGUF file's tensors by name
        self.fields: dict[str, Any] = {}  # a GGUF file's metadata (tokenizer.* left out)
        if self.path.suffix == ".gguf":
            self._read_gguf()
            return
        if not self.path.is_dir():
            raise NotADirectoryError(f"checkpoint {self.path} is not a directory (or a .gguf file)")
        self.files = sorted(p for p in self.path.rglob("*") if p.is_file())
        config = self.path / "config.json"
        self.config = json.loads(config.read_text(encoding="utf-8")) if config.is_file() else {}
        # every tensor of every file, by name; a tensor in a file the model does not load, or whose name an
        # earlier file already holds, by "file:name", so that nothing shadows anything
        self.index: dict[str, Path] = {}
        self.names: dict[str, str] = {}  # index entry -> the tensor's name inside its file
        self.metadata: dict[str, dict[str, str]] = {}
        weights = [f for f in self.files if f.suffix == ".safetensors"]
        self.unloaded = [f for f in weights if f not in loaded_files(self.path, weights)]
        for file in sorted(weights, key=lambda f: f in self.unloaded):  # the loaded files first
            try:
                with safe_open(str(file), "pt") as handle:
                    for name in handle.keys():
                        shadowed = file in self.unloaded or name in self.index
                        entry = f"{self.rel(file)}:{name}" if shadowed else name
                        self.index[entry], self.names[entry] = file, name
                    self.metadata[self.rel(file)] = handle.metadata() or {}
            except SafetensorError as err:
                raise ValueError(f"{file} is not a readable safetensors file: {err}") from err

    def _read_gguf(self) -> None:
        from gguf import GGUFReader

        if not self.path.is_file():
            raise FileNotFoundError(f"checkpoint {self.path} does not exist")
        try:
            reader = GGUFReader(self.path)
        except (ValueError, OSError) as err:
            raise ValueError(f"{self.path} is not a readable GGUF file: {err}") from err
        self.files, self.config = [self.path], {}
        self.gguf = {t.name: t for t in reader.tensors}
        self.index = dict.fromkeys(self.gguf, self.path)
        self.names, self.unloaded = {n: n for n in self.gguf}, []
        self.fields = {k: _plain(f.contents()) for k, f in reader.fields.items() if not k.startswith("tokenizer.")}
        self.metadata = {self.path.name: {k: str(v) for k, v in self.fields.items()}}
        # the checks read the unembedding and the embeddings several times each: dequantize each once
        self._dequantized = functools.lru_cache(maxsize=2)(self._dequantize)

    def _dequantize(self, name: str) -> torch.Tensor:
        from gguf.quants import dequantize

        t = self.gguf[name]
        return torch.from_numpy(dequantize(t.data, t.tensor_type).reshape(self.shape(name)).copy())

    def rel(self, file: Path) -> str:
        return file.name if self.gguf is not None else str(file.relative_to(self.path))

    def tensor(self, name: str) -> torch.Tensor:
        if self.gguf is not None:
            return self._dequantized(name)
        with safe_open(str(self.index[name]), "pt") as handle:
            return handle.get_tensor(self.names[name])

    def shape(self, name: str) -> tuple[int, ...]:
        if self.gguf is not None:  # GGUF lists dimensions innermost first
            return tuple(int(n) for n in reversed(self.gguf[name].shape.tolist()))
        with safe_open(str(self.index[name]), "pt") as handle:
            return tuple(handle.get_slice(self.names[name]).get_shape())

    def blocks(self, name: str, rows: int = 8192) -> Iterator[torch.Tensor]:
        """Row blocks of a 2-D tensor, read lazily (a GGUF tensor is dequantized whole first)."""
        if self.gguf is not None:
            whole = self.tensor(name)
            yield from (whole[start : start + rows] for start in range(0, len(whole), rows))
            return
        with safe_open(str(self.index[name]), "pt") as handle:
            view = handle.get_slice(self.names[name])
            for start in range(0, view.get_shape()[0], rows):
                yield view[start : start + rows]

    def stored(self, name: str, tensor: torch.Tensor) -> torch.Tensor | None:
        """``tensor`` rounded as this GGUF file stores ``name`` (llama.cpp's codec for its type,
        :func:`openstamp.release.gguf_quants.roundtrip`), or None where no encoder for that type is
        at hand."""
        from openstamp.release.gguf_quants import roundtrip

        try:
            return torch.from_numpy(roundtrip(tensor.float().numpy(), self.gguf[name].tensor_type).copy())
        except (NotImplementedError, ValueError):  # an IQ or other K type, or rows that do not fit its blocks
            return None

    def head_name(self) -> str | None:
        return next((n for n in HEAD_NAMES if n in self.index), None)

    def embed_name(self) -> str | None:
        loaded = (n for n in sorted(self.index, key=len) if self.names[n] == n)  # not an unloaded file's
        return next((n for n in loaded if n.endswith(EMBED_SUFFIXES)), None)

    def unembedding(self) -> str | None:
        """The tensor the logits come from: lm_head, or the input embeddings when tied."""
        return self.head_name() or self.embed_name()


def loaded_files(path: Path, weights: list[Path]) -> set[Path]:
    """The safetensors files ``from_pretrained`` reads: those of model.safetensors.index.json's weight map, else
    model.safetensors; where neither is there (an adapter, another layout), every file at the top level."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map") or {}
        except (ValueError, AttributeError) as err:
            raise ValueError(f"{index} is not a readable weight map: {err}") from err
        return {path / str(f) for f in weight_map.values()}
    if (path / "model.safetensors").is_file():
        return {path / "model.safetensors"}
    return {f for f in weights if f.parent == path}


def _plain(value: Any) -> Any:
    """A GGUF metadata value as plain Python (numpy scalars unwrapped)."""
    return value.item() if hasattr(value, "item") else value


def difference_blocks(a: Checkpoint, name_a: str, b: Checkpoint, name_b: str) -> Iterator[torch.Tensor]:
    """Row blocks of a[name_a] - b[name_b], with b cast to a's dtype first."""
    for x, y in zip(a.blocks(name_a), b.blocks(name_b), strict=True):
        yield x.float() - y.to(x.dtype).float()
