"""Release audit: what does a checkpoint directory, or a GGUF file, leak before it is published?

Reads safetensors lazily (``safe_open``), and a GGUF file's tensors one at a time (dequantized);
never loads the model. Checks:

* key material: key files, key-like tensors or JSON, the secret's bytes (high). The disclosure a
  release makes by default, a model card and ``watermark.json`` (:mod:`openstamp.release.card`),
  is fine: it is checked to hold the disclosure's fields and nothing else;
* a tied head: a tied base exported with ``--tied-head untie`` keeps its input embeddings at the
  original U, and ``U~ - E = dW`` gives the watermark away. Seen from the key's record, or
  without a key from the low numerical rank of lm_head minus the embeddings. A re-tied release
  (the default) has one shared tensor holding U~ and no separate lm_head;
* the key's fingerprints: does the release carry the watermarked head, the original, or neither;
* a public base: an identical head means no watermark; a different one exposes dW = U~ - U_base;
  any release tensor equal to the base's lm_head or input embeddings is a copy of U; and
  anything else that differs from the base (tensors, config keys, files);
* near copies: a tensor that is not U~ but nearly parallel to it, or to the base's U, gives the
  watermark away even when it is not equal (``U~ - E = dW + (U - E)``): :mod:`openstamp.release.near`.

The checkpoint reader and the :class:`Finding` record are in :mod:`openstamp.release.checkpoint`.
"""

from __future__ import annotations

import base64
import json
import mmap
import re
from collections.abc import Iterator
from pathlib import Path

import torch

from openstamp.key.key import WatermarkKey
from openstamp.model.load import resolve_model_path
from openstamp.model.patch import tensor_sha256, tied_head_mode
from openstamp.model.similarity import similarity
from openstamp.release.card import CARD_FILE, DISCLOSURE_FILE, GGUF_PREFIX, Disclosure, read_disclosure
from openstamp.release.checkpoint import SEVERITIES, Checkpoint, Finding, difference_blocks
from openstamp.release.near import NEAR_COSINE, check_near_copies
from openstamp.runtime import thread_count

__all__ = ["NEAR_COSINE", "Checkpoint", "Finding", "audit", "check_near_copies", "similarity", "sketch_rank"]

KEY_FILES = {"key.json", "key.safetensors", "secret"}
KEY_TENSOR = re.compile(r"(^|\.)(selector|projection|centring)$|openstamp|watermark", re.IGNORECASE)
TEXT_SUFFIXES = {".json", ".txt", ".md", ".jinja", ".yaml", ".yml", ".py", ".cfg"}
IGNORED_CONFIG = {"transformers_version", "_name_or_path", "_model_name_or_path"}
LOW_RANK = 0.75  # rank(lm_head - embeddings) <= this fraction of the width counts as low


def sketch_rank(blocks: Iterator[torch.Tensor], width: int, *, tol: float = 1e-3, seed: int = 0) -> int:
    """Numerical rank of a (V, d) matrix given as row blocks: singular values above tol x the largest.

    A CountSketch (each row added, with a random sign, to one of 2d buckets) keeps the rank
    of the row space and costs one pass over the matrix; the eigensolve is of a (d, d) matrix.
    """
    buckets = 2 * width
    generator = torch.Generator().manual_seed(seed)
    sketch = torch.zeros(buckets, width, dtype=torch.float64)
    for block in blocks:
        rows = block.to(torch.float64)
        where = torch.randint(0, buckets, (len(rows),), generator=generator)
        signs = torch.randint(0, 2, (len(rows), 1), generator=generator).to(torch.float64) * 2 - 1
        sketch.index_add_(0, where, rows * signs)
    gram = sketch.T @ sketch  # (d, d): its eigenvalues are the squared singular values
    with thread_count(1):  # a small dense eigensolve; threads only stall when the CPU is shared
        values = torch.linalg.eigvalsh(gram).flip(0).clamp(min=0)
    if values[0] == 0:
        return 0
    return int((values > tol**2 * values[0]).sum())


# -- checks ------------------------------------------------------------------------------------


