"""A short backbone repair for a re-tied release: train the layers, never the unembedding.

A re-tied release feeds ``U~ = U + dW`` into its backbone too, so its final hidden states move
from ``h0`` to ``h~``. The detector compares ``U~ h~`` with ``U h~`` and never sees that move; it
is the release's unseen cost. The repair keeps ``U~`` (the one tied tensor) fixed, bit for bit,
and trains every other weight of the decoder (its layers and final norm) to minimise

    KL(p0 || softmax(U h~ + b))      p0 = softmax(U h0 + b), the original model on the same window

averaged over the tokens of windows of held-in documents and of text sampled from the original
model (``generated_fraction`` of the windows). ``U`` and ``b`` are the original head's. The
released head still reads ``U~ h~``, so the watermark's own (seen) change stays as it was.

Only the release holds the repaired layers: detection runs on the released checkpoint, since
the original model with ``U~`` written into it no longer gives the release's hidden states. A
key records the repair as ``meta["repair"]`` (the report of :func:`repair_backbone`), and
``Detector`` refuses to stand the original in for such a release.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from openstamp.config import check, option
from openstamp.corpus import Document
from openstamp.errors import RepairError
from openstamp.model.generate import sample_completions
from openstamp.model.load import model_device
from openstamp.model.patch import head, is_tied
from openstamp.model.text import bos_prefix, document_windows

WARMUP_STEPS = 10  # linear warm-up of the learning rate, then a cosine over the budget
PROMPT_TOKENS = 16  # document tokens that start each sampled window
LAST = 5  # steps averaged for the report's first and last training KL


@dataclass(frozen=True, kw_only=True)
class RepairConfig:
    """How long and on what the backbone of a re-tied release is repaired."""

    minutes: float = option(30.0, "wall-clock budget, sampling included; the cosine schedule spans it")
    max_steps: int | None = option(None, "stop after this many optimizer steps even within the budget")
    batch_size: int = option(8, "windows per step")
    seq_len: int = option(128, "tokens per window, BOS included")
    lr: float = option(
        5e-5,
        "peak AdamW learning rate. AdamW moves each weight by about lr a step whatever the gradient's size, so a "
        "few hundred steps move a weight by at most ~1e-2: room to absorb the input embeddings' shift, not to drift "
        "from the base, whose own outputs are the target",
    )
    generated_fraction: float = option(0.5, "share of the windows sampled from the original model (pure sampling)")
    seed: int = option(0, "seed for the order of the windows, the prompts and the sampling")

    def __post_init__(self) -> None:
        check(self.minutes > 0 and math.isfinite(self.minutes), "repair minutes must be a positive number")
        check(self.max_steps is None or self.max_steps >= 1, "repair max_steps must be None or >= 1")
        check(self.batch_size >= 1, "repair batch_size must be >= 1")
        check(self.seq_len > PROMPT_TOKENS + 1, f"repair seq_len must exceed {PROMPT_TOKENS + 1} tokens")
        check(self.lr > 0, "repair lr must be > 0")
        check(0 <= self.generated_fraction <= 1, "repair generated_fraction must be in [0, 1]")


def require_retied(model: PreTrainedModel, tied_head: str) -> None:
    """Refuse a repair that has nothing to repair: an untied model, or a tied one exported with ``untie``."""
    if not is_tied(model):
        raise RepairError(
            f"the backbone repair is for re-tied releases; this {type(model).__name__} does not tie lm_head to its "
            "input embeddings, so watermarking leaves its backbone as it is"
        )
    if tied_head != "retie":
        raise RepairError(f"the backbone repair is for re-tied releases (tied_head 'retie'), not {tied_head!r}")


def _check_pair(release: PreTrainedModel, original: PreTrainedModel) -> None:
    require_retied(release, "retie")
    mine, base = release.state_dict(), original.state_dict()
    shapes = {n: tuple(t.shape) for n, t in mine.items()}
    if shapes != {n: tuple(t.shape) for n, t in base.items()}:
        raise RepairError("the release and the original model differ in their weights' names or shapes")
    if torch.equal(head(release).weight, head(original).weight.to(head(release).weight.dtype)):
        raise RepairError("the release's lm_head is the original's: it carries no watermark to repair around")


def _kl(log_p0: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(p0 || softmax(logits)); both (..., V)."""
    log_q = torch.log_softmax(logits.float(), dim=-1)
    return F.kl_div(log_q.flatten(0, -2), log_p0.flatten(0, -2), log_target=True, reduction="batchmean")


def _head(model: PreTrainedModel) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The head's weight and bias (None without one), detached fp32."""
    bias = getattr(head(model), "bias", None)
    return head(model).weight.detach().float(), bias.detach().float() if bias is not None else None


