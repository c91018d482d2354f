"""Re-initialised lm_head: throw the (watermarked) unembedding away and learn a new one.

The paper's removal attack on OpenStamp's own carrier (Results, "Reinitializing and retraining
the unembedding layer"): lm_head is untied from the input embeddings (which are kept),
re-initialised from N(0, initializer_range^2), and retrained on a corpus with the backbone frozen.
The question is how much quality the attacker gets back, measured as perplexity on held-out
documents of the same corpus against the watermarked model's own.

With the backbone frozen, the hidden states of the training and held-out windows never change,
so they are computed once; training and evaluation then only multiply them by the head.
"""

from __future__ import annotations

import io
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from openstamp.config import check, option
from openstamp.corpus import load_corpora, split_documents
from openstamp.lab.attacks.common import config_dict, prepare_out
from openstamp.lab.attacks.report import fmt, md_table, new_figure, publish, save_figure
from openstamp.lab.hidden import lab_hidden
from openstamp.lab.training import training_windows
from openstamp.model.load import load_model, model_device
from openstamp.model.patch import head, untie
from openstamp.storage import atomic_write_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ReinitConfig:
    corpus: str = option(
        "news,wikipedia", "comma-separated training text; the key halves train, the held-out halves measure perplexity"
    )
    steps: int = option(500, "optimizer steps on the new head (the paper: 2,500 and 25,000)")
    every: int = option(100, "measure held-out perplexity after every this many steps")
    batch_size: int = option(8, "windows per step")
    seq_len: int = option(128, "tokens per window")
    lr: float = option(1e-3, "peak AdamW learning rate (5% warm-up, cosine decay)")
    train_windows: int = option(0, "distinct training windows whose hidden states are cached (0: every one)")
    eval_windows: int = option(32, "held-out windows for perplexity")
    init_std: float | None = option(None, "std of the new head's entries (default: the model's initializer_range)")
    batch_forward: int = option(8, "windows per backbone forward when caching hidden states")
    seed: int = option(0, "seed for the window choice, the initialisation and the batch order")

    def __post_init__(self) -> None:
        check(self.steps >= 1 and 1 <= self.every <= self.steps, "need steps >= 1 and 1 <= every <= steps")
        check(
            min(self.batch_size, self.eval_windows, self.batch_forward) >= 1 and self.train_windows >= 0,
            "sizes must be >= 1 (train_windows >= 0)",
        )
        check(self.seq_len >= 8 and self.lr > 0, "need seq_len >= 8 and lr > 0")
        check(self.init_std is None or self.init_std > 0, "init_std must be > 0")


@torch.inference_mode()
def cached_hidden(model: PreTrainedModel, windows: torch.Tensor, batch: int, progress: bool = False) -> torch.Tensor:
    """Final hidden states of full windows: long (N, T) -> float32 (N, T, d), on the CPU."""
    device = model_device(model)
    parts = []
    for start in tqdm(range(0, len(windows), batch), desc="hidden states", disable=not progress):
        ids = windows[start : start + batch].to(device)
        parts.append(lab_hidden(model, ids, torch.ones_like(ids)).float().cpu())
    return torch.cat(parts)


def head_nll(
    hidden: torch.Tensor, ids: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, chunk: int = 1024
) -> float:
    """Mean next-token NLL of ``ids`` (N, T) given ``hidden`` (N, T, d) under the head (V, d) [+ bias (V,)]."""
    h = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    y = ids[:, 1:].reshape(-1)
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(y), chunk):
            logits = F.linear(h[start : start + chunk].to(weight), weight, bias).float()
            total += float(F.cross_entropy(logits, y[start : start + chunk].to(weight.device), reduction="sum"))
    return total / len(y)