def check_key_material(ckpt: Checkpoint, key: WatermarkKey | None) -> list[Finding]:
    findings = []
    for file in ckpt.files:
        rel = ckpt.rel(file)
        if file.name in KEY_FILES:
            findings.append(Finding("high", "key material", f"key file {rel} is in the release"))
        elif "openstamp" in rel.lower():
            findings.append(Finding("medium", "openstamp file", f"{rel} is OpenStamp-specific"))
        if file.suffix in TEXT_SUFFIXES and file.name not in KEY_FILES:
            findings += _text_file(ckpt, file)
    suspicious = sorted({ckpt.names[n] for n in ckpt.index if KEY_TENSOR.search(ckpt.names[n])})
    if suspicious:
        findings.append(Finding("high", "key material", "tensors named like key material", suspicious))
    for rel, meta in ckpt.metadata.items():
        if "openstamp" in json.dumps(meta).lower():
            findings.append(Finding("info", "openstamp metadata", f"{rel}'s metadata mentions OpenStamp"))
    if key is not None:
        findings += _key_bytes(ckpt, key)
    return findings


def _text_file(ckpt: Checkpoint, file: Path) -> list[Finding]:
    if file.stat().st_size > 50 * 2**20:
        return []
    text = file.read_text(encoding="utf-8", errors="replace")
    rel = ckpt.rel(file)
    if file.suffix == ".json" and '"key_id"' in text and ('"prf_version"' in text or '"fingerprint"' in text):
        return [Finding("high", "key material", f"{rel} looks like an OpenStamp key header")]
    if "openstamp" in text.lower() and rel not in (CARD_FILE, DISCLOSURE_FILE):  # those: check_disclosure
        return [Finding("info", "openstamp mention", f"{rel} mentions OpenStamp (a disclosure is fine)")]
    return []


def check_disclosure(ckpt: Checkpoint, key: WatermarkKey | None) -> list[Finding]:
    """The release's watermark.json (a GGUF file's ``openstamp.*`` metadata) holds the disclosure's
    fields and nothing else, for the given key."""
    where = f"{GGUF_PREFIX}* metadata" if ckpt.gguf is not None else DISCLOSURE_FILE
    try:
        disclosure = Disclosure.from_gguf_metadata(ckpt.fields) if ckpt.gguf is not None else read_disclosure(ckpt.path)
    except ValueError as err:
        return [Finding("medium", "disclosure", f"{where} is not a plain disclosure: {err}")]
    if disclosure is None:
        return [Finding("info", "disclosure", f"no {where}: the release does not say it is watermarked")]
    if key is not None and disclosure.key_id != key.key_id:
        named = f"{where} names key {disclosure.key_id}, not the given key {key.key_id}"
        return [Finding("medium", "disclosure", named)]
    card = " and the model card" if ckpt.gguf is None and (ckpt.path / CARD_FILE).is_file() else ""
    fields = [f"{k}: {v}" for k, v in disclosure.to_dict().items()]
    return [Finding("info", "disclosure", f"{where}{card} disclose the watermark, and only that", fields)]


