"""The embedding recipe: load -> build the key (``build.py``) -> tune delta -> patch the head -> files.

``embed`` is what ``openstamp embed`` and ``openstamp.embed(...)`` run; ``write_release`` is its last
step on its own (the key first, then the checkpoint, each whole or not at all).
"""

from __future__ import annotations

import copy
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.config import EmbedConfig
from openstamp.corpus import fingerprint, load_documents, split_documents
from openstamp.embed.build import build_key
from openstamp.embed.repair import RepairConfig, repair_backbone, require_retied
from openstamp.embed.tune import TuneConfig, tune_delta
from openstamp.key.key import WatermarkKey
from openstamp.model.load import load_model
from openstamp.model.patch import TIED_HEAD_MODES, apply_watermark
from openstamp.release.card import Disclosure, base_card_header, check_verify_url, write_disclosure
from openstamp.storage import atomic_directory, check_can_write

log = logging.getLogger(__name__)


@dataclass
class EmbedResult:
    key: WatermarkKey
    model_dir: Path | None
    key_dir: Path
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase


def embed(
    model_spec: str,
    corpus_spec: str,
    out: str | os.PathLike | None,
    key_dir: str | os.PathLike,
    cfg: EmbedConfig,
    *,
    secret: bytes | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    cache_dir: str | None = None,
    corpus_part: str = "key",
    overwrite: bool = False,
    progress: bool = True,
    device_map: str | None = None,
    states_dir: str | os.PathLike | None = None,
    tied_head: str = "retie",
    tune: TuneConfig | None = None,
    disclose: bool = True,
    verify_url: str | None = None,
    repair: RepairConfig | None = None,
) -> EmbedResult:
    """Build a key on ``corpus_spec``, watermark ``model_spec``, and write both atomically.

    With ``tune``, delta is not taken from ``cfg`` but chosen by :func:`openstamp.embed.tune.tune_delta`
    on the corpus's held-out documents (the key's meta keeps the search). With ``out=None``
    only the key is written.

    ``tied_head`` applies to models whose lm_head is tied to the input embeddings: ``retie``
    (default) keeps one shared tensor holding U~, so the checkpoint has the base's size and
    config and no copy of U; ``untie`` keeps the input embeddings at U (leaks the offset).
    The key is written first: a checkpoint must never exist without its key. With ``disclose``
    (the default) the checkpoint says what it is: a model card and ``watermark.json``
    (:mod:`openstamp.release.card`), naming ``verify_url`` as the way to verify when given.
    With ``repair``, a re-tied release's backbone is trained back towards the base's outputs on the
    key documents before anything is written (:mod:`openstamp.embed.repair`), and the key records it.
    """
    if tied_head not in TIED_HEAD_MODES:
        raise ValueError(f"tied_head must be one of {', '.join(TIED_HEAD_MODES)}, not {tied_head!r}")
    check_verify_url(verify_url)
    if out is not None:
        check_can_write(out, overwrite)
    check_can_write(key_dir, overwrite)
    all_documents = load_documents(corpus_spec)
    documents = split_documents(all_documents, corpus_part)
    if repair is not None and (device_map is not None or out is None):
        raise ValueError("the backbone repair needs a release to write (--out) on one device (no --device-map)")
    model, tokenizer = load_model(model_spec, dtype=dtype, device=device, cache_dir=cache_dir, device_map=device_map)
    if repair is not None:
        require_retied(model, tied_head)
    key = build_key(model, tokenizer, documents, cfg, secret=secret, progress=progress, states_dir=states_dir)
    key.meta["corpus"] = {"spec": corpus_spec, "part": corpus_part, **fingerprint(documents)}
    if tune is not None:
        heldout = split_documents(all_documents, "heldout")
        if corpus_part == "all":
            log.warning("--corpus-part all: the tuning prompts come from documents the key was built on")
        key, _ = tune_delta(model, tokenizer, key, heldout, tune, tied_head, progress)
    release = Release(disclose, verify_url, cache_dir)
    repair_step = None
    if repair is not None:
        original = copy.deepcopy(model)  # the unwatermarked base, the repair's target

        def repair_step(watermarked: PreTrainedModel) -> dict:
            return repair_backbone(watermarked, original, tokenizer, documents, repair, progress)

    write_release(model, tokenizer, key, key_dir, out, tied_head, model_spec, overwrite, release, repair_step)
    return EmbedResult(key, Path(out) if out is not None else None, Path(key_dir), model, tokenizer)


@dataclass(frozen=True)
class Release:
    """How a checkpoint presents itself: ``disclose`` writes a model card and watermark.json
    naming ``verify_url`` (else "contact the owner"); ``cache_dir`` finds a hub base's card."""

    disclose: bool = True
    verify_url: str | None = None
    cache_dir: str | os.PathLike | None = None


def write_release(model, tokenizer, key: WatermarkKey, key_dir, out, tied_head: str, source: str, overwrite: bool,
                  release: Release | None = None, repair=None):  # fmt: skip
    """Watermark ``model`` in place, then write the key and (unless ``out`` is None) the checkpoint.

    The key is written first: a checkpoint must never exist without its key. The checkpoint's
    folder appears whole, model card and watermark.json included, or not at all. ``repair``, a
    function of the watermarked model that returns a report, runs before anything is written;
    the key keeps its report as ``meta["repair"]``.
    """
    apply_watermark(model, key, tied_head, source=source)
    if repair is not None:
        key.meta["repair"] = repair(model)
    key.save(key_dir, overwrite=overwrite)
    release = release or Release()
    if out is not None:
        disclosure = Disclosure.from_key(key, base_model=source, verify_url=release.verify_url)
        with atomic_directory(out, overwrite=overwrite) as tmp:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            if release.disclose:
                write_disclosure(tmp, disclosure, base_card_header(source, release.cache_dir))
