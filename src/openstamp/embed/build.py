"""Building a key: documents -> hidden states -> P -> S -> green lists, each stage timed.

:func:`build_key` reads top to bottom. The states are held in memory (``States``) or written to
shards (``StateShards``, with ``states_dir``); both answer the same calls, and
``openstamp.embed.selector.fit_on_states`` fits S on either.
"""

from __future__ import annotations

import datetime as _dt
import os
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.config import EmbedConfig
from openstamp.corpus import Document
from openstamp.embed.selector import fit_on_states
from openstamp.embed.sentences import encode_texts
from openstamp.embed.shards import write_state_shards
from openstamp.embed.states import States, collect_states, context_deltas, input_gradients
from openstamp.key.key import WatermarkKey
from openstamp.key.prf import new_secret
from openstamp.key.projection import train_projection
from openstamp.model.hidden import final_hidden
from openstamp.model.load import model_device
from openstamp.model.patch import head
from openstamp.model.text import never_green_ids, token_frequencies
from openstamp.runtime import StageMonitor, versions

STRENGTH_STATES = 65_536  # held-out states behind the effective-strength estimate (at most)


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
    see :mod:`openstamp.embed.shards`.
    """

    monitor = StageMonitor()
    check_head_input(model, tokenizer)
    with monitor.stage("hidden_states"):
        if states is None and states_dir is not None:
            states = write_state_shards(model, tokenizer, documents, cfg.states, Path(states_dir), progress)
        elif states is None:
            states = collect_states(model, tokenizer, documents, cfg.states, progress)
    train, held = split_by_document(states, cfg.selector.heldout_fraction, cfg.selector.seed)
    projection, projection_stats = None, {}
    if cfg.projection.enabled:
        subset = train[: cfg.projection.n_states]
        with monitor.stage("sentence_embeddings"):
            targets = encode_texts(states.texts_at(subset), cfg.projection.embedder, progress=progress)
        with monitor.stage("projection"):
            projection, projection_stats = train_projection(states.load(subset), targets, cfg.projection, progress)

    def penalties(projection: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The consistency penalty's state differences and the Fisher penalty's input gradients, projected,
        each where it is on."""
        sel, project = cfg.selector, (lambda x: x if projection is None else x @ projection.T)
        dz = gz = None
        if sel.consistency > 0:
            cut, windows = sel.consistency_cut, sel.consistency_windows
            dz = project(context_deltas(model, tokenizer, documents, cfg.states, cut, windows))
        if sel.fisher > 0:
            gz = project(input_gradients(model, tokenizer, documents, cfg.states, sel.fisher_windows))
        return dz, gz

    with monitor.stage("selector"):
        selector, selector_stats = fit_on_states(states, train, held, projection, cfg.selector, penalties)
        held_hidden = states.load(held[:STRENGTH_STATES])
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
