"""OpenStamp as an evaluation plug-in: the shipped default (``openstamp``: P = I, a shrunk, centred selector,
the paper's 'w/o sem-align' ablation grown up) and the paper's method (``openstamp-projected``: P trained on
sentence embeddings).

Before 0.3.0 the default was named ``openstamp-nosem`` and the projected method ``openstamp``;
``current_name`` reads the old names in results recorded then, and the eval draws each key's secret
from its name then (``former_name``), so its keys are the same bits as before.
"""

from __future__ import annotations

import dataclasses
import hashlib
import weakref
from dataclasses import dataclass
from pathlib import Path

from openstamp.config import DetectConfig, load_profile, option
from openstamp.detect import Detector
from openstamp.embed.build import build_key
from openstamp.embed.states import States, collect_states
from openstamp.key.key import WatermarkKey
from openstamp.lab.detector import LabDetector
from openstamp.lab.methods.base import MethodScore, WatermarkMethod, register
from openstamp.model.patch import apply_watermark, check_key, revert_watermark


@dataclass(frozen=True, kw_only=True)
class OpenStampConfig:
    delta: float = option(0.386, "logit boost of a green token under a one-hot selector (the swept strength)")
    gamma: float = option(0.25, "fraction of the vocabulary in each of the L green lists")
    n_lists: int = option(254, "L, k-means clusters / green lists")
    projection: bool = option(False, "train P on sentence embeddings (openstamp-projected); False: P = I")
    profile: str = option("default", "embedding profile for states, P and S")
    shrinkage: float = option(4.0, "selector shrinkage f: ridge lambda = f * tr(Z^T Z) / d (selector.shrinkage)")
    centre: bool = option(True, "centre dW on its frequency-weighted mean row (green.centre)")
    min_tokens: int = option(16, "texts with fewer scored tokens get no score")


_STATES: dict[tuple, States] = {}  # the last sampled states: both OpenStamp variants share them


def _cached_states(model, tokenizer, documents, cfg) -> States:
    """Hidden states depend on the (unpatched) model, the documents and the state settings only."""
    key = (model.config.name_or_path, tuple(d.sha256 for d in documents), cfg.states)
    if key not in _STATES:
        _STATES.clear()
        _STATES[key] = collect_states(model, tokenizer, documents, cfg.states, progress=False)
    return _STATES[key]


