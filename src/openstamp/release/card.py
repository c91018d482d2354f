"""What a release says about itself: a model card (README.md) and ``watermark.json``.

:class:`Disclosure` is the one list of public fields. The card, ``watermark.json`` and a GGUF
export's metadata (``openstamp.<field>``) are all written from it, and ``audit`` accepts exactly
its fields. It is built from the key's public numbers only: never the secret, G, S, P, the
fingerprints of U, nor ``delta`` (a strength, not a secret, but it sizes a removal attack and a
verifier does not need it).

The base model's own card is not copied: it describes the base (its evaluations, its hub id in
code snippets) and would read as if it described this release. The new card names the base, and
its header keeps the base card's license fields, which still bind the weights.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from openstamp import __version__
from openstamp.model.patch import tied_head_mode
from openstamp.storage import atomic_write_json, atomic_write_text, read_json

PAPER = "OpenStamp: A Watermark for Open-Source Language Models"
CITATION = """@inproceedings{bakshi2026openstamp,
  title     = {OpenStamp: A Watermark for Open-Source Language Models},
  author    = {Bakshi, Miroojin and Rastogi, Saksham and Pruthi, Danish},
  booktitle = {Conference on Language Modeling (COLM)},
  year      = {2026}
}"""
CARD_FILE = "README.md"
DISCLOSURE_FILE = "watermark.json"
GGUF_PREFIX = "openstamp."
CARRIED = ("license", "license_name", "license_link", "language")  # base card header fields that still hold
TAGS = ["watermarked", "openstamp"]
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
TIED_HEAD = {
    "retie": "lm_head and the input embeddings are one tensor, holding the watermarked matrix",
    "untie": "lm_head holds the watermarked matrix; the input embeddings are the original one, which "
    "exposes the watermark's offset",
    "untied-base": "the base has its own lm_head; only lm_head carries the watermark",
}


@dataclass(frozen=True, kw_only=True)
class Disclosure:
    """The public description of a watermarked release. Every field is safe to publish."""

    method: str = field(default="OpenStamp", metadata={"help": "watermarking method"})
    paper: str = field(default=PAPER, metadata={"help": "the method's paper"})
    openstamp_version: str = field(default=__version__, metadata={"help": "OpenStamp version that wrote it"})
    key_id: str = field(metadata={"help": "key id: names the private key, reveals nothing of it"})
    gamma: float = field(metadata={"help": "green-list fraction gamma"})
    n_lists: int = field(metadata={"help": "number of green lists L"})
    tied_head: str = field(metadata={"help": "tied-head mode"})
    base_model: str = field(metadata={"help": "base model"})
    verify_url: str | None = field(default=None, metadata={"help": "detection service"})
    backbone_repaired: bool = field(
        default=False, metadata={"help": "layers retrained after re-tying (openstamp embed --repair-minutes)"}
    )

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9a-f]{16}", self.key_id):
            raise ValueError(f"key_id must be 16 hex digits, not {self.key_id!r}")
        if not 0 < self.gamma < 1:
            raise ValueError(f"gamma must be in (0, 1), not {self.gamma}")
        if self.n_lists < 1:
            raise ValueError(f"n_lists must be >= 1, not {self.n_lists}")
        if self.tied_head not in TIED_HEAD:
            raise ValueError(f"tied_head must be one of {', '.join(TIED_HEAD)}, not {self.tied_head!r}")
        check_verify_url(self.verify_url)

    @classmethod
    def from_key(cls, key, *, base_model: str, verify_url: str | None = None) -> Disclosure:
        """The disclosure of a release watermarked with ``key`` (a patched ``WatermarkKey``)."""
        return cls(
            key_id=key.key_id,
            gamma=float(key.gamma),
            n_lists=int(key.n_lists),
            tied_head=tied_head_mode(key),
            base_model=public_name(base_model),
            verify_url=verify_url,
            backbone_repaired=bool(key.meta.get("repair")),
        )

    @classmethod
    def from_dict(cls, data: Any) -> Disclosure:
        """Parse ``watermark.json``; fields beyond the disclosure's raise ValueError."""
        if not isinstance(data, dict):
            raise ValueError("a disclosure is a JSON object")
        extra = sorted(set(data) - {f.name for f in fields(cls)})
        if extra:
            raise ValueError(f"fields beyond the disclosure's: {', '.join(extra)}")
        try:
            return cls(**data)
        except TypeError as err:
            raise ValueError(str(err)) from err

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def gguf_metadata(self) -> dict[str, str | int | float]:
        """``openstamp.<field>`` -> value, for the fields that are set."""
        return {GGUF_PREFIX + k: v for k, v in self.to_dict().items() if v is not None}

    @classmethod
    def from_gguf_metadata(cls, metadata: dict[str, Any]) -> Disclosure | None:
        """The disclosure in a GGUF file's metadata (``gguf_metadata``'s inverse; other keys are ignored), or None
        when it holds no ``openstamp.*`` key; fields beyond the disclosure's raise ValueError."""
        fields = {k.removeprefix(GGUF_PREFIX): v for k, v in metadata.items() if k.startswith(GGUF_PREFIX)}
        return cls.from_dict(fields) if fields else None