def _key_bytes(ckpt: Checkpoint, key: WatermarkKey) -> list[Finding]:
    """Look for the secret (raw, hex, base64) and the key's tensors' bytes in every file."""
    secret = key.secret
    patterns = {
        "the secret": [
            secret,
            secret.hex().encode(),
            secret.hex().upper().encode(),
            base64.b64encode(secret),
        ],
        "the selector S": [key.selector.contiguous().numpy().tobytes()[:64]],
    }
    if key.projection is not None:
        patterns["the projection P"] = [key.projection.contiguous().numpy().tobytes()[:64]]
    if getattr(key, "centring", None) is not None:
        patterns["the centring c"] = [key.centring.contiguous().numpy().tobytes()[:64]]
    findings = []
    for file in ckpt.files:
        if file.stat().st_size == 0:
            continue
        with open(file, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            for what, needles in patterns.items():
                if any(data.find(needle) >= 0 for needle in needles):
                    findings.append(Finding("high", "key material", f"{what} appears in {ckpt.rel(file)}"))
    return findings


def check_tied(ckpt: Checkpoint, key: WatermarkKey | None, near_cosine: float = NEAR_COSINE) -> list[Finding]:
    head, embed = ckpt.head_name(), ckpt.embed_name()
    if head is None:
        retied = " (re-tied: the one tensor holds U~, no copy of U)" if key and tied_head_mode(key) == "retie" else ""
        return [
            Finding("info", "tied head", f"lm_head is tied to the input embeddings (no separate head tensor){retied}")
        ]
    was_tied = bool(key and tied_head_mode(key) == "untie")
    if embed is None or ckpt.shape(head) != ckpt.shape(embed):
        return [Finding("info", "tied head", "no input embeddings of the head's shape to compare with")]
    width = ckpt.shape(head)[1]
    rank = sketch_rank(difference_blocks(ckpt, head, ckpt, embed), width)
    detail = [f"numerical rank of lm_head - input embeddings: {rank} of {width}"]
    if rank == 0:
        return [Finding("info", "tied head", "lm_head equals the input embeddings (stored twice)", detail)]
    if was_tied or rank <= LOW_RANK * width:
        why = "the key records an untied export of a tied model" if was_tied else "their difference has low rank"
        return [
            Finding(
                "high",
                "tied head",
                f"lm_head was tied to the input embeddings before watermarking ({why}): the released "
                "input embeddings are the original unembedding, so U~ - E exposes the offset and the "
                "watermark can be subtracted; this release is not removal-resistant (re-export with "
                "--tied-head retie, the default)",
                detail,
            )
        ]
    near = similarity(ckpt.blocks(head), ckpt.blocks(embed))
    detail.append(near.describe())
    if near.cosine >= near_cosine:
        return [
            Finding(
                "high",
                "near copy",
                f"lm_head and the input embeddings are near copies (cosine >= {near_cosine}): if the embeddings "
                "are close to the original unembedding U, U~ - E is close to the offset dW and the watermark "
                "can be subtracted; re-export with --tied-head retie or keep the embeddings apart from U",
                detail,
            )
        ]
    return [Finding("info", "tied head", "lm_head and the input embeddings are separate and unrelated", detail)]


def check_fingerprint(ckpt: Checkpoint, key: WatermarkKey) -> list[Finding]:
    name = ckpt.unembedding()
    if name is None:
        return [Finding("medium", "fingerprint", "no lm_head or input embeddings found to check against the key")]
    weight = ckpt.tensor(name)
    if tuple(weight.shape) != (key.vocab_size, key.hidden_size):
        return [
            Finding(
                "medium",
                "fingerprint",
                f"{name} has shape {tuple(weight.shape)}; the key is for ({key.vocab_size}, {key.hidden_size})",
            )
        ]
    copies = _fingerprint_copies(ckpt, key, name)
    which = _fingerprint(weight, key)
    if which == "watermarked":
        return [Finding("info", "fingerprint", f"{name} carries the watermark of key {key.key_id}"), *copies]
    if which == "original":
        return [
            Finding(
                "high",
                "fingerprint",
                f"{name} is the original, unwatermarked head of key {key.key_id}: this release carries no watermark",
            ),
            *copies,
        ]
    dtype = str(weight.dtype).removeprefix("torch.")
    return [
        Finding(
            "medium",
            "fingerprint",
            f"{name} ({dtype}) matches neither the watermarked nor the original "
            f"head of key {key.key_id}: another model, or modified after watermarking",
        ),
        *copies,
    ]


def _fingerprint(weight: torch.Tensor, key: WatermarkKey) -> str | None:
    """Which of the key's recorded heads ``weight`` is: "watermarked", "original", or None (neither)."""
    digest, dtype = tensor_sha256(weight), str(weight.dtype).removeprefix("torch.")
    recorded = key.meta.get("fingerprint", {})
    return next((w for w in ("watermarked", "original") if recorded.get(w, {}).get(dtype) == digest), None)


def _fingerprint_copies(ckpt: Checkpoint, key: WatermarkKey, head: str) -> list[Finding]:
    """High for every other tensor that is the key's original head U (a backup file, a spare tensor); the input
    embeddings beside a separate lm_head are :func:`check_tied`'s."""
    pair = {head, ckpt.embed_name() if ckpt.head_name() else None}
    findings = []
    for name in sorted(n for n in ckpt.index if n not in pair and ckpt.shape(n) == (key.vocab_size, key.hidden_size)):
        if _fingerprint(ckpt.tensor(name), key) == "original":
            findings.append(
                Finding(
                    "high",
                    "copy of U",
                    f"{name} is the original, unwatermarked head of key {key.key_id}: the release holds U, "
                    "so U~ - U exposes the watermark",
                )
            )
    return findings


def check_unloaded(ckpt: Checkpoint) -> list[Finding]:
    """Medium for each safetensors file the model does not load: its tensors ship but nothing checks their use."""
    return [
        Finding(
            "medium",
            "unloaded weights",
            f"{ckpt.rel(f)} is not loaded by the model (not model.safetensors or in its index): "
            "its tensors are audited under their file's name; remove it if it has no purpose",
        )
        for f in ckpt.unloaded
    ]


def check_base(ckpt: Checkpoint, base: Checkpoint, base_name: str) -> list[Finding]:
    findings, rounded = [], None
    ours, theirs = ckpt.unembedding(), base.unembedding()
    if ours is None or theirs is None or ckpt.shape(ours) != base.shape(theirs):
        findings.append(
            Finding("medium", "base", f"cannot compare the head with {base_name}'s (missing or of another shape)")
        )
    else:
        width = ckpt.shape(ours)[1]
        # a quantized file's head is compared with the base's rounded the same way, so rounding is no difference
        rounded = ckpt.stored(ours, base.tensor(theirs)) if ckpt.gguf is not None else None
        if rounded is None:
            blocks = difference_blocks(ckpt, ours, base, theirs)
        else:  # a GGUF tensor is dequantized whole anyway
            blocks = iter((ckpt.tensor(ours).float() - rounded).split(8192))
        rank = sketch_rank(blocks, width)
        if rank == 0:
            rounding = f" as this file rounds it ({ckpt.gguf[ours].tensor_type.name})" if rounded is not None else ""
            findings.append(
                Finding(
                    "high",
                    "base",
                    f"the unembedding is identical to the base {base_name}'s{rounding}: this release is not "
                    "watermarked",
                )
            )
        else:
            findings.append(
                Finding(
                    "high",
                    "base",
                    f"the unembedding differs from the public base {base_name}'s: anyone with the base "
                    "computes dW = U~ - U_base and subtracts the watermark",
                    [f"numerical rank of the difference: {rank} of {width}"],
                )
            )
    findings += _copies_of_base(ckpt, base, base_name)
    if ckpt.gguf is not None:  # llama.cpp's tensor names are not the base's: nothing else pairs up by name
        note = "a GGUF file: only its unembedding and copies of U are compared with the base"
        if ours is not None and rounded is None:
            kind = ckpt.gguf[ours].tensor_type.name
            note += f"; its head's type ({kind}) has no encoder here, so the head also differs by its rounding"
        return findings + [Finding("info", "base", note)]
    findings += _other_differences(ckpt, base, base_name, {ours, theirs, ckpt.head_name()})
    return findings


def _copies_of_base(ckpt: Checkpoint, base: Checkpoint, base_name: str) -> list[Finding]:
    """High for every release tensor equal to the base's unembedding U (a copy of U).

    U is the base's lm_head, and also its input embeddings when the base ties them (an untied
    base's input embeddings are not U, and a release keeps them as they are).
    """
    names = {base.unembedding()}
    if base.head_name() is None or base.config.get("tie_word_embeddings"):
        names.add(base.embed_name())
    originals = {n: base.tensor(n) for n in names - {None}}
    findings = []
    for name in sorted(ckpt.index):
        if ckpt.shape(name) not in {tuple(t.shape) for t in originals.values()}:
            continue
        tensor = ckpt.tensor(name)
        same = sorted(b for b, t in originals.items() if _same(tensor, t))
        if same:
            findings.append(
                Finding(
                    "high",
                    "copy of U",
                    f"{name} equals {base_name}'s {' and '.join(same)}: the release holds the original "
                    "unembedding U, so U~ - U exposes the watermark (for a tied model, export with "
                    "--tied-head retie, the default)",
                )
            )
    return findings


def _other_differences(ckpt: Checkpoint, base: Checkpoint, base_name: str, heads: set) -> list[Finding]:
    shared = sorted(set(ckpt.index) & set(base.index) - heads)
    changed = [n for n in shared if not _same(ckpt.tensor(n), base.tensor(n))]
    extra = sorted(set(ckpt.index) - set(base.index) - heads)
    findings = []
    if changed or extra:
        details = [f"differs: {n}" for n in changed] + [f"not in the base: {n}" for n in extra]
        findings.append(
            Finding(
                "medium",
                "base",
                f"{len(changed) + len(extra)} tensors beyond lm_head differ from {base_name}",
                details,
            )
        )
    else:
        findings.append(Finding("info", "base", f"apart from the head, all {len(shared)} tensors equal the base's"))
    keys = _config_differences(ckpt.config, base.config)
    if keys:
        findings.append(Finding("info", "base", f"{len(keys)} config.json keys differ from the base's", keys))
    ours = {ckpt.rel(f) for f in ckpt.files}
    only = sorted(ours - {base.rel(f) for f in base.files})
    if only:
        findings.append(Finding("info", "base", "files not in the base", only))
    return findings


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a, b.to(a.dtype))


