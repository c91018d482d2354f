"""The training loop the fine-tuning attacks share: windows, trainable weights, optimizer, checkpoints.

``train`` is causal-LM training on a tensor of token windows (N, T). Labels default to the
windows themselves; a labels tensor with -100 on the prompt and padding trains on the response
tokens only (instruction tuning). Sequences are right-padded, so a causal model never attends
to the padding of the tokens it is trained on, and no attention mask is needed. A ``loss_fn``
replaces the LM loss (the kgw-distilled baseline trains on KL(teacher || student) with it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedModel

from openstamp.config import check, option
from openstamp.model.load import model_device
from openstamp.model.patch import head, untie
from openstamp.model.text import document_windows

MODES = ("lora", "full", "head")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """What every training attack shares; the attacks add their data settings."""

    mode: str = option("lora", "lora (the paper's attack), full (every weight) or head (lm_head only)")
    steps: int = option(300, "optimizer steps (the paper: 2,500)")
    every: int = option(50, "generate and detect after every this many steps (the paper: 500)")
    batch_size: int = option(4, "sequences per step (the paper: 48)")
    seq_len: int = option(128, "tokens per sequence (the paper: 512)")
    lr: float = option(1e-4, "peak learning rate (the paper: 2e-5 over 60M tokens)")
    optimizer: str = option("adafactor", "adafactor (the paper's) or adamw")
    warmup_fraction: float = option(0.2, "fraction of the steps with a linear warm-up (the paper: 500 / 2,500)")
    lora_r: int = option(16, "LoRA rank")
    lora_alpha: int = option(32, "LoRA scaling factor alpha")
    lora_dropout: float = option(0.1, "LoRA dropout")
    n: int = option(64, "eval prompts completed and scored at each checkpoint")
    seed: int = option(0, "seed for the order of the training windows and for dropout")
    methods: tuple[str, ...] | None = option(None, "methods to attack (default: every weight-level method of the run)")

    def __post_init__(self) -> None:
        check(self.mode in MODES, f"mode must be one of {MODES}")
        check(self.steps >= 1 and 1 <= self.every <= self.steps, "need steps >= 1 and 1 <= every <= steps")
        check(self.batch_size >= 1 and self.seq_len >= 8, "need batch_size >= 1 and seq_len >= 8")
        check(self.lr > 0 and 0 <= self.warmup_fraction < 1, "need lr > 0 and warmup_fraction in [0, 1)")
        check(self.optimizer in ("adafactor", "adamw"), "optimizer must be adafactor or adamw")
        check(self.lora_r >= 1 and 0 <= self.lora_dropout < 1, "need lora_r >= 1 and lora_dropout in [0, 1)")
        check(self.n >= 2, "n must be >= 2")

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.seq_len

    def checkpoints(self) -> list[int]:
        return sorted({0, *range(self.every, self.steps + 1, self.every), self.steps})


training_windows = document_windows  # the product's windows: the attacks and distillation train on the same


def lora_targets(model: PreTrainedModel) -> list[str]:
    """Names of the linear layers inside the decoder blocks, plus the unembedding's name."""
    names = {
        name.rsplit(".", 1)[-1]
        for name, module in model.get_decoder().layers.named_modules()
        if isinstance(module, torch.nn.Linear)
    }
    names.add(next(name for name, module in model.named_modules() if module is head(model)))
    return sorted(names)


def prepare(model: PreTrainedModel, cfg: TrainConfig) -> PreTrainedModel:
    """Make the weights of ``cfg.mode`` trainable; LoRA wraps the model with peft (rank, alpha, dropout)."""
    if cfg.mode == "lora":
        from peft import LoraConfig, get_peft_model

        model.requires_grad_(False)
        lora = LoraConfig(
            r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout, target_modules=lora_targets(model)
        )
        return get_peft_model(model, lora)
    if cfg.mode == "head":
        untie(model)
        model.requires_grad_(False)
        head(model).requires_grad_(True)  # its weight, and its bias where it has one
        return model
    return model.requires_grad_(True)


def _optimizer(params: list[torch.nn.Parameter], cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
    from transformers.optimization import Adafactor  # optional: imports peft and bitsandbytes where installed

    return Adafactor(params, lr=cfg.lr, scale_parameter=False, relative_step=False, warmup_init=False)


def train(
    model: PreTrainedModel,
    windows: torch.Tensor,
    cfg: TrainConfig,
    on_checkpoint: Callable[[int, float], None] | None = None,
    labels: torch.Tensor | None = None,
    loss_fn: Callable[[PreTrainedModel, torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    desc: str = "training",
    progress: bool = True,
) -> list[float]:
    """Causal-LM training on ``windows`` (N, T) for ``cfg.steps`` steps; returns the per-step losses.

    ``labels`` (N, T), -100 where no loss is taken, default to the windows. ``loss_fn(model, ids,
    labels)`` (ids and labels long (B, T) on the model's device) -> scalar loss replaces the
    causal-LM loss. ``on_checkpoint(step,
    mean loss since the last checkpoint)`` runs at step 0 and at every checkpoint with the model
    in eval mode; the RNG state is restored around it, so training does not depend on what the
    callback does (a resumed run replays the same steps). A progress bar titled ``desc`` shows the
    steps and the latest loss unless ``progress`` is false.
    """
    from transformers import get_cosine_schedule_with_warmup  # optional: imports peft, bitsandbytes if installed

    labels = windows if labels is None else labels
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = _optimizer(params, cfg)
    schedule = get_cosine_schedule_with_warmup(optimizer, int(cfg.warmup_fraction * cfg.steps), cfg.steps)
    generator = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    order = torch.empty(0, dtype=torch.long)
    device, losses, checkpoints = model_device(model), [], set(cfg.checkpoints())

    def checkpoint(step: int) -> None:
        if on_checkpoint is not None and step in checkpoints:
            model.eval()
            state = torch.get_rng_state()
            recent = losses[-cfg.every :] if losses else [float("nan")]
            on_checkpoint(step, float(np.mean(recent)))
            torch.set_rng_state(state)

    checkpoint(0)
    bar = tqdm(range(1, cfg.steps + 1), desc=desc, unit="step", disable=not progress)
    for step in bar:
        while len(order) < cfg.batch_size:
            order = torch.cat([order, torch.randperm(len(windows), generator=generator)])
        chosen, order = order[: cfg.batch_size], order[cfg.batch_size :]
        model.train()
        ids, targets = windows[chosen].to(device), labels[chosen].to(device)
        loss = model(input_ids=ids, labels=targets).loss if loss_fn is None else loss_fn(model, ids, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
        checkpoint(step)
    model.eval()
    return losses


@torch.inference_mode()
def perplexity(model: PreTrainedModel, windows: torch.Tensor, batch: int = 8) -> float:
    """exp(mean next-token NLL) of the model on full windows (N, T): the attacks' quality measure."""
    device, total, count = model_device(model), 0.0, 0
    for start in range(0, len(windows), batch):
        ids = windows[start : start + batch].to(device)
        logits = model(input_ids=ids).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="sum"
        )
        total, count = total + float(nll), count + ids[:, 1:].numel()
    return math.exp(total / count)
