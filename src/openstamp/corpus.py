"""Text sources -> documents.

A corpus spec is one of:

* a packaged corpus name: ``wikipedia`` or ``news`` (real text shipped inside gensim);
* a local ``.txt`` file (one document per non-empty line), ``.jsonl`` file (one document
  per line, in a text field), or a folder of such files (each ``.txt`` file is one document);
* a Hugging Face dataset: ``hf:name[:config]:split:field`` (``name`` may be a local folder).

Documents are split deterministically by a hash of their text into a ``key`` part, used
to build keys, and a ``heldout`` part, used for evaluation, so the two never overlap.
"""

from __future__ import annotations

import bz2
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from openstamp.assets import PACKAGED_CORPORA, corpus_path
from openstamp.errors import CorpusError, require_extra

SPLIT_SALT = b"openstamp/corpus-split/v1"


@dataclass(frozen=True)
class Document:
    id: str
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def load_documents(spec: str, *, text_field: str = "text", min_chars: int = 200) -> list[Document]:
    """Read every document of a corpus spec, dropping those shorter than ``min_chars``."""
    if spec in PACKAGED_CORPORA:
        docs = _packaged(spec)
    elif spec.startswith("hf:"):
        docs = _hf_dataset(spec)
    else:
        docs = _local(Path(spec).expanduser(), text_field)
    docs = [d for d in docs if len(d.text.strip()) >= min_chars]
    if not docs:
        raise CorpusError(f"corpus {spec!r} has no documents of at least {min_chars} characters")
    return docs


def load_corpora(specs: str) -> list[Document]:
    """Every document of each comma-separated corpus spec in ``specs``, in order (see :func:`load_documents`)."""
    return [d for spec in specs.split(",") if spec.strip() for d in load_documents(spec.strip())]


def split_documents(docs: list[Document], part: str, heldout_fraction: float = 0.5) -> list[Document]:
    """Keep the ``key`` part, the ``heldout`` part, or ``all`` documents (a hash split)."""
    if part == "all":
        return list(docs)
    if part not in ("key", "heldout"):
        raise ValueError(f"unknown corpus part {part!r}; choose key, heldout or all")
    chosen = [d for d in docs if (_unit_hash(d.text) < heldout_fraction) == (part == "heldout")]
    if not chosen:
        raise CorpusError(f"the {part!r} part of this corpus is empty ({len(docs)} documents in all)")
    return chosen


def fingerprint(docs: list[Document]) -> dict:
    """Record which documents were used: their ids and text hashes, and one hash over all."""
    hashes = sorted(d.sha256 for d in docs)
    return {
        "n_documents": len(docs),
        "sha256": hashlib.sha256("\n".join(hashes).encode()).hexdigest(),
        "documents": [{"id": d.id, "sha256": d.sha256} for d in docs],
    }


def _unit_hash(text: str) -> float:
    digest = hashlib.sha256(SPLIT_SALT + text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "little") / 2**64


def _packaged(name: str) -> list[Document]:
    path = corpus_path(name)
    if name == "news":
        lines = path.read_text(encoding="latin-1").splitlines()
        return [Document(f"news:{i}", line.strip()) for i, line in enumerate(lines) if line.strip()]
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    docs = []
    with bz2.open(path) as fh:
        for title, markup, page_id in extract_pages(fh):
            if markup.lstrip().lower().startswith("#redirect"):
                continue
            text = filter_wiki(markup).replace("'''", "").replace("''", "")
            lines = [line.strip() for line in text.splitlines() if len(line.strip()) > 40]
            if lines:
                docs.append(Document(f"wikipedia:{page_id}:{title}", "\n".join(lines)))
    return docs


def _local(path: Path, text_field: str) -> list[Document]:
    if not path.exists():
        raise FileNotFoundError(f"corpus {path} does not exist (not a file, folder, packaged name or hf: spec)")
    if path.is_dir():
        docs: list[Document] = []
        for file in sorted(path.rglob("*")):
            if file.suffix == ".txt":
                docs.append(Document(f"{file}", file.read_text(encoding="utf-8", errors="replace")))
            elif file.suffix == ".jsonl":
                docs.extend(_jsonl(file, text_field))
        return docs
    if path.suffix == ".jsonl":
        return _jsonl(path, text_field)
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    return [Document(f"{path}:{i}", line.strip()) for i, line in enumerate(lines) if line.strip()]


def _jsonl(path: Path, text_field: str) -> list[Document]:
    docs = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise CorpusError(f"{path}:{i + 1} is not valid JSON: {err}") from err
        if not isinstance(record, dict) or not isinstance(record.get(text_field), str):
            raise CorpusError(f"{path}:{i + 1} has no string field {text_field!r}")
        docs.append(Document(f"{path}:{i}", record[text_field]))
    return docs


def _hf_dataset(spec: str) -> list[Document]:
    parts = spec[3:].split(":")
    if len(parts) == 3:
        name, config, split, field = parts[0], None, parts[1], parts[2]
    elif len(parts) == 4:
        name, config, split, field = parts
    else:
        raise CorpusError(f"bad dataset spec {spec!r}; expected hf:name[:config]:split:field")

    require_extra("datasets", "corpora", "an hf: corpus")
    import datasets

    try:
        if Path(name).is_dir() and (Path(name) / "dataset_dict.json").exists():
            data = datasets.load_from_disk(name)[split]
        else:
            data = datasets.load_dataset(name, config, split=split)
    except Exception as err:  # datasets raises many types: missing hub access, bad split, ...
        raise CorpusError(f"could not load dataset {name!r} (config {config}, split {split}): {err}") from err
    if field not in data.column_names:
        raise CorpusError(f"dataset {name!r} has no field {field!r}; fields: {data.column_names}")
    return [Document(f"hf:{name}:{split}:{i}", str(text)) for i, text in enumerate(data[field]) if text]
