"""The evaluation's settings: the paper's detection-vs-quality protocol, frozen and validated like the key's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import yaml

from openstamp.config import check, option, reject_unknown

ORACLE_DTYPES = ("fast", "float32", "bfloat16", "float16")  # fast: models.fast_dtype(device)
# EvalConfig fields added since, at the value earlier runs had
RECORDED_BEFORE = {"score_dtype": "float32", "sample_dtype": "float32", "own_ppl_dtype": "float32", "method_names": 2}
# EvalConfig dtype fields that an eval records as resolved ('fast' -> the dtype this device computes natively)
RESOLVED_DTYPES = ("score_dtype", "sample_dtype", "own_ppl_dtype")


def renamed(data: dict[str, Any]) -> dict[str, Any]:
    """Settings with a method's old name (``ALIASES``: ``openstamp-nosem``) given as its name now."""
    from openstamp.lab.methods.base import ALIASES

    now = lambda name: ALIASES.get(name, name)  # noqa: E731
    data = dict(data)
    if "methods" in data:
        data["methods"] = tuple(now(m) for m in data["methods"])
    for field_name in ("grids", "strengths", "method_settings"):
        if isinstance(data.get(field_name), dict):
            data[field_name] = {now(k): v for k, v in data[field_name].items()}
    return data


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """The paper's detection-vs-quality protocol (Evaluation protocol section, Table 1, Figure 2)."""

    model: str = option("smollm2-135m", "model to watermark (hub id, local directory or packaged alias)")
    methods: tuple[str, ...] = option((), "methods to compare (empty: every method in openstamp.lab.methods.REGISTRY)")
    method_names: int = option(3, "the names a run's methods have: 3 since 0.3.0 (openstamp is P = I; 2: before)")
    corpus: str = option("news,wikipedia", "prompt corpora, comma-separated; windows are interleaved")
    key_corpus: str = option("wikipedia", "corpus whose 'key' half builds the keys; prompts never come from it")
    n: int = option(200, "prompts (and watermarked samples) per method and seed")
    prompt_tokens: int = option(50, "tokens of real text per prompt")
    new_tokens: int = option(200, "tokens per completion (min = max new tokens) and per human continuation")
    temperature: float = option(1.0, "sampling temperature")
    top_p: float = option(1.0, "nucleus sampling; 0.9 is the quality setting")
    seeds: tuple[int, ...] = option((0,), "seeds; each builds its own keys and samples; reported as mean +- sd")
    strengths: dict = field(default_factory=dict, metadata={"help": "method -> strength (default: the method's own)"})
    sweep: bool = option(False, "run each method over its strength grid for the Pareto plot")
    grids: dict = field(default_factory=dict, metadata={"help": "method -> strength grid for the sweep"})
    method_settings: dict = field(default_factory=dict, metadata={"help": "method -> {config field: value}"})
    lengths: tuple[int, ...] = option(
        (16, 32, 64, 128), "completions also scored cut to these token counts (detection against length); () skips"
    )
    downstream: tuple[str, ...] = option(
        (), "lm-eval tasks each model is scored on: 'local' (built from the prompt corpora's held-out halves) or names"
    )
    downstream_limit: int = option(200, "items per downstream task")
    oracle: str = option("gemma3-270m", "perplexity oracle (any causal LM), or 'none' to skip perplexity")
    oracle_dtype: str = option(
        "fast", "the oracle's dtype: 'fast' is bfloat16 where the device computes it natively, else float32"
    )
    batch_size: int = option(100, "generation batch (larger batches sample faster: benchmarks/speed/generate_speed.py)")
    score_batch_size: int = option(16, "detection batch")
    score_dtype: str = option(
        "fast",
        "the detectors' decoder dtype (autocast; their statistics stay float32): 'fast' is bfloat16 where the device "
        "computes it natively, else float32; a run records the dtype it resolved to",
    )
    sample_dtype: str = option(
        "fast",
        "the dtype completions are sampled in (a copy of the watermarked model cast to it): 'fast' is bfloat16 where "
        "the device computes it natively, else float32 (the model as loaded); a run records the dtype it resolved to",
    )
    own_ppl_dtype: str = option(
        "fast",
        "the decoder dtype of the own-perplexity stage (autocast; the head and the NLL stay float32): 'fast' is "
        "bfloat16 where the device computes it natively, else float32; a run records the dtype it resolved to",
    )
    dtype: str = option("float32", "model dtype")
    device: str = option("cpu", "cpu, cuda or auto")

    def __post_init__(self) -> None:
        check(self.n >= 2 and self.prompt_tokens >= 1 and self.new_tokens >= 16, "need n >= 2, new_tokens >= 16")
        check(self.temperature >= 0 and 0 < self.top_p <= 1, "temperature >= 0 and top_p in (0, 1]")
        check(len(self.seeds) >= 1, "need at least one seed")
        check(all(n >= 1 for n in self.lengths), "lengths must be token counts >= 1")
        check(self.downstream_limit >= 2, "downstream_limit must be >= 2")
        check(self.batch_size >= 1 and self.score_batch_size >= 1, "batch sizes must be >= 1")
        for name in ("oracle_dtype", *RESOLVED_DTYPES):
            check(getattr(self, name) in ORACLE_DTYPES, f"{name} must be one of {', '.join(ORACLE_DTYPES)}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EvalConfig:
        reject_unknown(cls, data, "eval config")
        data = dict(data)
        for name in ("methods", "seeds", "lengths", "downstream"):
            if name in data and isinstance(data[name], str):
                data[name] = [v.strip() for v in data[name].split(",") if v.strip()]
            elif name in data and isinstance(data[name], int):  # --set lengths=64 reads as one number
                data[name] = [data[name]]
            if name in data:
                data[name] = tuple(int(v) if name in ("seeds", "lengths") else v for v in data[name])
        return cls(**renamed(data))

    @classmethod
    def recorded(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A config a run recorded, with every field: one added since takes the value such runs had
        (``RECORDED_BEFORE``), else its default."""
        return {**cls().to_dict(), **RECORDED_BEFORE, **data}

    @classmethod
    def from_file(cls, path: str) -> EvalConfig:
        """Read a YAML or JSON file of EvalConfig fields."""
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a mapping of settings")
        return cls.from_dict(data)