def _config_differences(ours: dict, theirs: dict, prefix: str = "") -> list[str]:
    out = []
    for k in sorted(set(ours) | set(theirs)):
        if k in IGNORED_CONFIG:
            continue
        a, b = ours.get(k), theirs.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _config_differences(a, b, f"{prefix}{k}.")
        elif a != b:
            out.append(f"{prefix}{k}: {json.dumps(b)} -> {json.dumps(a)}")
    return out


def audit(
    checkpoint: str | Path,
    key_dir: str | Path | None = None,
    base: str | None = None,
    *,
    cache_dir: str | Path | None = None,
    near_cosine: float = NEAR_COSINE,
) -> list[Finding]:
    """Every finding about ``checkpoint``, most severe first.

    ``near_cosine``: two matrices whose mean-centred cosine reaches it count as near copies.
    """
    if not 0 < near_cosine <= 1:
        raise ValueError(f"near_cosine must be in (0, 1], not {near_cosine}")
    ckpt = Checkpoint(checkpoint)
    if not ckpt.index:
        raise ValueError(f"{checkpoint} holds no safetensors weights to audit (audit a .gguf file by its path)")
    key = WatermarkKey.load(key_dir) if key_dir is not None else None
    findings = check_key_material(ckpt, key) + check_disclosure(ckpt, key) + check_tied(ckpt, key, near_cosine)
    findings += check_unloaded(ckpt)
    if key is not None:
        findings += check_fingerprint(ckpt, key)
    base_ckpt = None
    if base is not None:
        path = Path(resolve_model_path(base, cache_dir))
        if not path.is_dir():
            raise ValueError(f"--base {base}: give a local checkpoint directory or a packaged alias")
        base_ckpt = Checkpoint(path)
        findings += check_base(ckpt, base_ckpt, base)
    findings += check_near_copies(ckpt, key, base_ckpt, base or "", near_cosine)
    if ckpt.gguf is None and any(f.suffix in (".bin", ".pt", ".pth", ".gguf") for f in ckpt.files):
        findings.append(
            Finding("info", "unchecked", "weights outside safetensors (.bin/.pt/.gguf) were not read; "
                    "audit a .gguf file by its own path")
        )  # fmt: skip
    return sorted(findings, key=lambda f: SEVERITIES.index(f.severity))