def train_head(
    hidden: torch.Tensor,
    ids: torch.Tensor,
    init: torch.Tensor,
    cfg: ReinitConfig,
    evaluate=None,
    progress: bool = False,
    checkpoint: Path | None = None,
) -> tuple[torch.Tensor, list[dict]]:
    """Train a bias-free head from ``init`` (V, d) on cached states (N, T, d) and ids (N, T).

    ``evaluate(weight) -> dict`` runs at step 0 and every ``cfg.every`` steps; its results,
    with the step, tokens seen and recent training loss, form the returned history. With a
    ``checkpoint`` path the whole training state (head, optimizer, schedule, batch order, random
    generator, history) is written there at each of those steps, and a run that finds one goes on
    from it: a killed run resumes and ends with the weights an uninterrupted one has.
    """
    from transformers import get_cosine_schedule_with_warmup  # optional: imports peft, bitsandbytes if installed

    weight = torch.nn.Parameter(init.clone())
    optimizer = torch.optim.AdamW([weight], lr=cfg.lr, weight_decay=0.0)
    schedule = get_cosine_schedule_with_warmup(optimizer, int(0.05 * cfg.steps), cfg.steps)
    generator = torch.Generator().manual_seed(cfg.seed)
    history, losses, order, done = [], [], torch.empty(0, dtype=torch.long), 0

    def record(step: int) -> None:
        recent = losses[-cfg.every :]
        entry = {"step": step, "tokens": step * cfg.batch_size * cfg.seq_len}
        entry["train_loss"] = sum(recent) / len(recent) if recent else None
        history.append({**entry, **(evaluate(weight.detach()) if evaluate else {})})
        if checkpoint is not None:
            state = {"step": step, "weight": weight.detach(), "optimizer": optimizer.state_dict()}
            state |= {"schedule": schedule.state_dict(), "generator": generator.get_state(), "order": order}
            buffer = io.BytesIO()
            torch.save({**state, "history": history, "losses": losses[-cfg.every :]}, buffer)
            atomic_write_bytes(checkpoint, buffer.getvalue())

    if checkpoint is not None and checkpoint.exists():
        try:
            state = torch.load(checkpoint, weights_only=True)
        except Exception as err:  # a truncated or foreign file
            raise ValueError(
                f"training state {checkpoint} is unreadable ({err}); delete it to train from the start"
            ) from err
        if tuple(state["weight"].shape) != tuple(init.shape):
            raise ValueError(
                f"{checkpoint} holds a head of shape {tuple(state['weight'].shape)}, not {tuple(init.shape)}"
            )
        with torch.no_grad():
            weight.copy_(state["weight"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        generator.set_state(state["generator"])
        order, history, losses, done = state["order"], state["history"], state["losses"], state["step"]
    else:
        record(0)
    for step in tqdm(range(done + 1, cfg.steps + 1), desc="training lm_head", disable=not progress, initial=done):
        while len(order) < cfg.batch_size:
            order = torch.cat([order, torch.randperm(len(ids), generator=generator)])
        batch, order = order[: cfg.batch_size], order[cfg.batch_size :]
        h = hidden[batch, :-1].reshape(-1, hidden.shape[-1]).to(weight)
        loss = F.cross_entropy(h @ weight.T, ids[batch, 1:].reshape(-1).to(weight.device))
        loss.backward()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if step % cfg.every == 0 or step == cfg.steps:
            record(step)
    return weight.detach(), history


@torch.no_grad()
def install_head(model: PreTrainedModel, weight: torch.Tensor) -> None:
    """Untie lm_head (the input embeddings stay as they are) and give it ``weight`` and no bias."""
    untie(model)
    out = head(model)
    out.weight = torch.nn.Parameter(weight.to(out.weight), requires_grad=False)
    if getattr(out, "bias", None) is not None:
        out.bias = None


def run_reinit(
    model_spec: str,
    out: Path,
    cfg: ReinitConfig,
    eval_dir: Path | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    progress: bool = True,
) -> dict:
    """Measure held-out perplexity of the model, of a re-initialised head, and as the new head trains."""
    prepare_out(out, {"model": model_spec, **config_dict(cfg)})
    model, tokenizer = load_model(model_spec, dtype=dtype, device=device)
    docs = load_corpora(cfg.corpus)
    generator = torch.Generator().manual_seed(cfg.seed)

    def sample(part: str, count: int) -> torch.Tensor:
        windows = training_windows(tokenizer, split_documents(docs, part), cfg.seq_len)
        return windows[torch.randperm(len(windows), generator=generator)[: count or len(windows)]]

    train_ids, held_ids = sample("key", cfg.train_windows), sample("heldout", cfg.eval_windows)
    if progress:
        log.info("caching hidden states of %d + %d windows", len(train_ids), len(held_ids))
    train_h = cached_hidden(model, train_ids, cfg.batch_forward, progress)
    held_h = cached_hidden(model, held_ids, cfg.batch_forward, progress)
    old = head(model)
    baseline = math.exp(head_nll(held_h, held_ids, old.weight.detach().float(), _float(getattr(old, "bias", None))))
    std = cfg.init_std or float(getattr(model.config.get_text_config(), "initializer_range", 0.02))
    init = torch.randn(old.weight.shape, generator=generator) * std

    def evaluate(weight: torch.Tensor) -> dict:
        return {"ppl": math.exp(head_nll(held_h, held_ids, weight))}

    weight, history = train_head(train_h, train_ids, init, cfg, evaluate, progress, out / "training_state.pt")
    install_head(model, weight)
    results = {
        "settings": config_dict(cfg),
        "model": model_spec,
        "baseline_ppl": baseline,
        "init_std": std,
        "train_tokens_distinct": int(train_ids.numel()),
        "heldout_tokens": int(held_ids.numel()),
        "history": history,
        "epochs": cfg.steps * cfg.batch_size / len(train_ids),
        **plateau(history, baseline),
    }
    body = _section(model_spec, cfg, results)
    plot = _plot(results, out / "reinit_ppl.png")
    publish(out, "reinit-head", "re-initialised and retrained lm_head", body, [plot], results, eval_dir)
    return results


def plateau(history: list[dict], baseline: float, tolerance: float = 0.02) -> dict:
    """Where training stops paying: the first checkpoint within ``tolerance`` of the last one's perplexity.

    Also the last perplexity against the watermarked model's (``final_over_baseline``) and the
    relative gain over the last interval, which says whether it had flattened by the end.
    """
    trained = [h for h in history if h["step"] > 0]
    if not trained:
        return {}
    last = trained[-1]["ppl"]
    first = next(h for h in trained if h["ppl"] <= last * (1 + tolerance))
    gain = (trained[-2]["ppl"] - last) / trained[-2]["ppl"] if len(trained) > 1 else None
    return {
        "plateau_step": first["step"],
        "plateau_ppl": first["ppl"],
        "plateau_tolerance": tolerance,
        "final_over_baseline": last / baseline,
        "last_interval_gain": gain,
    }


def _float(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.detach().float()


def _section(model_spec: str, cfg: ReinitConfig, results: dict) -> list[str]:
    rows = [["Watermarked baseline", "-", fmt(results["baseline_ppl"], 1)]]
    for h in results["history"]:
        label = "Re-initialised (no training)" if h["step"] == 0 else f"After {h['step']:,} steps"
        rows.append([label, f"{h['tokens']:,}", fmt(h["ppl"], 1)])
    return [
        f"lm_head of `{model_spec}` was untied from the input embeddings (kept), re-initialised from "
        f"N(0, {results['init_std']:g}²) without a bias, and retrained alone with the backbone frozen on "
        f"`{cfg.corpus}` (key halves; {results['train_tokens_distinct']:,} distinct tokens in "
        f"{results['train_tokens_distinct'] // cfg.seq_len:,} windows of {cfg.seq_len}, "
        f"{results['epochs']:.2f} epochs, "
        f"batch {cfg.batch_size}, AdamW at peak learning rate {cfg.lr:g} with 5% warm-up "
        f"and cosine decay). Perplexity is measured on {results['heldout_tokens']:,} tokens of the corpus's held-out "
        "half (the paper: 2,500 steps = 80M tokens and 25,000 steps = 800M tokens on FineWeb).",
        "",
        *md_table(["condition", "tokens seen", "held-out PPL"], rows),
        *_plateau_text(results),
    ]


def _plateau_text(results: dict) -> list[str]:
    if "plateau_step" not in results:
        return []
    gain = results["last_interval_gain"]
    return [
        "",
        f"Perplexity was within {results['plateau_tolerance']:.0%} of its final value from step "
        f"{results['plateau_step']:,} on; the final value is {results['final_over_baseline']:.2f}x the watermarked "
        f"model's" + (f", and the last interval still gained {gain:.1%}." if gain is not None else "."),
    ]


def _plot(results: dict, path: Path) -> Path:
    fig, ax = new_figure(5.5, 3.8)
    steps = [h["step"] for h in results["history"]]
    ax.plot(steps, [h["ppl"] for h in results["history"]], "o-", label="re-initialised head")
    ax.axhline(results["baseline_ppl"], color="k", ls=":", label="watermarked baseline")
    ax.set(yscale="log", xlabel="head training steps", ylabel="held-out perplexity", title="re-initialised lm_head")
    ax.legend(fontsize=8)
    return save_figure(fig, path)
