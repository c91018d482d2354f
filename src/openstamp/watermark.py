"""The embedding recipe: documents -> hidden states -> P -> S -> key -> patched model -> files.

Plain functions that read top to bottom; each stage is timed and its statistics go into
the key's metadata.
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
import os
import platform
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp import __version__
from openstamp.config import EmbedConfig
from openstamp.corpus import Document, fingerprint, load_documents, split_documents
from openstamp.embedder import encode_texts
from openstamp.hidden import States, collect_states, context_deltas, final_hidden, input_gradients
from openstamp.key.key import WatermarkKey
from openstamp.key.prf import new_secret
from openstamp.key.projection import train_projection
from openstamp.key.selector import fit_selector
from openstamp.models import load_model, model_device
from openstamp.monitor import StageMonitor
from openstamp.patch import TIED_HEAD_MODES, apply_watermark, head
from openstamp.release.card import Disclosure, base_card_header, check_verify_url, write_disclosure
from openstamp.repair import RepairConfig, repair_backbone, require_retied
from openstamp.state_shards import fit_selector_streaming, write_state_shards
from openstamp.storage import atomic_directory, check_can_write
from openstamp.text import never_green_ids, token_frequencies
from openstamp.tune import TuneConfig, tune_delta

log = logging.getLogger(__name__)
_STRENGTH_STATES = 65_536  # sharded states: held-out states behind the effective-strength estimate


def versions() -> dict[str, str]:
    import numpy
    import sklearn
    import transformers

    return {
        "openstamp": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "scikit-learn": sklearn.__version__,
    }


def check_head_input(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
    """Refuse architectures whose logits are not lm_head(last hidden state)."""
    ids = torch.tensor([tokenizer("OpenStamp checks the head input.", add_special_tokens=False).input_ids])
    ids = ids.to(model_device(model))
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        h = final_hidden(model, ids, mask)
        mine = F.linear(h, head(model).weight, getattr(head(model), "bias", None)).float()
    if not torch.allclose(mine, logits, atol=1e-3 * max(1.0, float(logits.abs().max())), rtol=1e-3):
        raise ValueError(
            f"{type(model).__name__} post-processes its logits (e.g. soft-capping or scaling); "
            "OpenStamp supports models whose logits are lm_head(final hidden state)"
        )


def split_by_document(states: States, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of training and held-out states, holding out whole documents."""
    docs = torch.unique(states.document)
    generator = torch.Generator().manual_seed(seed)
    n_held = max(1, round(len(docs) * fraction)) if len(docs) > 1 else 0
    held_docs = docs[torch.randperm(len(docs), generator=generator)[:n_held]]
    is_held = torch.isin(states.document, held_docs)
    if is_held.all() or not is_held.any():  # one document: hold out states instead
        is_held = torch.rand(len(states), generator=generator) < fraction
    return torch.nonzero(~is_held).flatten(), torch.nonzero(is_held).flatten()


def effective_strength(key: WatermarkKey, hidden: torch.Tensor, chunk: int = 256) -> float:
    """Mean over states of the std, across the vocabulary, of the watermark logits dW h."""
    stds = [key.watermark_logits(hidden[i : i + chunk]).std(dim=-1) for i in range(0, len(hidden), chunk)]
    return float(torch.cat(stds).mean()) if stds else float("nan")


