"""The shape every watermark shares: build or load a key, apply it, score texts.

A method is a plug-in: a frozen config dataclass plus a ``WatermarkMethod`` subclass, registered
once with ``@register``. Its ``carrier`` says where the watermark lives: ``Carrier.WEIGHTS``
methods patch the model in place (``apply``/``revert``); ``Carrier.DECODER`` methods leave the
weights alone and hand generation a logits processor. ``key_fields`` names the attributes that
hold the key, so one key serves every strength (``with_strength``). Detection always uses the
owner's private *original* model (``base``), never the release.

Adding a method: a module with its config and class under ``openstamp/lab/methods/``, one import
line in ``openstamp/lab/methods/__init__.py`` (its registration), and its test. Everything that
lists methods (the eval's default, the CLI, the tests) reads ``REGISTRY``.
"""

from __future__ import annotations

import dataclasses
import json
import os
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, ClassVar

from transformers import LogitsProcessor, PreTrainedModel, PreTrainedTokenizerBase

from openstamp.corpus import Document

ALIASES = {"openstamp-nosem": "openstamp"}  # names that still resolve: the default method's name before 0.3.0


class Registry(dict):
    """Methods by name, in registration order (the order of every table); an alias resolves to its method."""

    def __missing__(self, name: str) -> type[WatermarkMethod]:
        if name in ALIASES:
            return self[ALIASES[name]]
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return super().__contains__(ALIASES.get(name, name) if isinstance(name, str) else name)


REGISTRY: Registry = Registry()


class Carrier(str, Enum):
    """Where a watermark lives: in the released weights, or in the decoder's logits processor."""

    WEIGHTS = "weights"
    DECODER = "decoder"


@dataclass
class MethodScore:
    """One text's detection under one method: higher ``score`` means more watermarked."""

    score: float | None
    p_value: float | None
    n_tokens: int
    extra: dict[str, float] = field(default_factory=dict)