def check_verify_url(url: str | None) -> str | None:
    """``url`` when it is None or an http(s) URL; anything else raises ValueError."""
    if url is not None and not re.fullmatch(r"https?://\S+", url):
        raise ValueError(f"the verify URL must be an http(s) URL, not {url!r}")
    return url


def public_name(source: str) -> str:
    """A hub id or alias as given; a local directory by its folder name (not the owner's file system)."""
    path = Path(source).expanduser()
    return path.resolve().name if path.exists() else str(source)


def base_card_header(source: str, cache_dir: str | os.PathLike | None = None) -> dict[str, Any]:
    """The base card's license and language fields, from a local README.md or the hub cache (offline)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.repocard import metadata_load

    path = Path(source).expanduser()
    card: Path | None = path / CARD_FILE if path.is_dir() else None
    if card is None and HUB_ID.fullmatch(source):
        cached = try_to_load_from_cache(source, CARD_FILE, cache_dir=cache_dir)
        card = Path(cached) if isinstance(cached, str) else None
    if card is None or not card.is_file():
        return {}
    try:
        header = metadata_load(card) or {}
    except (yaml.YAMLError, ValueError, UnicodeDecodeError):
        return {}
    return {k: header[k] for k in CARRIED if k in header}


def model_card(disclosure: Disclosure, base_header: dict[str, Any] | None = None) -> str:
    """The README.md of a release: the Hub's YAML header, what the model is, and how to verify."""
    d = disclosure
    header: dict[str, Any] = {"library_name": "transformers"}
    if HUB_ID.fullmatch(d.base_model):  # the Hub rejects a base_model that is not a hub id
        header["base_model"] = d.base_model
    header.update(base_header or {})
    header["tags"] = TAGS
    values = {**d.to_dict(), "tied_head": f"{d.tied_head}: {TIED_HEAD[d.tied_head]}",
              "backbone_repaired": "yes" if d.backbone_repaired else "no"}  # fmt: skip
    rows = [f"| {f.metadata['help']} | {values[f.name] or '-'} |" for f in fields(d) if f.name != "verify_url"]
    if d.verify_url:
        verify = (
            f"The owner runs a detection service at <{d.verify_url}>. It scores a text against this "
            f"model's key (key id `{d.key_id}`) and returns a p-value."
        )
    else:
        verify = (
            "Detection needs the private key, which the owner keeps. To check whether a text came from "
            f"this model, contact the owner of this release and quote the key id `{d.key_id}`."
        )
    leak = (
        "\n\nThis release was exported with `--tied-head untie`: its input embeddings are the original "
        "unembedding, so the watermark can be subtracted from it."
        if d.tied_head == "untie"
        else ""
    )
    differs = (
        "Its unembedding (`lm_head`) carries the watermark, and its layers were trained a little after\n"
        "the watermark went in, so that its text reads like the base's; the architecture, tokenizer\n"
        "and parameter count are the base's."
        if d.backbone_repaired
        else "It loads and runs like its base model; only the\nunembedding differs (for a model with tied "
        "embeddings, the one matrix they share)."
    )
    base_license = (base_header or {}).get("license")
    license_line = f" Its license carries over: `{base_license}`." if base_license else ""
    return f"""---
{yaml.safe_dump(header, sort_keys=False).strip()}
---

# A watermarked release of {d.base_model}

This checkpoint carries a watermark in its unembedding matrix (`lm_head`), written with
**{d.method}**, the method of *{d.paper}*. {differs} Text it generates can later be attributed
to it by whoever holds the watermark's private key.

| | |
|---|---|
{chr(10).join(rows)}

## How to verify

{verify}

The release holds no key material: not the secret, the green lists, the selector or the
projection.{leak} The same fields are in `{DISCLOSURE_FILE}`, and in the `{GGUF_PREFIX}*`
metadata of a GGUF export.

## Base model

`{d.base_model}`. Its own card still describes it (intended use, limitations, evaluation) and is
not repeated here.{license_line}

## Citation

```bibtex
{CITATION}
```
"""


def write_disclosure(folder: str | os.PathLike, disclosure: Disclosure, base_header: dict | None = None) -> None:
    """Write README.md and watermark.json into ``folder``, each atomically."""
    folder = Path(folder)
    atomic_write_json(folder / DISCLOSURE_FILE, disclosure.to_dict())
    atomic_write_text(folder / CARD_FILE, model_card(disclosure, base_header))


def read_disclosure(folder: str | os.PathLike) -> Disclosure | None:
    """The disclosure in ``folder``'s watermark.json, or None when there is none."""
    path = Path(folder) / DISCLOSURE_FILE
    if not path.is_file():
        return None
    data = read_json(path, "disclosure")
    try:
        return Disclosure.from_dict(data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from err
