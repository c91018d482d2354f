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
    generated_windows: int = option(
        0, "windows of text sampled from the model itself (after 16 corpus tokens), added to the corpus's windows"
    )

    def __post_init__(self) -> None:
        check(self.n_states > 0, "states.n_states must be positive")
        check(self.generated_windows >= 0, "states.generated_windows must be >= 0")
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
    consistency: float = option(
        0.0, "c: weight of the context-consistency penalty mu ||S dZ||^2 (mu = c N / M; 0: the plain ridge)"
    )
    consistency_cut: int = option(32, "tokens cut from the front of a window for the consistency penalty's states")
    consistency_windows: int = option(64, "windows run a second time, cut, for the consistency penalty")
    fisher: float = option(
        0.0,
        "c: weight of the input-side Fisher penalty nu tr(S F S^T), F the input embeddings' empirical Fisher (a "
        "re-tied release's unseen cost); nu = c tr(Z^T Z) / tr(M F), so at 1 it weighs as much as the states",
    )
    fisher_windows: int = option(32, "windows whose input-embedding gradients estimate F for the Fisher penalty")
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
        check(self.consistency >= 0, "selector.consistency must be >= 0")
        check(self.fisher >= 0 and self.fisher_windows >= 1, "selector.fisher must be >= 0, fisher_windows >= 1")
        check(self.consistency_cut >= 1 and self.consistency_windows >= 1, "selector.consistency_* must be >= 1")
        check(0 < self.heldout_fraction < 0.5, "selector.heldout_fraction must be in (0, 0.5)")
        check(self.kmeans in ("auto", "torch", "sklearn"), "selector.kmeans must be auto, torch or sklearn")


@dataclass(frozen=True, kw_only=True)
class GreenConfig:
    """G: L keyed green lists, as in KGW."""

    gamma: float = option(0.25, "fraction of the vocabulary in each green list")
    delta: float = option(1.0, "logit boost of a green token under a one-hot selector")
    centre: bool = option(
        False,
        "centre dW on its mean row under the key corpus's token frequencies: a re-tied input embedding moves less, "
        "and every output distribution stays as it is",
    )

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
                reject_unknown(section_cls, value, name)
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


def reject_unknown(section_cls: type, values: dict[str, Any], section: str) -> None:
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
    skip_tokens: int = option(
        0,
        "a text given without a prompt: its first k tokens are read as context only and not scored (k is fixed "
        "before the text is seen, so p-values stay exact)",
    )
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
        check(0 <= self.skip_tokens < self.max_tokens, "need 0 <= skip_tokens < max_tokens")
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