def _original_logp(original: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(original(input_ids=ids, use_cache=False).logits.float(), dim=-1)


def _hidden(release: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
    return release.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state


@torch.no_grad()
def window_kl(
    release: PreTrainedModel, original: PreTrainedModel, windows: torch.Tensor, batch_size: int = 8
) -> dict[str, float]:
    """Mean token KL from the original model on ``windows`` (N, T): ``unseen`` KL(p0 || softmax(U h~ + b)), the
    cost the detector does not see, and ``release`` KL(p0 || softmax(U~ h~ + b)), the release's whole cost."""
    (U, bias), (U_wm, bias_wm) = _head(original), _head(release)
    totals, n = {"unseen": 0.0, "release": 0.0}, 0
    device = model_device(release)
    for start in range(0, len(windows), batch_size):
        ids = windows[start : start + batch_size].to(device)
        log_p0 = _original_logp(original, ids)
        h = _hidden(release, ids).float()
        tokens = ids.numel()
        totals["unseen"] += float(_kl(log_p0, F.linear(h, U, bias))) * tokens
        totals["release"] += float(_kl(log_p0, F.linear(h, U_wm, bias_wm))) * tokens
        n += tokens
    return {k: v / max(n, 1) for k, v in totals.items()}


def repair_backbone(
    release: PreTrainedModel,
    original: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    documents: list[Document],
    cfg: RepairConfig | None = None,
    progress: bool = True,
) -> dict:
    """Train ``release``'s decoder (not its tied U~) in place towards ``original``'s outputs; return a report.

    ``release`` is a re-tied watermarked model, ``original`` its unwatermarked base (left unchanged). Stops at
    ``cfg.minutes`` of wall-clock time or ``cfg.max_steps`` steps, whichever comes first. Store the report in the
    key as ``key.meta["repair"]`` (``openstamp embed --repair-minutes`` does): the key then tells detectors that only
    the release holds its backbone.
    """
    cfg = cfg or RepairConfig()
    _check_pair(release, original)
    started = time.monotonic()
    device = model_device(release)
    windows = document_windows(tokenizer, documents, cfg.seq_len)
    order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(cfg.seed))
    n_held = min(2 * cfg.batch_size, len(windows) // 5)  # windows kept out of training, for the report
    heldout, train = windows[order[:n_held]], windows[order[n_held:]]
    prompt_order = torch.randperm(len(train), generator=torch.Generator().manual_seed(cfg.seed + 1)).tolist()
    prefix = bos_prefix(tokenizer)
    new_tokens = cfg.seq_len - len(prefix) - PROMPT_TOKENS

    frozen = release.get_input_embeddings().weight  # U~, also lm_head's weight
    params = [p for p in release.get_decoder().parameters() if p is not frozen]
    trainable = {p: p.requires_grad for p in release.parameters()}
    U, bias = _head(original)
    before = window_kl(release, original, heldout, cfg.batch_size) if n_held else None

    losses: list[float] = []
    n_doc = n_gen = 0
    bar = tqdm(total=cfg.max_steps, desc="repairing backbone", unit="step", disable=not progress)
    try:
        release.requires_grad_(False)
        for p in params:
            p.requires_grad_(True)
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        while True:
            step, elapsed = len(losses), time.monotonic() - started
            done = max(elapsed / (60 * cfg.minutes), step / cfg.max_steps if cfg.max_steps else 0.0)
            if done >= 1 and losses:  # at least one step, however short the budget
                break
            # exact share of sampled windows over the run: this step's is the growth of the rounded running total
            gen = round((step + 1) * cfg.batch_size * cfg.generated_fraction)
            gen -= round(step * cfg.batch_size * cfg.generated_fraction)
            rows = [train[(n_doc + i) % len(train)] for i in range(cfg.batch_size - gen)]
            if gen:
                prompts = [
                    train[prompt_order[(n_gen + i) % len(train)], len(prefix) : len(prefix) + PROMPT_TOKENS].tolist()
                    for i in range(gen)
                ]
                sampled = sample_completions(
                    original, tokenizer, prompts, new_tokens, seed=cfg.seed * 1_000_003 + step, progress=False
                )
                rows += [torch.tensor(prefix + p + s, dtype=torch.long) for p, s in zip(prompts, sampled, strict=True)]
            n_doc, n_gen = n_doc + cfg.batch_size - gen, n_gen + gen
            ids = torch.stack(rows).to(device)
            for group in optimizer.param_groups:
                group["lr"] = cfg.lr * min(1.0, (step + 1) / WARMUP_STEPS) * 0.5 * (1 + math.cos(math.pi * done))
            loss = _kl(_original_logp(original, ids), F.linear(_hidden(release, ids).float(), U, bias))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            losses.append(float(loss.detach()))
            if not math.isfinite(losses[-1]):
                raise RepairError(f"the repair's loss is {losses[-1]} at step {step}; lower its lr")
            optimizer.step()
            bar.update(1)
            bar.set_postfix(kl=f"{losses[-1]:.4f}")
    finally:
        bar.close()
        for p, flag in trainable.items():
            p.requires_grad_(flag)
    after = window_kl(release, original, heldout, cfg.batch_size) if n_held else None
    return {
        "objective": "KL(p0 || softmax(U h~ + b)); U~ fixed, decoder layers and final norm trained",
        "steps": len(losses),
        "seconds": round(time.monotonic() - started, 1),
        "kl_initial": _mean(losses[:LAST]),
        "kl_final": _mean(losses[-LAST:]),
        "n_windows_heldin": n_doc,
        "n_windows_generated": n_gen,
        "heldout": {
            "n_windows": n_held,
            "unseen_kl_before": before["unseen"] if before else None,
            "unseen_kl_after": after["unseen"] if after else None,
            "release_kl_before": before["release"] if before else None,
            "release_kl_after": after["release"] if after else None,
        },
        "settings": dataclasses.asdict(cfg),
    }


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
