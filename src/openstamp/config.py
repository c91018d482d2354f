"""Frozen, validated settings for building a watermark key.

Every field carries help text in its metadata; profiles ship as package data
(``configs/profiles/*.json``) and any field can be overridden by dotted name,
e.g. ``{"projection.lr": 1e-4}``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any


def option(default: Any, text: str) -> Any:
    """A dataclass field with help text (the CLI and the docs show it)."""
    return field(default=default, metadata={"help": text})


def check(condition: bool, message: str) -> None:
    """Validation in ``__post_init__``: raise ValueError with ``message`` unless ``condition``."""
    if not condition:
        raise ValueError(message)


@dataclass(frozen=True, kw_only=True)
class StatesConfig:
    """Where hidden states are sampled: one forward pass per window gives all of its prefixes."""

    n_states: int = option(24576, "hidden states sampled from the corpus (k-means and ridge use all of them)")
    window_tokens: int = option(256, "tokens per document window; one forward pass per window")
    positions_per_window: int = option(64, "token positions sampled in each window")
    min_context: int = option(16, "earliest position sampled in a window, so every prefix has some context")
    context_tokens: int = option(64, "last tokens of each prefix kept as its text, the projection target")
    batch_size: int = option(8, "windows per forward pass")
    seed: int = option(0, "seed for choosing windows and positions")

    def __post_init__(self) -> None:
        check(self.n_states > 0, "states.n_states must be positive")
        check(self.window_tokens > self.min_context >= 0, "need 0 <= states.min_context < window_tokens")
        check(
            0 < self.positions_per_window <= self.window_tokens - self.min_context,
            "states.positions_per_window must fit between min_context and window_tokens",
        )
        check(self.context_tokens > 0 and self.batch_size > 0, "context_tokens and batch_size must be > 0")


@dataclass(frozen=True, kw_only=True)
class ProjectionConfig:
    """P: aligns hidden states with sentence embeddings of their prefixes (paper eq. 2)."""

    enabled: bool = option(True, "train P; False gives the paper's 'w/o sem-align' ablation (P = I)")
    embedder: str = option("minilm", "sentence-transformers model for targets: 'minilm' (packaged), a name or path")
    n_states: int = option(6144, "states (a subset of the sampled ones) used to train P")
    temperature: float = option(0.1, "T_sim of the similarity softmax")
    lr: float = option(1e-3, "AdamW learning rate")
    weight_decay: float = option(1e-2, "AdamW weight decay")
    epochs: int = option(8, "passes over the training states")
    batch_size: int = option(256, "in-batch similarity size |B|")
    heldout_fraction: float = option(0.1, "states held out to report the alignment loss")
    seed: int = option(0, "seed for batching")

    def __post_init__(self) -> None:
        check(self.temperature > 0, "projection.temperature must be > 0")
        check(self.lr > 0 and self.weight_decay >= 0, "projection.lr must be > 0, weight_decay >= 0")
        check(self.epochs > 0 and self.batch_size >= 4, "projection.epochs > 0 and batch_size >= 4")
        check(self.n_states >= 16, "projection.n_states must be >= 16")
        check(0 < self.heldout_fraction < 0.5, "projection.heldout_fraction must be in (0, 0.5)")


@dataclass(frozen=True, kw_only=True)
class SelectorConfig:
    """S: ridge regression onto k-means clusters of the projected states."""

    n_lists: int = option(254, "L, the number of k-means clusters and green lists")
    min_cluster_size: int = option(10, "clusters with fewer training states are dropped")
    ridge_lambda: float = option(1e-3, "lambda of the closed-form ridge regression (its floor when shrinkage > 0)")
    shrinkage: float = option(0.0, "f: ridge lambda = max(f * tr(Z^T Z) / d, ridge_lambda) over the fitted states")
    rescale: bool = option(True, "scale rows so the winning selector value averages 1 on its own cluster")
    heldout_fraction: float = option(0.1, "states held out to report accuracy and effective strength")
    kmeans_max_iter: int = option(100, "k-means iterations")
    kmeans: str = option("auto", "k-means: auto (torch on a GPU, else scikit-learn), torch or sklearn")
    seed: int = option(0, "k-means seed")

    def __post_init__(self) -> None:
        check(self.n_lists >= 2, "selector.n_lists must be >= 2")
        check(self.min_cluster_size >= 1, "selector.min_cluster_size must be >= 1")
        check(self.ridge_lambda > 0, "selector.ridge_lambda must be > 0")
        check(self.shrinkage >= 0, "selector.shrinkage must be >= 0")
        check(0 < self.heldout_fraction < 0.5, "selector.heldout_fraction must be in (0, 0.5)")
        check(self.kmeans in ("auto", "torch", "sklearn"), "selector.kmeans must be auto, torch or sklearn")


@dataclass(frozen=True, kw_only=True)
class GreenConfig:
    """G: L keyed green lists, as in KGW."""

    gamma: float = option(0.25, "fraction of the vocabulary in each green list")
    delta: float = option(1.0, "logit boost of a green token under a one-hot selector")

    def __post_init__(self) -> None:
        check(0 < self.gamma < 1, "green.gamma must be in (0, 1)")
        check(self.delta > 0, "green.delta must be > 0")


@dataclass(frozen=True, kw_only=True)
class EmbedConfig:
    """Everything that decides a key, apart from the secret and the corpus."""

    profile: str = option("default", "name of the profile these settings started from")
    states: StatesConfig = field(default_factory=StatesConfig)
    projection: ProjectionConfig = field(default_factory=ProjectionConfig)
    selector: SelectorConfig = field(default_factory=SelectorConfig)
    green: GreenConfig = field(default_factory=GreenConfig)

    def __post_init__(self) -> None:
        check(
            self.projection.n_states <= self.states.n_states or not self.projection.enabled,
            "projection.n_states cannot exceed states.n_states",
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmbedConfig:
        sections = {f.name: f.type for f in dataclasses.fields(cls)}
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            if name not in sections:
                raise ValueError(f"unknown config section {name!r}; known: {sorted(sections)}")
            if isinstance(value, dict):
                section_cls = _SECTIONS[name]
                _reject_unknown(section_cls, value, name)
                kwargs[name] = section_cls(**value)
            else:
                kwargs[name] = value
        return cls(**kwargs)

    def with_overrides(self, overrides: dict[str, Any]) -> EmbedConfig:
        """Return a copy with dotted fields replaced, e.g. ``{"green.delta": 1.5}``."""
        data = self.to_dict()
        for dotted, value in overrides.items():
            if value is None:
                continue
            section, _, name = dotted.partition(".")
            if section not in data or not isinstance(data[section], dict) or name not in data[section]:
                raise ValueError(f"unknown setting {dotted!r}")
            data[section][name] = value
        return EmbedConfig.from_dict(data)


_SECTIONS = {
    "states": StatesConfig,
    "projection": ProjectionConfig,
    "selector": SelectorConfig,
    "green": GreenConfig,
}


def _reject_unknown(section_cls: type, values: dict[str, Any], section: str) -> None:
    known = {f.name for f in dataclasses.fields(section_cls)}
    unknown = set(values) - known
    if unknown:
        raise ValueError(f"unknown setting(s) in {section}: {sorted(unknown)}")


def profile_names() -> list[str]:
    folder = resources.files("openstamp") / "configs" / "profiles"
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def load_profile(name: str) -> EmbedConfig:
    """Load a packaged profile (``default``, ``paper``, ``small``)."""
    if name not in profile_names():
        raise ValueError(f"unknown profile {name!r}; choose one of {profile_names()}")
    text = (resources.files("openstamp") / "configs" / "profiles" / f"{name}.json").read_text()
    data = json.loads(text)
    data["profile"] = name
    return EmbedConfig.from_dict(data)


@dataclass(frozen=True, kw_only=True)
class DetectConfig:
    """How texts are scored and flagged."""

    alpha: float = option(0.01, "false-positive rate of the decision (p-value <= alpha)")
    threshold: float | None = option(None, "flag when the mean LLR exceeds this, instead of using the p-value")
    calibrated: bool = option(False, "flag with the key's calibrated LLR threshold for alpha (openstamp calibrate)")
    p_values: bool = option(True, "compute the permutation p-value (one more |V| x L product per token)")
    n_permutations: int = option(999, "permutations of the list assignment; p-values are >= 1 / (K + 1)")
    min_tokens: int = option(16, "texts with fewer scored tokens are reported as too short, without a score")
    max_tokens: int = option(2048, "longer inputs are truncated to this many tokens (prompt first)")
    batch_size: int = option(16, "texts per forward pass")
    chunk_tokens: int = option(512, "tokens per head computation")
    vocab_block: int = option(2048, "vocabulary rows per block; memory is bounded by chunk_tokens x vocab_block")
    centring_top_k: int | None = option(
        None, "None: centre the statistic with the exact green mass over the whole vocabulary; k: top-k estimate"
    )
    tail_bound: bool = option(
        True, "below the permutation floor 1/(K+1), report the Chernoff tail bound over random keys (down to 1e-12)"
    )
    padding_side: str = option("right", "right or left; scores do not depend on it")
    check_key: bool = option(True, "refuse a key whose recorded lm_head fingerprint does not match the model")

    def __post_init__(self) -> None:
        check(0 < self.alpha < 1, "alpha must be in (0, 1)")
        check(
            not (self.threshold is not None and self.calibrated),
            "use either threshold or calibrated, not both",
        )
        check(self.n_permutations >= 1, "n_permutations must be >= 1")
        check(self.min_tokens >= 1 and self.max_tokens > self.min_tokens, "need 1 <= min_tokens < max_tokens")
        check(
            min(self.batch_size, self.chunk_tokens, self.vocab_block) >= 1,
            "batch and block sizes must be >= 1",
        )
        check(self.centring_top_k is None or self.centring_top_k >= 1, "centring_top_k must be None or >= 1")
        check(self.padding_side in ("left", "right"), "padding_side must be left or right")
        check(
            not (self.p_values and self.n_permutations < 1 / self.alpha - 1),
            f"{self.n_permutations} permutations cannot give p-values as small as alpha={self.alpha}",
        )


ORACLE_DTYPES = ("fast", "float32", "bfloat16", "float16")  # fast: models.fast_dtype(device)
# EvalConfig fields added since, at the value earlier runs had
RECORDED_BEFORE = {"score_dtype": "float32", "sample_dtype": "float32", "own_ppl_dtype": "float32"}
# EvalConfig dtype fields that an eval records as resolved ('fast' -> the dtype this device computes natively)
RESOLVED_DTYPES = ("score_dtype", "sample_dtype", "own_ppl_dtype")


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """The paper's detection-vs-quality protocol (Evaluation protocol section, Table 1, Figure 2)."""

    model: str = option("smollm2-135m", "model to watermark (hub id, local directory or packaged alias)")
    methods: tuple[str, ...] = option((), "methods to compare (empty: every method in openstamp.methods.REGISTRY)")
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
    batch_size: int = option(100, "generation batch (larger batches sample faster: benchmarks/generate_speed.py)")
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
        _reject_unknown(cls, data, "eval config")
        data = dict(data)
        for name in ("methods", "seeds", "lengths", "downstream"):
            if name in data and isinstance(data[name], str):
                data[name] = [v.strip() for v in data[name].split(",") if v.strip()]
            if name in data:
                data[name] = tuple(int(v) if name in ("seeds", "lengths") else v for v in data[name])
        return cls(**data)

    @classmethod
    def recorded(cls, data: dict[str, Any]) -> dict[str, Any]:
        """A config a run recorded, with every field: one added since takes the value such runs had
        (``RECORDED_BEFORE``), else its default."""
        return {**cls().to_dict(), **RECORDED_BEFORE, **data}

    @classmethod
    def from_file(cls, path: str) -> EvalConfig:
        """Read a YAML or JSON file of EvalConfig fields."""
        import yaml

        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path} must hold a mapping of settings")
        return cls.from_dict(data)