@register
class OpenStamp(WatermarkMethod):
    name = "openstamp"
    former_name = "openstamp-nosem"  # its name before 0.3.0, which its eval keys' secrets are drawn from
    config_class = OpenStampConfig
    strength = "delta"
    sweep = (0.125, 0.25, 0.375, 0.5)
    key_fields = ("key",)
    added_settings = {"shrinkage": 0.0, "centre": False}  # keys built before these fields: unshrunk, uncentred
    score_is_llr = True
    key: WatermarkKey
    _last: tuple | None = None  # (weak ref to base, key, config, detector): the last detector made

    def build(self, model, tokenizer, documents, seed) -> None:
        cfg = load_profile(self.config.profile).with_overrides(
            {
                "green.delta": self.config.delta,
                "green.gamma": self.config.gamma,
                "selector.n_lists": self.config.n_lists,
                "selector.shrinkage": self.config.shrinkage,
                "projection.enabled": self.config.projection,
                "green.centre": self.config.centre,
                "states.seed": seed,
                "selector.seed": seed,
                "projection.seed": seed,
            }
        )
        secret = hashlib.sha256(f"openstamp/eval/{self.former_name}/{seed}".encode()).digest()
        states = _cached_states(model, tokenizer, documents, cfg)
        self.key = build_key(model, tokenizer, documents, cfg, secret=secret, progress=False, states=states)
        self.apply(model)  # records the original and watermarked heads' fingerprints in the key ...
        self.revert(model)  # ... and restores the model exactly

    def save(self, directory: Path) -> None:
        self.key.save(directory / "key", overwrite=True)

    def load(self, directory: Path) -> None:
        self.key = WatermarkKey.load(directory / "key")

    def rekey(self) -> None:
        self.key = dataclasses.replace(self.key, delta=self.config.delta, meta=dict(self.key.meta))

    def apply(self, model) -> None:
        apply_watermark(model, self.key)  # a tied model is re-tied: its input embeddings hold U~ too

    def revert(self, model) -> None:
        revert_watermark(model, self.key)

    def score(self, base, tokenizer, texts, batch_size=16) -> list[MethodScore]:
        detector = self._detector(base, tokenizer, batch_size)
        return [MethodScore(r.score, r.p_value, r.n_tokens, dict(r.detectors)) for r in detector.detect(texts)]

    def _detector(self, base, tokenizer, batch_size: int) -> Detector:
        """The detector made last, while ``base``, the key and the settings stay the same; else a new one.

        Keeping it lets the eval's caches serve the length curve's cut texts from the full texts' work: the
        detector's per-token statistics (``LabDetector.memo``) and, for a re-tied key, the hidden states of its
        watermarked copy of ``base`` (the release's decoder; the hidden-state cache keeps states per model
        object, and a new copy per call would run the decoder again for every cut).
        """
        config = DetectConfig(min_tokens=self.config.min_tokens, batch_size=batch_size)
        last = self._last
        if last and last[0]() is base and last[1] is self.key and last[2] == config:
            if check_key(base, self.key) == "original":  # base unchanged: the detector (and its copy) still holds
                return last[3]
        detector = LabDetector(base, tokenizer, self.key, config)
        self._last = (weakref.ref(base), self.key, config, detector)
        return detector


@dataclass(frozen=True, kw_only=True)
class OpenStampProjectedConfig(OpenStampConfig):
    delta: float = option(1.0, "logit boost of a green token under a one-hot selector (the swept strength)")
    projection: bool = option(True, "train P on sentence embeddings (the paper's method); False: P = I")
    shrinkage: float = option(0.0, "selector shrinkage f: ridge lambda = f * tr(Z^T Z) / d (selector.shrinkage)")
    centre: bool = option(False, "centre dW on its frequency-weighted mean row (green.centre)")


@register
class OpenStampProjected(OpenStamp):
    name = "openstamp-projected"
    former_name = "openstamp"
    config_class = OpenStampProjectedConfig
    sweep = (0.3, 0.6, 0.9, 1.2)


NAMES_BEFORE_0_3 = {"openstamp": "openstamp-projected", "openstamp-nosem": "openstamp"}
RENAMED_IN = (0, 3, 0)


def current_name(name: str, version: str | None) -> str:
    """A method's name now, given the name a result recorded and the openstamp version that recorded it
    (None or unparsable: before 0.3.0, when results recorded no version)."""
    try:
        recorded = tuple(int(part) for part in str(version).split("+")[0].split(".")[:3])
    except ValueError:
        recorded = (0,)
    return NAMES_BEFORE_0_3.get(name, name) if recorded < RENAMED_IN else name


def label(name: str, settings: dict | None = None) -> str:
    """How tables name an OpenStamp run: its method, and where its settings are not that method's defaults
    (selector shrinkage, centring), what they are, e.g. ``openstamp (shrinkage 0, uncentred)``."""
    cls = {c.name: c for c in (OpenStamp, OpenStampProjected)}.get(name)
    if cls is None or not settings:
        return name
    defaults = cls.config_class()
    parts = []
    if "shrinkage" in settings and float(settings["shrinkage"]) != defaults.shrinkage:
        parts.append(f"shrinkage {float(settings['shrinkage']):g}")
    if "centre" in settings and bool(settings["centre"]) != defaults.centre:
        parts.append("centred" if settings["centre"] else "uncentred")
    return f"{name} ({', '.join(parts)})" if parts else name
