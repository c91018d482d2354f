"""transformers' detector shape: ``WatermarkDetector(...)(input_ids, return_dict=True)``.

A thin adapter over ``Detector`` for code written against ``transformers.WatermarkDetector``:
the same call, and an output with transformers' fields as batched numpy arrays, plus ours.
All scoring is ``Detector.detect``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.generation import WatermarkDetectorOutput as _HFOutput

from openstamp.config import DetectConfig
from openstamp.detect.detector import Detector
from openstamp.detect.result import DetectionResult
from openstamp.key.key import WatermarkKey


@dataclass
class WatermarkDetectorOutput(_HFOutput):
    """transformers' ``WatermarkDetectorOutput`` (every field an array of shape (batch_size,)), plus:

    Args:
        llr (np.ndarray of shape (batch_size)): mean per-token LLR, OpenStamp's score.
        test (np.ndarray of shape (batch_size), object): the test behind each ``p_value``.
        status (np.ndarray of shape (batch_size), object): ``ok``, ``too_short`` or ``not_finite`` (then NaN scores).

    ``z_score`` is the centred LLR's z against its permutation distribution, ``p_value`` the
    permutation p-value (refined by the tail bound below its floor), ``confidence`` 1 - p_value,
    ``num_green_tokens`` the scored tokens in their selected green list.
    """

    llr: np.ndarray | None = None
    test: np.ndarray | None = None
    status: np.ndarray | None = None


class WatermarkDetector:
    """Detect OpenStamp's watermark with transformers' call shape.

    Example::

        detector = WatermarkDetector(model, tokenizer, WatermarkKey.load("runs/demo/key"))
        out = model.generate(**inputs, do_sample=True, max_new_tokens=64)
        result = detector(out[:, inputs["input_ids"].shape[1]:], return_dict=True)
        result.prediction, result.p_value, result.llr

    Args:
        model: the watermarked checkpoint or the original model.
        tokenizer: its tokenizer.
        key: the private key.
        config: detection settings (the decision rule behind ``prediction``).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        key: WatermarkKey,
        config: DetectConfig | None = None,
    ) -> None:
        self.detector = Detector(model, tokenizer, key, config)
        self.bos_token_id = tokenizer.bos_token_id

    @classmethod
    def from_pretrained(cls, model: str, key: str, config: DetectConfig | None = None, **load) -> WatermarkDetector:
        detector = Detector.from_pretrained(model, key, config, **load)
        adapter = cls.__new__(cls)
        adapter.detector, adapter.bos_token_id = detector, detector.tokenizer.bos_token_id
        return adapter

    def __call__(
        self,
        input_ids: torch.LongTensor,
        z_threshold: float | None = None,
        return_dict: bool = False,
        attention_mask: torch.Tensor | None = None,
    ) -> WatermarkDetectorOutput | np.ndarray:
        """Score a batch of completions.

        Args:
            input_ids: (batch_size, T) token ids; a leading BOS is dropped, as transformers does.
                Remove the prompt first: every token is scored.
            z_threshold: None: ``prediction`` is the detector's decision (p <= alpha by default);
                a number: ``prediction`` is ``z_score > z_threshold``, as in transformers.
            return_dict: return a ``WatermarkDetectorOutput``; else the predictions (batch_size,).
            attention_mask: (batch_size, T); tokens where it is 0 (padding) are left out.
        """
        results = self.detector.detect(_rows(input_ids, attention_mask, self.bos_token_id))
        out = outputs(results)
        if z_threshold is not None:
            out.prediction = np.nan_to_num(out.z_score, nan=-np.inf) > z_threshold
        return out if return_dict else out.prediction


def outputs(results: list[DetectionResult]) -> WatermarkDetectorOutput:
    """Detection results -> batched arrays (batch_size,), NaN where a text was too short."""

    def column(name: str) -> np.ndarray:
        return np.array([r.detectors.get(name, np.nan) if r.status == "ok" else np.nan for r in results], float)

    n = np.array([r.n_tokens for r in results], dtype=np.int64)
    green = np.rint(column("green_fraction") * n)
    p = np.array([np.nan if r.p_value is None else r.p_value for r in results], dtype=float)
    return WatermarkDetectorOutput(
        num_tokens_scored=n,
        num_green_tokens=green,
        green_fraction=column("green_fraction"),
        z_score=column("permutation_z"),
        p_value=p,
        prediction=np.array([bool(r.decision) for r in results]),
        confidence=1.0 - p,
        llr=np.array([np.nan if r.score is None else r.score for r in results], dtype=float),
        test=np.array([r.test for r in results], dtype=object),
        status=np.array([r.status for r in results], dtype=object),
    )


def _rows(input_ids: torch.Tensor, attention_mask: torch.Tensor | None, bos: int | None) -> list[list[int]]:
    """(batch_size, T) ids -> one list of ids per row, padding and a leading BOS removed."""
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (batch_size, T), got shape {tuple(input_ids.shape)}")
    keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    rows = [row[m].tolist() for row, m in zip(input_ids.cpu(), keep.cpu(), strict=True)]
    return [r[1:] if bos is not None and r and r[0] == bos else r for r in rows]