class WatermarkMethod(ABC):
    """Base class of OpenStamp and every baseline.

    Subclasses set ``name``, ``config_class`` (a frozen dataclass whose fields carry help
    text), ``strength`` (the config field swept for the Pareto plot), ``sweep`` (its grid),
    ``key_fields`` (the attributes ``build``/``load`` set: the key) and, for a decode-time
    method, ``carrier = Carrier.DECODER``. ``key_per_strength`` marks a key trained at its
    strength (kgw-distilled): the eval then builds one key per strength instead of sharing one.
    ``head_only`` marks a weight-level watermark that changes lm_head alone (Unremovable's bias);
    OpenStamp is not one: on a tied model its ``U~`` is the input embedding too. ``added_settings``
    names config fields added after keys were first saved, with the value a key saved without them
    was built with (where that is not today's default), so the eval refuses such a key under other settings.
    ``scores_ignore_strength`` marks a detector that reads the key alone, never the strength (GaussMark's gradient
    projection, KGW's z-test): a text scores alike at every strength of one key, so a sweep scores its negatives once.
    A detector that reads its strength only at the end (KGW+LLR) says so by ``shares_statistics`` and splits its
    score into ``key_statistics`` (the key alone) and ``score_from_statistics`` (the strength).
    ``score_is_llr`` marks a detector whose score is a mean per-token LLR, the watermarked next-token distribution's
    to the original's as the detector computes them (OpenStamp, KGW+LLR): ``openstamp.lab.evaluation.budget.llr_budget``
    reads where its separation goes.
    """

    name: ClassVar[str]
    config_class: ClassVar[type]
    strength: ClassVar[str]
    sweep: ClassVar[tuple[float, ...]]
    key_fields: ClassVar[tuple[str, ...]]
    carrier: ClassVar[Carrier] = Carrier.WEIGHTS
    key_per_strength: ClassVar[bool] = False
    head_only: ClassVar[bool] = False  # a weight-level watermark that patches lm_head alone, never the decoder
    added_settings: ClassVar[dict[str, Any]] = {}  # field -> its value in keys saved before the field existed
    former_name: ClassVar[str | None] = None  # the method's name in results recorded before it was renamed
    scores_ignore_strength: ClassVar[bool] = False  # True: score() reads the key alone, never the strength
    score_is_llr: ClassVar[bool] = False  # True: score() is a mean per-token LLR, watermarked to original

    def __init__(self, config: Any | None = None) -> None:
        self.config = config if config is not None else self.config_class()

    @property
    def strength_value(self) -> float:
        return float(getattr(self.config, self.strength))

    @property
    def shares_statistics(self) -> bool:
        """Whether one memo of ``key_statistics`` per key serves every strength of it in a sweep: by default where the
        scores ignore the strength and the strengths share one key."""
        return self.scores_ignore_strength and not self.key_per_strength

    @property
    def keeps_hidden(self) -> bool:
        """True when the watermarked model's final hidden states are the original's (a decode-time method, or a
        weight-level one that is ``head_only``): the eval then re-uses the original model's states for it."""
        return self.carrier is Carrier.DECODER or self.head_only

    # -- key ---------------------------------------------------------------------------------

    @abstractmethod
    def build(
        self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, documents: list[Document], seed: int
    ) -> None:
        """Create the key (in memory) for ``model``; ``documents`` are the key-building corpus."""

    @abstractmethod
    def save(self, directory: Path) -> None:
        """Write the key into ``directory`` (which exists and is empty)."""

    @abstractmethod
    def load(self, directory: Path) -> None:
        """Read a key written by ``save``."""

    @property
    def generation_family(self) -> str:
        """Methods whose generations are equal share them in an evaluation (default: the method's own)."""
        return self.name

    def with_strength(self, value: float) -> WatermarkMethod:
        """The same key at another strength (the sweep re-uses a key across strengths)."""
        clone = type(self)(dataclasses.replace(self.config, **{self.strength: value}))
        for name in self.key_fields:
            setattr(clone, name, getattr(self, name))
        clone.rekey()
        return clone

    def rekey(self) -> None:  # noqa: B027 - most keys do not depend on the strength
        """Fit a key shared by ``with_strength`` to this instance's config (when the key holds the strength)."""

    # -- use ---------------------------------------------------------------------------------

    def apply(self, model: PreTrainedModel) -> None:  # noqa: B027 - decode-time methods keep the weights
        """Write the watermark into ``model`` in place (weight-level methods)."""

    def revert(self, model: PreTrainedModel) -> None:  # noqa: B027
        """Undo ``apply`` exactly."""

    def logits_processor(self) -> LogitsProcessor | None:
        """A processor for ``generate`` (decode-time methods); None for weight-level ones."""
        return None

    @abstractmethod
    def score(
        self,
        base: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        texts: list[str],
        batch_size: int = 16,
    ) -> list[MethodScore]:
        """Score texts (completions only, no prompt) with the original model ``base``."""

    def key_statistics(
        self, base: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, texts: list[str], batch_size: int = 16
    ) -> list[Any]:
        """What scoring each text takes from the key alone, whatever the strength (``shares_statistics``); by
        default its score as a dict."""
        return [asdict(s) for s in self.score(base, tokenizer, texts, batch_size)]

    def score_from_statistics(self, statistics: Any) -> dict:
        """A text's score, as a dict, from its ``key_statistics`` at this instance's strength."""
        return statistics

    def describe(self) -> dict[str, Any]:
        """Settings for reports: the method name and its config."""
        return {"method": self.name, **dataclasses.asdict(self.config)}


def score_dicts(
    method: WatermarkMethod, model, tokenizer, texts: list[str], batch: int = 16, memo: dict | None = None
) -> list[dict]:
    """The method's scores of ``texts``, as dicts. ``memo`` (text -> ``key_statistics``) holds what another strength
    of the same key computed, for a method that ``shares_statistics``: only the texts it lacks are computed, and kept
    there."""
    if memo is None:
        return [asdict(s) for s in method.score(model, tokenizer, texts, batch)]
    todo = list(dict.fromkeys(t for t in texts if t not in memo))
    if todo:
        for text, stats in zip(todo, method.key_statistics(model, tokenizer, todo, batch), strict=True):
            memo[text] = stats
    return [method.score_from_statistics(memo[t]) for t in texts]


def register(cls: type[WatermarkMethod]) -> type[WatermarkMethod]:
    """Class decorator: make a method available by its name."""
    REGISTRY[cls.name] = cls
    return cls


def create(name: str, **overrides: Any) -> WatermarkMethod:
    """Instantiate a registered method, overriding config fields."""
    if name not in REGISTRY:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(sorted(REGISTRY))}")
    cls = REGISTRY[name]
    return cls(cls.config_class(**overrides))


def write_json(path: str | os.PathLike, data: dict) -> None:
    Path(path).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