def build_key(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    cfg: EmbedConfig,
    *,
    secret: bytes | None = None,
    progress: bool = True,
    states: States | None = None,
    states_dir: str | os.PathLike | None = None,
) -> WatermarkKey:
    """Sample hidden states (unless given), train P, fit S, and draw G from the secret.

    With ``states_dir``, the states are written there in shards and S is fitted by streaming
    over them (mini-batch k-means, summed ridge), so memory does not grow with their number;
    see :mod:`openstamp.state_shards`.
    """

    monitor = StageMonitor()
    check_head_input(model, tokenizer)
    with monitor.stage("hidden_states"):
        if states is None and states_dir is not None:
            states = write_state_shards(model, tokenizer, documents, cfg.states, Path(states_dir), progress)
        elif states is None:
            states = collect_states(model, tokenizer, documents, cfg.states, progress)
    sharded = not isinstance(states, States)
    train, held = split_by_document(states, cfg.selector.heldout_fraction, cfg.selector.seed)
    projection, projection_stats = None, {}
    if cfg.projection.enabled:
        subset = train[: cfg.projection.n_states]
        texts = states.texts(subset) if sharded else [states.texts[i] for i in subset.tolist()]
        with monitor.stage("sentence_embeddings"):
            targets = encode_texts(texts, cfg.projection.embedder, progress=progress)
        with monitor.stage("projection"):
            hidden = states.load(subset) if sharded else states.hidden[subset]
            projection, projection_stats = train_projection(hidden, targets, cfg.projection, progress)

    def state_deltas(projection: torch.Tensor | None) -> torch.Tensor | None:
        """The consistency penalty's projected state differences, when it is on."""
        if cfg.selector.consistency == 0:
            return None
        sel = cfg.selector
        dh = context_deltas(model, tokenizer, documents, cfg.states, sel.consistency_cut, sel.consistency_windows)
        return dh if projection is None else dh @ projection.T

    def input_side(projection: torch.Tensor | None) -> torch.Tensor | None:
        """The Fisher penalty's projected input-embedding gradients, when it is on."""
        if cfg.selector.fisher == 0:
            return None
        g = input_gradients(model, tokenizer, documents, cfg.states, cfg.selector.fisher_windows)
        return g if projection is None else g @ projection.T

    with monitor.stage("selector"):
        if sharded and (cfg.selector.consistency > 0 or cfg.selector.fisher > 0):
            raise ValueError(
                "selector.consistency and selector.fisher need states in memory; they do not run with --states-dir yet"
            )
        if sharded:
            fit_device = "cuda" if torch.cuda.is_available() else "cpu"
            selector, selector_stats = fit_selector_streaming(states, train, held, projection, cfg.selector, fit_device)
            held_hidden = states.load(held[:_STRENGTH_STATES])
        else:
            z = states.hidden if projection is None else states.hidden @ projection.T
            selector, selector_stats = fit_selector(
                z[train], z[held], cfg.selector, dz=state_deltas(projection), gz=input_side(projection)
            )
            held_hidden = states.hidden[held]
    vocab_size = head(model).weight.shape[0]
    key = WatermarkKey(
        secret=secret or new_secret(),
        selector=selector,
        projection=projection,
        gamma=cfg.green.gamma,
        delta=cfg.green.delta,
        vocab_size=vocab_size,
        never_green=never_green_ids(tokenizer, vocab_size),
    )
    if cfg.green.centre:
        key.centring = key.green_float.T @ token_frequencies(tokenizer, documents, vocab_size)
    with monitor.stage("green_lists"):
        selector_stats["effective_strength"] = effective_strength(key, held_hidden)
    selector_stats["effective_strength_over_delta"] = selector_stats["effective_strength"] / key.delta
    key.meta.update(
        config=cfg.to_dict(),
        stats={
            "n_states": len(states),
            "n_sampled_states": int((states.document >= len(documents)).sum()),  # from states.generated_windows
            "n_train_states": len(train),
            "n_heldout_states": len(held),
            "projection": projection_stats,
            "selector": selector_stats,
            "timings_s": monitor.seconds,
            "peak_rss_mb": monitor.peak_rss_mb,
        },
        versions=versions(),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
    return key


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

    With ``tune``, delta is not taken from ``cfg`` but chosen by :func:`openstamp.tune.tune_delta`
    on the corpus's held-out documents (the key's meta keeps the search). With ``out=None``
    only the key is written.

    ``tied_head`` applies to models whose lm_head is tied to the input embeddings: ``retie``
    (default) keeps one shared tensor holding U~, so the checkpoint has the base's size and
    config and no copy of U; ``untie`` keeps the input embeddings at U (leaks the offset).
    The key is written first: a checkpoint must never exist without its key. With ``disclose``
    (the default) the checkpoint says what it is: a model card and ``watermark.json``
    (:mod:`openstamp.release.card`), naming ``verify_url`` as the way to verify when given.
    With ``repair``, a re-tied release's backbone is trained back towards the base's outputs on the
    key documents before anything is written (:mod:`openstamp.repair`), and the key records it.
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
